"""JSON that always renders. Text from a client or from an old row may hold what UTF-8 cannot encode (a lone
UTF-16 surrogate from JSON's "\\ud800") and an error may echo a non-finite number; rendering such a value
must not turn a reply, or every later read of that job, into a 500. The fast path is plain `json.dumps`;
only a value that fails it is cleaned (surrogates → U+FFFD, NaN/±Infinity → their names) and rendered again.
"""

from __future__ import annotations

import json
import math

from fastapi.responses import JSONResponse


def clean(value):
    """`value` with every string encodable as UTF-8 and every float finite (keys included)."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def render(content) -> bytes:
    def dump(value) -> bytes:
        return json.dumps(
            value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
        ).encode("utf-8")

    try:
        return dump(content)
    except (UnicodeEncodeError, ValueError):
        return dump(clean(content))


class SafeJSONResponse(JSONResponse):
    def render(self, content) -> bytes:
        return render(content)


def shown(value, limit: int = 80) -> str:
    """A client's value as an error message quotes it: its repr (which escapes lone surrogates), cut short;
    true, false and null as the client wrote them (JSON), not Python's True, False and None."""
    text = json.dumps(value) if value is None or isinstance(value, bool) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
