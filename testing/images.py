"""Images the image tests submit: a small striped PNG whose fitted frame has a known colour, and the ways a
client sends one."""

from __future__ import annotations

import base64
import hashlib
import io

import numpy as np
from PIL import Image


def encoded(pixels: np.ndarray, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def stripes() -> np.ndarray:
    """160×40 (4:1): red | green | blue, green the middle half, so a 64×64 frame fitted from it is green."""
    pixels = np.zeros((40, 160, 3), np.uint8)
    pixels[:, :40], pixels[:, 40:120], pixels[:, 120:] = (255, 0, 0), (0, 255, 0), (0, 0, 255)
    return pixels


PNG = encoded(stripes())
DESCRIBED = {"width": 160, "height": 40, "sha256": hashlib.sha256(PNG).hexdigest()}  # what a job shows of PNG
