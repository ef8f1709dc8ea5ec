"""dit/image.py: the first-frame image of an image-to-video model, checked or decoded from a client's bytes
(formats, orientation, modes, limits, decompression bombs, broken files) and fitted to a video's size."""

from __future__ import annotations

import io
import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image

from dit.image import (
    ImageError,
    ImageLimits,
    ImageTooLarge,
    UnsupportedFormat,
    check,
    decode,
    fit,
    read,
)

LIMITS = ImageLimits()


def _bytes(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims width×height pixels and holds a few bytes: a decompression bomb's header."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def _gradient(height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[:height, :width]
    return np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], -1).astype(
        np.uint8
    )


@pytest.mark.parametrize(
    "fmt,options", [("PNG", {}), ("JPEG", {"quality": 95}), ("WEBP", {"lossless": True})]
)
def test_each_format_decodes_to_rgb_uint8(fmt, options):
    pixels = _gradient(24, 40)
    out = decode(_bytes(Image.fromarray(pixels), fmt, **options), LIMITS)
    assert out.dtype == np.uint8 and out.shape == (24, 40, 3) and out.flags.writeable
    assert np.abs(out.astype(int) - pixels).mean() < 3  # JPEG is lossy; PNG and lossless WebP exact


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF"])
def test_other_formats_are_refused(fmt):
    with pytest.raises(UnsupportedFormat, match=f"the image is {fmt}; send PNG, JPEG or WebP"):
        decode(_bytes(Image.new("RGB", (8, 8)), fmt), LIMITS)


def test_exif_orientation_is_applied():
    pixels = np.zeros((20, 40, 3), np.uint8)
    pixels[:, :20] = (255, 0, 0)  # left half red, as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    out = decode(_bytes(Image.fromarray(pixels), "JPEG", exif=exif, quality=95), LIMITS)
    assert out.shape == (40, 20, 3)  # upright: portrait
    assert out[:20, :, 0].mean() > 200 and out[20:, :, 0].mean() < 50  # the stored left half is now on top


@pytest.mark.parametrize(
    "image,expected",
    [
        (Image.new("RGBA", (4, 4), (255, 0, 0, 255)), (255, 0, 0)),
        (Image.new("RGBA", (4, 4), (0, 0, 0, 0)), (255, 255, 255)),  # transparent: flattened onto white
        (Image.new("LA", (4, 4), (0, 0)), (255, 255, 255)),
        (Image.new("L", (4, 4), 128), (128, 128, 128)),
        (Image.new("RGB", (4, 4), (0, 0, 255)).convert("P"), (0, 0, 255)),
    ],
)
def test_modes_become_rgb(image, expected):
    out = decode(_bytes(image, "PNG"), LIMITS)
    assert out.shape == (4, 4, 3) and tuple(out[0, 0]) == expected


def test_a_16_bit_grey_png_keeps_its_greys():
    """Pillow's convert("RGB") clips 16-bit grey at 255: the first frame came out nearly all white."""
    grey = np.full((4, 8), 32768, np.uint16)
    grey[:, :4] = 8000
    out = decode(_bytes(Image.fromarray(grey), "PNG"), LIMITS)
    assert tuple(out[0, 0]) == (31, 31, 31) and tuple(out[0, -1]) == (128, 128, 128)


def test_cmyk_jpeg_becomes_rgb():
    out = decode(_bytes(Image.new("CMYK", (8, 8), (0, 255, 255, 0)), "JPEG"), LIMITS)
    assert out.shape == (8, 8, 3) and out[0, 0, 0] > 200 and out[0, 0, 1:].max() < 50  # red


def test_byte_limit_is_checked_before_parsing():
    data = _bytes(Image.new("RGB", (8, 8)), "PNG")
    with pytest.raises(ImageTooLarge, match=f"the image is {len(data)} bytes; at most 10 are accepted"):
        decode(data, ImageLimits(max_bytes=10))
    with pytest.raises(ImageTooLarge):  # not even an image: refused by its size alone
        decode(b"x" * 11, ImageLimits(max_bytes=10))


def test_pixel_limit_is_checked_from_the_header(monkeypatch):
    small = _bytes(Image.new("RGB", (10, 10)), "PNG")
    monkeypatch.setattr(Image.Image, "load", lambda self: pytest.fail("pixels decoded"))
    with pytest.raises(ImageTooLarge, match=r"10000x5000 \(50000000 pixels\); at most 36000000"):
        decode(_png_header(10_000, 5_000), LIMITS)
    with pytest.raises(ImageTooLarge, match="at most 99 pixels"):
        decode(small, ImageLimits(max_pixels=99))


def test_a_decompression_bomb_is_refused_without_decoding(monkeypatch):
    """A 300-byte PNG claiming 100000×100000 pixels (30 GB as RGB): Pillow's own bomb check refuses it even
    under limits that would let it through, and the refusal is ours."""
    monkeypatch.setattr(Image.Image, "load", lambda self: pytest.fail("pixels decoded"))
    bomb = _png_header(100_000, 100_000)
    assert len(bomb) < 300
    with pytest.raises(ImageTooLarge, match="^the image is 10000000000 pixels, past the 178956970 that Pill"):
        decode(bomb, ImageLimits(max_pixels=10**11))
    # under the server's limit: its words and its limit (it said Pillow's, "exceeds limit of 178956970")
    with pytest.raises(ImageTooLarge, match="^the image is 10000000000 pixels; at most 36000000 pixels are"):
        decode(bomb, LIMITS)
    with warnings.catch_warnings():  # Pillow's warning (past 89 M pixels), where warnings are errors
        warnings.simplefilter("error")
        with pytest.raises(ImageTooLarge, match="decompression bombs"):
            decode(_png_header(10_000, 10_000), ImageLimits(max_pixels=10**9))


