"""Images on a vision model: which model types read them, and what one costs in prompt tokens.

`image_tokens` is the one home of Phi-3-vision's token count (docs/models.md quotes it;
tests/models checks it against onnxruntime-genai's own processor, so a version of
onnxruntime-genai or onnxruntime-extensions that counts otherwise fails a test).
"""

from __future__ import annotations

import math

CROP_SIDE = 336  # pixels per side of a crop (CLIP ViT-L/14 at 336)
MAX_CROPS = 16  # tiles of the HD transform; onnxruntime-extensions ignores `num_crops`
TOKENS_PER_CROP = 144  # the projector's tokens per crop (num_img_tokens)
TOKENS_PER_ROW = 12  # separator tokens after each row of tiles and after the global view
# What onnxruntime-extensions' processor refuses (a RuntimeError, not a crash): a PNG side
# over MAX_SIDE pixels, and an image so narrow that its short side scales to no pixel.
MAX_SIDE = 16384


def hd_size(width: int, height: int, max_crops: int = MAX_CROPS) -> tuple[int, int]:
    """The (height, width) Phi-3-vision's HD transform gives an image: scaled so that its
    longer side is a whole number of crops and at most `max_crops` crops cover it, keeping
    the aspect ratio, then padded to whole crops. onnxruntime-extensions' image_sizes."""
    if width < 1 or height < 1:
        raise ValueError(f"an image has at least one pixel a side, not {width}x{height}")
    long, short = max(width, height), min(width, height)
    ratio = long / short
    scale = 1
    while (scale + 1) * math.ceil((scale + 1) / ratio) <= max_crops:
        scale += 1
    long_px = scale * CROP_SIDE
    scaled = int(long_px / ratio)
    if scaled < 1:
        raise ValueError(f"a {width}x{height} image is narrower than one pixel when scaled")
    short_px = math.ceil(scaled / CROP_SIDE) * CROP_SIDE
    return (short_px, long_px) if width >= height else (long_px, short_px)


def image_tokens(width: int, height: int) -> int:
    """Prompt tokens Phi-3-vision spends on an image of width x height pixels:
    (h/336 * w/336 + 1) * 144 + 1 + (h/336 + 1) * 12 after the HD transform (`hd_size`): the
    tiles and the global view at 144 tokens each, plus separators. 1,921 for 640x480, 2,509
    for a square (1x1 up), 2,653 at most (a tall strip)."""
    h, w = hd_size(width, height)
    rows, cols = h // CROP_SIDE, w // CROP_SIDE
    return (rows * cols + 1) * TOKENS_PER_CROP + 1 + (rows + 1) * TOKENS_PER_ROW
