"""The first-frame image as the API takes it: from a file part's bytes or a data URL (`from_data_url`),
checked (`take`, dit.image.check) and kept as sent beside its job (server.videos), the room it gets in a
request body (`room`).

The API never re-encodes an image: a 17 MB camera JPEG stays 17 MB on disk, not a 108 MB PNG, and costs
the API one check (dit.image.check: a JPEG decoded at an eighth of its size), not a full decode and a PNG
encode. Long steps hold the GIL in short pieces (base64, 1 MiB at a time), so /health stays fast while a
large image comes in.
"""

from __future__ import annotations

import binascii
import hashlib

from dit.image import MEDIA_TYPES, ImageError, ImageLimits, UnsupportedFormat, check

_B64_CHUNK = 2**20  # characters, a multiple of 4: each piece takes ~5 ms


def room(max_image_bytes: int) -> int:
    """What one image adds to a body at most: as a data URL 4/3 of its bytes, plus 4 KiB of form headers."""
    return -(-4 * max_image_bytes // 3) + 4096


def from_data_url(text: str) -> bytes:
    """`data:image/png;base64,...` (or image/jpeg, image/webp) → the bytes it holds."""
    if not isinstance(text, str) or text[:5].lower() != "data:" or "," not in text:
        raise ImageError("the image must be a data URL: data:image/png;base64,... (or jpeg, webp)")
    header, payload = text[5:].split(",", 1)
    media_type, *params = header.lower().split(";")
    if params[-1:] != ["base64"]:
        raise ImageError("the image's data URL must be base64-encoded: data:image/png;base64,...")
    if media_type not in MEDIA_TYPES:
        raise UnsupportedFormat(f"the image's data URL is {media_type or 'untyped'}; send PNG, JPEG or WebP")
    try:
        return _b64decode(payload.encode("ascii"))
    except (UnicodeEncodeError, binascii.Error):  # non-ASCII (ÿ), or not base64
        raise ImageError("the image's data URL holds invalid base64") from None


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