@pytest.mark.parametrize("data", [b"", b"not an image", b"\x89PNG\r\n\x1a\n" + b"\0" * 40])
def test_not_an_image(data):
    with pytest.raises(ImageError, match="not an image"):
        decode(data, LIMITS)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])  # a WebP is read whole when opened: "not an image"
def test_a_truncated_image_fails_when_checked_or_decoded(fmt):
    data = _bytes(Image.fromarray(_gradient(256, 256)), fmt)  # cut in its pixels, past the header
    for step in (check, decode):
        with pytest.raises(ImageError, match="cannot be decoded"):
            step(data[: len(data) // 2], LIMITS)


def test_check_tells_what_decode_would_make():
    exif = Image.Exif()
    exif[0x0112] = 6  # a quarter turn: 40×20 as stored, 20×40 upright
    for fmt, media_type, options in [
        ("PNG", "image/png", {}),
        ("WEBP", "image/webp", {}),
        ("JPEG", "image/jpeg", {"exif": exif}),
        ("MPO", "image/jpeg", {}),
    ]:
        data = _bytes(Image.fromarray(_gradient(20, 40)), fmt, **options)
        height, width, _ = decode(data, LIMITS).shape
        assert check(data, LIMITS) == (media_type, width, height), fmt
    with pytest.raises(ImageTooLarge, match="at most 99 pixels"):
        check(_bytes(Image.new("RGB", (10, 10)), "PNG"), ImageLimits(max_pixels=99))
    with pytest.raises(UnsupportedFormat, match="GIF"):
        check(_bytes(Image.new("RGB", (8, 8)), "GIF"), LIMITS)


def test_read(tmp_path):
    pixels = _gradient(30, 50)
    path = tmp_path / "a.png"
    path.write_bytes(_bytes(Image.fromarray(pixels), "PNG"))
    assert np.array_equal(read(path), pixels)
    with pytest.raises(ImageError, match="cannot read .*missing.png: No such file"):
        read(tmp_path / "missing.png")
    path.write_bytes(b"junk")
    with pytest.raises(ImageError, match="cannot read .*a.png: the data is not an image"):
        read(path)


def test_fit_covers_then_centre_crops():
    wide = np.zeros((40, 160, 3), np.uint8)  # 4:1: red | green (the middle half) | blue
    wide[:, :40], wide[:, 40:120], wide[:, 120:] = (255, 0, 0), (0, 255, 0), (0, 0, 255)
    out = fit(wide, 64, 64)  # scaled to 64×256, the middle 64 columns kept: all green
    assert out.shape == (64, 64, 3) and out.dtype == np.uint8
    assert out[:, :, 1].min() > 240 and out[:, :, [0, 2]].max() < 15
    tall = np.zeros((300, 100, 3), np.uint8)
    tall[:100], tall[100:200], tall[200:] = (255, 0, 0), (0, 255, 0), (0, 0, 255)
    out = fit(Image.fromarray(tall), 32, 96)  # a PIL image; scaled to 288×96, the middle 32 rows: green
    assert out.shape == (32, 96, 3) and out[:, :, 1].min() > 240 and out[:, :, [0, 2]].max() < 15


def test_fit_keeps_an_image_of_the_size_and_upscales_a_small_one():
    pixels = _gradient(48, 80)
    assert np.array_equal(fit(pixels, 48, 80), pixels)
    small = fit(pixels[::4, ::4], 48, 80)  # every fourth pixel (12×20), scaled back up four times
    assert small.shape == (48, 80, 3) and np.abs(small.astype(int) - pixels).mean() < 12
    assert fit(Image.new("RGBA", (8, 8), (0, 0, 0, 0)), 4, 4)[0, 0].tolist() == [255, 255, 255]


@pytest.mark.parametrize(
    "image,says",
    [
        (np.zeros((8, 8, 3), np.float32), "uint8 numpy array"),
        (np.zeros((8, 8), np.uint8), r"got shape \(8, 8\)"),
        (np.zeros((8, 8, 4), np.uint8), r"got shape \(8, 8, 4\)"),
        (np.zeros((0, 8, 3), np.uint8), r"got shape \(0, 8, 3\)"),
        ([[0, 0, 0]], "got list"),
        ("a.png", "got str"),
    ],
)
def test_fit_refuses_what_is_not_an_rgb_image(image, says):
    with pytest.raises(ValueError, match=says):
        fit(image, 16, 16)


@pytest.mark.parametrize("height,width", [(0, 16), (16, -1), (16.0, 16), (True, 16)])
def test_fit_refuses_bad_sizes(height, width):
    with pytest.raises(ValueError, match="must be a positive integer"):
        fit(np.zeros((8, 8, 3), np.uint8), height, width)
