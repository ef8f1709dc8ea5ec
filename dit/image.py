"""The first-frame image of an image-to-video model: a client's bytes checked (`check`: the API keeps them as
sent) or decoded (`decode`, `read`), and fitted to a request's size (`fit`).

`check` and `decode` take untrusted input: the byte count is checked before Pillow sees the data and the
pixel count from the header before any pixel is decoded, so a small file claiming a huge canvas (a
decompression bomb) costs no memory. Every failure is an `ImageError` (a ValueError) with a one-line message.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import ExifTags, Image, ImageOps

_SIXTEEN_BIT_GREY = ("I;16", "I;16L", "I;16B", "I;16N", "I")  # how Pillow opens a 16-bit grey PNG
# Pillow's format name → the media type a client sends. MPO is Pillow's name for a JPEG carrying extra
# pictures (many phone and camera photos): its first picture is a plain JPEG.
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "MPO": "image/jpeg", "WEBP": "image/webp"}
MEDIA_TYPES = tuple(dict.fromkeys(FORMATS.values()))


class ImageError(ValueError):
    """Not a usable image (unreadable, or a broken file)."""


class UnsupportedFormat(ImageError):
    """An image, or a data URL's media type, other than PNG, JPEG or WebP."""


class ImageTooLarge(ImageError):
    """More bytes or pixels than the limits allow."""


@dataclass(frozen=True)
class ImageLimits:
    # A phone photo is 2–8 MB as JPEG; 20 MiB leaves room for a large PNG while bounding what one request
    # makes the API hold and hash.
    max_bytes: int = 20 * 2**20
    # 36 megapixels (6000×6000: a 24 MP camera or a 12 MP phone photo fits with room): a video frame is about
    # one megapixel, so more only costs memory, and a decoded image stays at about 110 MB of RGB (145 MB as
    # CMYK or RGBA on the way), the most one request can make the API spend. Pillow's own bomb limit (89.5 M,
    # an error past twice that) is well above.
    max_pixels: int = 36_000_000


def decode(data: bytes, limits: ImageLimits) -> np.ndarray:
    """PNG, JPEG or WebP bytes → uint8 RGB [H, W, 3], upright (EXIF orientation applied)."""
    return _rgb(_checked_header(data, limits))


