"""The first-frame image as the API takes it: from a file part's bytes or a data URL (`from_data_url`),
checked (`take`, dit.image.check) and kept as sent beside its job (server.videos), the room it gets in a
request body (`room`).

The API never re-encodes an image: a 17 MB camera JPEG stays 17 MB on disk, not a 108 MB PNG, and costs
the API one check (dit.image.check: a JPEG decoded at an eighth of its size), not a full decode and a PNG
encode. Nothing holds the GIL long while a large image comes in, so /health stays fast: base64 is decoded
1 MiB at a time, and a large JSON body is parsed with its data URL cut out (`parse_json`).
"""

from __future__ import annotations

import binascii
import hashlib
import json
import re
import uuid

from dit.image import MEDIA_TYPES, ImageError, ImageLimits, UnsupportedFormat, check

_B64_CHUNK = 2**20  # characters, a multiple of 4: each piece takes ~5 ms
_LARGE = 2**20  # bytes of JSON worth cutting a data URL out of (json.loads walks 27 MB in ~100 ms)
_DATA_URL = re.compile(rb':\s*"data:')  # a string value starting data: (in a string the quote is escaped)


def room(max_image_bytes: int) -> int:
    """What one image adds to a body at most: as a data URL 4/3 of its bytes, plus 4 KiB of form headers."""
    return -(-4 * max_image_bytes // 3) + 4096


def from_data_url(text: str) -> bytes:
    """`data:image/png;base64,...` (or image/jpeg, image/webp) → the bytes it holds."""
    if not isinstance(text, str) or text[:5].lower() != "data:" or "," not in text:
        raise ImageError("the image must be a data URL: data:image/png;base64,... (or jpeg, webp)")
    header, payload = text[5:].split(",", 1)
    media_type, *params = header.lower().split(";")
    media_type = {"image/jpg": "image/jpeg"}.get(media_type, media_type)  # a common alias: it was a 415
    if params[-1:] != ["base64"]:
        raise ImageError("the image's data URL must be base64-encoded: data:image/png;base64,...")
    if media_type not in MEDIA_TYPES:
        raise UnsupportedFormat(f"the image's data URL is {media_type or 'untyped'}; send PNG, JPEG or WebP")
    try:
        return _b64decode(payload.encode("ascii"))
    except (UnicodeEncodeError, binascii.Error):  # non-ASCII (ÿ), or not base64
        raise ImageError(  # wrapped lines and missing '=' are the usual causes: `base64 FILE` wraps at 76
            "the image's data URL holds invalid base64: it must be one line of standard base64, '=' padded "
            "(base64 -w0 FILE)"
        ) from None


class DuplicateKey(ValueError):
    """A JSON object names a key twice: which value was meant is not for the server to guess. `path`: where
    (the body's field, then any keys and list indexes inside it, the key given twice last)."""

    def __init__(self, path: tuple, times: int):
        super().__init__(path)
        self.path, self.times = path, times


class _Twice(dict):
    """An object whose `key` came `times` times, marked where it lies (`_first_twice` finds its path)."""

    key: str
    times: int


def _once(pairs: list[tuple[str, object]]) -> dict:
    out = dict(pairs)
    if len(out) < len(pairs):
        keys = [key for key, _ in pairs]
        out = _Twice(out)
        out.key = next(key for key in keys if keys.count(key) > 1)
        out.times = keys.count(out.key)
    return out


def _first_twice(value, path: tuple = ()) -> DuplicateKey | None:
    """The first object of the parsed body that named a key twice, outermost first."""
    if isinstance(value, _Twice):
        return DuplicateKey((*path, value.key), value.times)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return next((found for key, v in items if (found := _first_twice(v, (*path, key)))), None)


def _loads(text: bytes):
    parsed = json.loads(text, object_pairs_hook=_once)
    if (twice := _first_twice(parsed)) is not None:
        raise twice
    return parsed


def parse_json(body: bytes):
    """`json.loads(body)`, a key given twice in an object refused (`DuplicateKey`); a large body's data URL
    value is cut out first (a data URL needs no JSON escape) and put back after, so the parser holds the GIL
    for the few fields around it, not for the image."""
    match = _DATA_URL.search(body, 0, _LARGE) if len(body) > _LARGE else None
    end = body.find(b'"', match.end()) if match else -1
    url = body[match.end() - 5 : end] if end != -1 else b""
    if not url or b"\\" in url or not url.isascii():
        return _loads(body)
    token = f"data:,{uuid.uuid4().hex}"
    fields = _loads(body[: match.end() - 5] + token.encode() + body[end:])
    if isinstance(fields, dict):  # the image is a top-level field; a token elsewhere fails as any text would
        url_text = url.decode("ascii")
        fields = {key: url_text if value == token else value for key, value in fields.items()}
    return fields


def _b64decode(payload: bytes) -> bytes:
    """Strict base64 (the alphabet only, padding only at the end) in pieces: the GIL is free between them."""
    if payload.find(b"=", 0, len(payload) - 2) != -1:  # pieces alone would take one image's end, then more
        raise binascii.Error("padding before the end")
    view = memoryview(payload)
    return b"".join(
        binascii.a2b_base64(view[at : at + _B64_CHUNK], strict_mode=True)
        for at in range(0, len(payload), _B64_CHUNK)
    )


def take(image: bytes | str, limits: ImageLimits) -> tuple[bytes, str, dict]:
    """A client's image (a file part's bytes or a data URL) checked → (its bytes, its media type, what the
    job's request shows of it: upright width and height, the sha256 of the bytes)."""
    data = image if isinstance(image, bytes) else from_data_url(image)
    media_type, width, height = check(data, limits)
    return data, media_type, {"width": width, "height": height, "sha256": hashlib.sha256(data).hexdigest()}
