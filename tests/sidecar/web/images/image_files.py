"""Real image files made with Pillow for the image tests (web/images/decoding.py), hostile ones
included, and the data URLs and request bodies that carry them."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from typing import Any

import numpy as np
from PIL import Image


def encoded(image: Image.Image, kind: str, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, kind, **options)
    return out.getvalue()


def png(width: int = 48, height: int = 32, color: Any = (200, 30, 30)) -> bytes:
    return encoded(Image.new("RGB", (width, height), color), "PNG")


def photo(width: int, height: int, color: tuple[int, int, int], seed: int = 0) -> bytes:
    """A PNG of noise around one colour: deterministic, and unlike any other colour's (what a
    model's reply can tell apart)."""
    rng = np.random.default_rng(seed)
    pixels = np.clip(rng.normal(color, 40, size=(height, width, 3)), 0, 255)
    return encoded(Image.fromarray(pixels.astype(np.uint8)), "PNG")


def jpeg(width: int = 48, height: int = 32, color: Any = (30, 200, 30)) -> bytes:
    return encoded(Image.new("RGB", (width, height), color), "JPEG", quality=95)


def webp(width: int = 48, height: int = 32, color: Any = (30, 30, 200)) -> bytes:
    return encoded(Image.new("RGB", (width, height), color), "WEBP", lossless=True)


def animated_gif(*colors: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    """One frame per colour (the first is what a model must see)."""
    frames = [Image.new("RGB", size, color) for color in colors]
    return encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)


def truncated_jpeg() -> bytes:
    """A real photo-like JPEG cut in the middle of its scan: libjpeg exits the process on it."""
    noise = Image.effect_noise((256, 256), 60).convert("RGB")
    whole = encoded(noise, "JPEG", quality=90)
    return whole[: len(whole) // 2]


def bomb_png(width: int = 30000, height: int = 30000) -> bytes:
    """A decompression bomb: a black PNG whose header says `width` x `height` (900 megapixels,
    2.7 GB as RGB), one bit a pixel, deflated to about a thousandth of that (about 110 KB).
    Written by hand, so that making it costs no such memory."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit grey
    deflate = zlib.compressobj(9)
    row = bytes(1 + (width + 7) // 8)  # filter byte 0, then black pixels
    idat = b"".join(deflate.compress(row) for _ in range(height)) + deflate.flush()
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode()


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def chat_body(*urls: str, text: str = "What is in this picture?", **extra: Any) -> dict[str, Any]:
    """A /v1/chat/completions body: one user message, its images before its text."""
    content = [*(image_part(url) for url in urls), {"type": "text", "text": text}]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 8, **extra}