def check(data: bytes, limits: ImageLimits) -> tuple[str, int, int]:
    """What `decode` checks, keeping no pixels → (media type, upright width, upright height). Every byte is
    decoded, so a truncated or corrupt file is refused here; a JPEG at an eighth of its size (libjpeg's DCT
    scaling still reads every coefficient): a 36-megapixel photo costs a fraction of a second and 2 MB."""
    image = _checked_header(data, limits)
    width, height = image.size
    image.draft("RGB", (-(-width // 8), -(-height // 8)))  # JPEG only: the others decode at full size
    try:
        image.load()
    except Exception as e:
        raise ImageError(f"the image cannot be decoded: {e}") from None
    if image.getexif().get(ExifTags.Base.Orientation) in (5, 6, 7, 8):  # a quarter turn, as `decode` does
        width, height = height, width
    return FORMATS[image.format], width, height


def _checked_header(data: bytes, limits: ImageLimits) -> Image.Image:
    if len(data) > limits.max_bytes:
        raise ImageTooLarge(f"the image is {len(data)} bytes; at most {limits.max_bytes} are accepted")
    image = _open(data, limits.max_pixels)
    if image.format not in FORMATS:
        raise UnsupportedFormat(f"the image is {image.format}; send PNG, JPEG or WebP")
    width, height = image.size
    if width * height > limits.max_pixels:
        raise _over(f"{width}x{height} ({width * height} pixels)", limits.max_pixels)
    return image


def _over(size: str, max_pixels: int) -> ImageTooLarge:
    return ImageTooLarge(f"the image is {size}; at most {max_pixels} pixels are accepted")


def read(path: str | Path) -> np.ndarray:
    """An image file → uint8 RGB [H, W, 3] as `decode` makes it (no limits: it passed `check` to get here)."""
    try:
        return _rgb(_open(Path(path).read_bytes()))
    except OSError as e:
        raise ImageError(f"cannot read {path}: {e.strerror}") from None
    except ImageError as e:
        raise ImageError(f"cannot read {path}: {e}") from None


def fit(image, height: int, width: int) -> np.ndarray:
    """A PIL image or uint8 RGB array → uint8 [height, width, 3]: scaled to cover height×width with its
    aspect ratio kept, then centre-cropped. An image already of that size comes back unchanged.

    Lanczos: the sharpest of Pillow's filters when shrinking (the usual case, photos are larger than video
    frames; Pillow widens the kernel with the scale, so nothing aliases); bicubic would soften the frame the
    video starts from. Scaling only the cropped box of the source gives the exact size with no rounding."""
    for name, value in (("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    check_image(image)
    source = Image.fromarray(image if isinstance(image, np.ndarray) else _rgb(image))
    w, h = source.size
    scale = max(width / w, height / h)  # cover: the crop box is the target's shape in source pixels
    box_w, box_h = width / scale, height / scale
    box = ((w - box_w) / 2, (h - box_h) / 2, (w + box_w) / 2, (h + box_h) / 2)
    return np.array(source.resize((width, height), Image.Resampling.LANCZOS, box=box))


def check_image(image) -> None:
    """A request's first frame: a PIL image, or a uint8 RGB array [H, W, 3] (ValueError naming `image`
    otherwise; a PIL image's pixels are decoded, and checked, only by `fit`)."""
    if isinstance(image, Image.Image):
        return
    if not isinstance(image, np.ndarray):
        kind = type(image).__name__
        raise ValueError(f"image must be a PIL image or a uint8 numpy array [H, W, 3], got {kind}")
    if image.dtype != np.uint8:
        raise ValueError(f"image must be a uint8 numpy array [H, W, 3], got {image.dtype}")
    if image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
        raise ValueError(f"image must be a uint8 numpy array [H, W, 3] (RGB), got shape {image.shape}")


def image_size(image) -> tuple[int, int]:
    """A checked first frame's (height, width): a PIL image's or a uint8 array's."""
    return (image.height, image.width) if isinstance(image, Image.Image) else image.shape[:2]


def _open(data: bytes, max_pixels: int | None = None) -> Image.Image:
    """The image's header only: no pixel is decoded yet. Past Pillow's own bomb limit it refuses the image
    before any size is known but in its words, which named its limit (179 M pixels) for the server's."""
    try:
        return Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:  # a warning under -W error
        found = re.search(r"\((\d+) pixels\)", str(e))
        pixels = int(found[1]) if found else None
        if max_pixels is not None and pixels is not None and pixels > max_pixels:
            raise _over(f"{pixels} pixels", max_pixels) from None
        bomb = Image.MAX_IMAGE_PIXELS * (2 if isinstance(e, Image.DecompressionBombError) else 1)
        raise ImageTooLarge(
            f"the image is {pixels or 'too many'} pixels, past the {bomb} that Pillow decodes (its guard "
            "against decompression bombs)"
        ) from None
    except Exception:  # Pillow's plugins raise many kinds on what is not an image
        raise ImageError("the data is not an image (PNG, JPEG or WebP expected)") from None


def _rgb(image: Image.Image) -> np.ndarray:
    """Decode the pixels: upright, transparency flattened onto white (the colour under a transparent pixel is
    arbitrary, often black), any mode (P, L, CMYK, ...) as RGB."""
    try:
        image = ImageOps.exif_transpose(image)
        if image.mode in _SIXTEEN_BIT_GREY:  # convert("RGB") clips at 255: a 16-bit grey PNG came out white
            image = Image.fromarray((np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8))
        if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
            rgba = image.convert("RGBA")
            image = Image.new("RGBA", rgba.size, "white")
            image.alpha_composite(rgba)
        return np.array(image.convert("RGB"))
    except Exception as e:  # truncated or corrupt data shows only now, when the pixels are decoded
        raise ImageError(f"the image cannot be decoded: {e}") from None
