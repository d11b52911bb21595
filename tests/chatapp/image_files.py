"""Small image files for the app's and the page's tests, made with Pillow."""

from __future__ import annotations

import base64
import io
import random

from PIL import Image


def image_bytes(
    width: int, height: int, color: tuple[int, int, int] = (200, 40, 40), fmt: str = "PNG"
) -> bytes:
    """A plain image of one colour, as a `fmt` file (PNG, JPEG, WEBP, GIF)."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, format=fmt)
    return out.getvalue()


def gradient_png(width: int, height: int) -> bytes:
    """A smooth image (compresses well): a large picture in a small PNG file."""
    row = bytes(int(255 * x / max(1, width - 1)) for x in range(width))
    image = Image.frombytes("L", (width, height), row * height).convert("RGB")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def noise_png(width: int, height: int, seed: int = 1) -> bytes:
    """Random pixels: a PNG about as large as its pixels, which no encoder makes small."""
    pixels = random.Random(seed).randbytes(width * height * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", (width, height), pixels).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def from_data_url(url: str) -> tuple[str, bytes]:
    """(MIME type, file bytes) of a base64 data: URL."""
    head, _, encoded = url.partition(",")
    assert head.startswith("data:") and head.endswith(";base64"), head
    return head[5:-7], base64.b64decode(encoded)


def size_of(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as image:
        return image.size


def image_part(url: str) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": url}}
