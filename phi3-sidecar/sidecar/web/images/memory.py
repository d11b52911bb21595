"""The web process's bound on the memory images take (IMAGE_MEMORY_MB), counted before any
image is decoded.

An image's file is small and its pixels are not: a 3 MB JPEG of 20 megapixels decodes to 60 MB,
and the PNG the worker gets (images/decoding.py) is about as large. Nothing bounded that across
requests: 12 requests with 4 photos each took the web process to 4.1 GB. So:

- What a request's images cost is read from their headers (width x height, before any pixel is
  decoded, `images.Header`): PEAK_BYTES_PER_PIXEL of the largest image, for the decoding (a
  request's images are decoded one at a time: the decoded frame, its RGB copy, the PNG being
  written and its copy), plus, for each image, HELD_BYTES_PER_PIXEL (the PNG it becomes) and
  its file's bytes. Measured peaks: 8.7 to 18.9 bytes a pixel (PNG, JPEG, WebP; grey, RGB,
  RGBA), checked by tests/sidecar/web/images/test_sidecar_image_memory.py.
- That is reserved from one process-wide budget before the first image is decoded. Once all
  are decoded, the reservation drops to their PNGs' real sizes, held until the request ends
  (its PNGs travel to the model worker in its request, which this process holds until then).
- A request the budget cannot hold now is refused at once: 503 `images_busy` with Retry-After
  (the chat app reads it as busy). Not kept waiting: a waiting request would hold its body, the
  images' base64, meanwhile. A request whose images need more than the whole budget is refused
  400 `image_too_large`, naming IMAGE_MEMORY_MB.
"""

from __future__ import annotations

from collections.abc import Sequence

PEAK_BYTES_PER_PIXEL = 20
HELD_BYTES_PER_PIXEL = 4  # an RGB PNG: at most 3 bytes a pixel, its row filters and zlib's


def cost(pixels: Sequence[int], file_bytes: Sequence[int]) -> int:
    """What a request's images are counted for until they are decoded."""
    if not pixels:
        return 0
    held = sum(HELD_BYTES_PER_PIXEL * p for p in pixels) + sum(file_bytes)
    return held + PEAK_BYTES_PER_PIXEL * max(pixels)


class Reservation:
    """One request's share of the budget; released once, whatever happens to the request."""

    def __init__(self, memory: ImageMemory, amount: int) -> None:
        self._memory = memory
        self.amount = amount

    def shrink_to(self, amount: int) -> None:
        """The images are decoded: only `amount` (their PNGs) is held from now on."""
        if amount < self.amount:
            self._memory.in_use -= self.amount - amount
            self.amount = amount

    def release(self) -> None:
        self._memory.in_use -= self.amount
        self.amount = 0


class ImageMemory:
    """The process-wide budget (IMAGE_MEMORY_MB), on the event loop only."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.in_use = 0
        self.refused = 0  # requests answered 503 images_busy

    def reserve(self, amount: int) -> Reservation | None:
        """The reservation, or None when the budget cannot hold `amount` now."""
        if self.in_use + amount > self.budget_bytes:
            self.refused += 1
            return None
        self.in_use += amount
        return Reservation(self, amount)
