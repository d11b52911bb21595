"""Images on a vision model: which model types read them, how a prompt marks them, and what
one costs in prompt tokens. Pure Python; onnxruntime-genai's processor is called in
generator/path.py.

`image_tokens` is the one home of Phi-3-vision's token count (docs/models.md quotes it;
tests/models checks it against onnxruntime-genai's own processor, so a version of
onnxruntime-genai or onnxruntime-extensions that counts otherwise fails a test).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sidecar.ipc import Generate
from sidecar.model.prompt.builder import ImagePlacement, Prompt, PromptBuilder

log = logging.getLogger("sidecar.model.vision")

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


class ImageRefused(Exception):
    """The request's images cannot be read by this model (ipc refusal invalid_image); str() is
    one sentence for the client, naming no image content."""


@dataclass(frozen=True)
class ImageTags:
    """How a model type's prompts mark an image."""

    tag: str  # image k's tag as the processor reads it ({k}: 1, 2, ...)
    after: str  # the text the model's own prompts put after each tag

    def processor_prompt(self, count: int) -> str:
        """A prompt of tags only: what the processor is given, never user text."""
        return "".join(self.tag.format(k=k) for k in range(1, count + 1))


# The model types whose images the worker places. phi3v's processor expands `<|image_k|>` to
# image k's token count of the id -k, which the embedding graph replaces by the image's
# features; the worker writes those runs itself, so no text ever becomes a tag.
IMAGE_TAGS: dict[str, ImageTags] = {"phi3v": ImageTags("<|image_{k}|>", "\n")}
# onnxruntime-genai 0.18 reads images for these types too, but their prompts mark images
# otherwise (Phi-4-multimodal's fixed ids, Qwen's <|image_pad|>, Gemma's <start_of_image>, ...):
# the worker does not place them yet, so such a model serves text and says it reads no images.
OTHER_IMAGE_TYPES = frozenset(
    {"phi4mm", "qwen2_5_vl", "qwen3_vl", "gemma3", "gemma4", "mistral3", "fara", "lfm2_vl"}
)


def image_tags(model_type: str) -> ImageTags | None:
    """How `model_type` marks images; None: the sidecar reads no images with it (logged for a
    type onnxruntime-genai reads images for)."""
    if model_type in OTHER_IMAGE_TYPES:
        log.warning(
            "this model reads images, but the sidecar places images for phi3v only: "
            "it serves text, and requests with images are refused",
            extra={"fields": {"model_type": model_type}},
        )
    return IMAGE_TAGS.get(model_type)


def fit_with_images(
    request: Generate,
    tags: ImageTags,
    counts: Sequence[int],
    prompts: PromptBuilder,
    max_length: int,
) -> tuple[Prompt, list[int]]:
    """The prompt with each image's run of tokens in its place (`counts`: each image's, from
    the processor), older turns left out with their images; and the request's indices of the
    images it holds, in order. An image is left out only with its turn, never one of a turn
    the prompt keeps (ImageRefused)."""
    placement = ImagePlacement(request.image_slots, list(counts), tags.after)
    fitted = prompts.fit(request.messages, request.max_new_tokens, max_length, placement)
    ids, kept = number_images(fitted.ids)
    system = 1 if request.messages[0][0] == "system" else 0
    gone = range(system, system + fitted.dropped_messages)
    expected = [i for i, (m, _) in enumerate(request.image_slots) if m not in gone]
    if sorted(kept) != expected:
        raise ImageRefused("the model's chat template left out an image of a kept turn")
    return replace(fitted, ids=ids), kept


def check_slots(request: Generate) -> None:
    """Each image has one slot, in a user message, at an offset inside its text (the web
    process places them; a request that breaks this is refused, never guessed at)."""
    if len(request.images) != len(request.image_slots):
        raise ImageRefused(
            f"{len(request.images)} images with {len(request.image_slots)} places for them"
        )
    for message, offset in request.image_slots:
        if not 0 <= message < len(request.messages):
            raise ImageRefused(f"an image is placed in message {message}, which is not there")
        role, text = request.messages[message]
        if role != "user":
            raise ImageRefused(f"an image is placed in a {role} message; only users send images")
        if not 0 <= offset <= len(text):
            raise ImageRefused(f"an image is placed at {offset}, outside its message's text")


def number_images(ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """A prompt whose image runs say the request's image (-(i+1) for image i), numbered as the
    processor numbers them: -k for the k-th image the prompt holds. Returns those ids and the
    request's indices of the images held, in order (an image of a left-out turn is gone)."""
    order: dict[int, int] = {}
    out = list(ids)
    for at, token in enumerate(out):
        if token < 0:
            k = order.setdefault(token, len(order) + 1)
            out[at] = -k
    return out, [-token - 1 for token in order]
