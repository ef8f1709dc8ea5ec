"""Links that open one job's video or preview without the `Authorization` header, for an hour: a browser's
<video> and <a download> cannot send a header, so with a key set the web page fetched every finished MP4
whole into memory to show it (and again on each page flip). A link is the file's path with `expires` (unix
seconds) and `signature`, an HMAC of both under a key derived from the API key: it opens that path alone, for
GET and HEAD alone, until it expires (`expiry`), on every server holding the same key, and on none once the
key changes."""

from __future__ import annotations

import hashlib
import hmac
import re
from urllib.parse import parse_qs

LINK_SECONDS = 3600
# a link's end is rounded up to these seconds: asked again within them, it is the same URL, which a browser's
# cache serves (a new URL each second fetched the MP4 again on every page flip)
ROUND_S = 600
_OPENS = re.compile(r"/jobs/[^/]+/(video|preview)")  # the files a link may open
_SECONDS = re.compile(r"[0-9]{1,12}")  # str.isdigit takes "²", which int() refuses
_HEX = re.compile(r"[0-9a-f]{64}")  # what `_signature` gives: parse_qs decodes %FF to U+FFFD


def _signature(key: bytes, path: str, expires: int) -> str:
    signing = hmac.new(key, b"ithaca signed link", hashlib.sha256).digest()  # the API key is never the MAC's
    return hmac.new(signing, f"{path}\n{expires}".encode(), hashlib.sha256).hexdigest()


def expiry(now: float) -> int:
    """When a link made at `now` stops opening: an hour on, or up to ROUND_S more."""
    return -(-int(now + LINK_SECONDS) // ROUND_S) * ROUND_S


def signed(key: str, path: str, expires: int) -> str:
    """`path` with the query that opens it until `expires`."""
    assert _OPENS.fullmatch(path), path
    return f"{path}?expires={expires}&signature={_signature(key.encode(), path, expires)}"


# how the routes a link opens say so in the OpenAPI document
QUERY = [
    {"name": "expires", "in": "query", "required": False, "schema": {"type": "integer"},
     "description": "a signed link's end, unix seconds (GET /jobs/{job_id}/links)"},
    {"name": "signature", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "a signed link's signature: with `expires`, opens this file without the key"},
]  # fmt: skip


def opens(key: bytes, method: str, path: str, query: bytes, now: float) -> bool:
    """Whether the request's query is a link, unexpired, for this very path."""
    if method not in ("GET", "HEAD") or not _OPENS.fullmatch(path):
        return False
    fields = parse_qs(query.decode("latin-1"))
    expires, signature = fields.get("expires", []), fields.get("signature", [])
    if len(expires) != 1 or len(signature) != 1 or not _SECONDS.fullmatch(expires[0]):
        return False
    until, given = int(expires[0]), signature[0]
    return (
        until >= now
        and bool(_HEX.fullmatch(given))
        and hmac.compare_digest(given, _signature(key, path, until))
    )
