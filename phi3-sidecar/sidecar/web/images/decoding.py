"""Images in requests (issue 36): data URLs in, checked PNG bytes out (ipc.Generate.images).

The model worker never sees bytes a client sent: the image processor onnxruntime-genai uses
makes libjpeg exit the whole process on a malformed JPEG (or a GIF, or text), so every image is
decoded here with Pillow, bounded before it is decoded, and re-encoded as a PNG.

- Only `data:` URLs (base64; whitespace inside is tolerated) of the four accepted types. A
  remote URL is refused: the sidecar fetches nothing (a URL it fetched would let any caller
  make it request any address, internal ones included: vLLM's CVE-2025-6242).
- The declared type must be what the bytes are (a GIF named image/png is refused).
- MAX_IMAGE_BYTES bounds the file, MAX_IMAGE_PIXELS its pixels, read from the header before
  anything is decompressed (a 30000 x 30000 PNG of one colour is a few KB); MAX_IMAGES the
  images of a request; all before any image is decoded.
- Decoded fully (a truncated file fails here), the first frame of an animation, turned upright
  by its EXIF orientation (as browsers show it), transparency laid on white, RGB.
- Sizes a vision model can use. Each side from MIN_SIDE pixels: a smaller image (the 1 x 1
  tracking pixel) is less than one 14-pixel patch of Phi-3.5-vision's image encoder, so it
  shows the model next to nothing, yet costs a whole image's tokens (2,509 for a 1 x 1).
  Each side up to MAX_SIDE: onnxruntime-extensions' PNG decoder refuses a longer one (20 x
  30000 among them). The long side at most MAX_ASPECT times the short one: Phi-3-vision's
  processor scales the long side to 16 crops of 336 pixels, so the short side of a 20 x 16000
  image keeps 6 of its 336 pixels (the rest is padding; 1 x 5377 keeps none, and the
  processor fails), and Qwen2-VL's processor refuses past 200.

Decoding runs in a thread, at most DECODING_AT_ONCE images at a time, so images never hold
the event loop (the probes, the streams) and many at once queue instead of taking every CPU.
And the memory they take in this process is bounded (IMAGE_MEMORY_MB, images/memory.py):
counted from their headers before any is decoded, refused 503 `images_busy` when full.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import io
import math
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from PIL import Image, ImageOps

from sidecar.settings import Settings
from sidecar.web.errors import RETRY_OVERLOADED_S, ApiError
from sidecar.web.images import memory as image_memory
from sidecar.web.images.memory import ImageMemory, Reservation
from sidecar.web.observability.record import RequestRecord

# The declared type of each accepted format, by Pillow's name (a JPEG with a second picture,
# as cameras write them, is Pillow's MPO).
MEDIA_TYPES = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "MPO": "image/jpeg",
    "WEBP": "image/webp",
    "GIF": "image/gif",
}
ACCEPTED = ("image/png", "image/jpeg", "image/webp", "image/gif")
# Pillow's decoders tried on the bytes; no other format's code ever reads them.
_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
MIN_SIDE = 14
MAX_SIDE = 16384
MAX_ASPECT = 200
DECODING_AT_ONCE = 2
HEADER_CHARS = 256  # `data:image/png;base64,` and parameters (a file name)

# Pillow warns past its own default bound; ours (MAX_IMAGE_PIXELS, lower) is checked first.
warnings.simplefilter("ignore", Image.DecompressionBombWarning)

_DATA_URL = re.compile(r"data:([^,]*),", re.IGNORECASE)
_WHITESPACE = b" \t\n\r\f"


@dataclass(frozen=True)
class ImageRef:
    """An image of a request: its URL, the field it came in (for the refusal), and where it
    stands: the index of its message in the conversation sent to the worker and the offset in
    that message's text (ipc.Generate.image_slots)."""

    url: str
    param: str
    message: int = 0
    offset: int = 0


class ImageRefused(Exception):
    """Why an image is refused: a reason of errors.REFUSALS and a sentence."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def url_chars(max_image_bytes: int) -> int:
    """The longest data URL an image of `max_image_bytes` takes: base64 (4 characters for 3
    bytes), line breaks every 64 characters (PEM's, the densest any encoder writes) and the
    header."""
    encoded = 4 * math.ceil(max_image_bytes / 3)
    return encoded + 2 * math.ceil(encoded / 64) + HEADER_CHARS


def body_allowance(settings: Settings) -> int:
    """What a body with images may hold beyond MAX_BODY_BYTES: MAX_IMAGES data URLs."""
    return settings.max_images * url_chars(settings.max_image_bytes)


@dataclass(frozen=True)
class Limits:
    count: int  # MAX_IMAGES
    bytes: int  # MAX_IMAGE_BYTES
    pixels: int  # MAX_IMAGE_PIXELS

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(settings.max_images, settings.max_image_bytes, settings.max_image_pixels)


def payload(url: str, limits: Limits) -> tuple[str, str]:
    """The declared media type and the base64 text of a data URL; ImageRefused otherwise.
    Cheap (nothing is decoded): every image of a request is checked so before any is decoded."""
    scheme = url.partition(":")[0].lower() if ":" in url else ""
    if scheme in ("http", "https"):
        raise ImageRefused(
            "unsupported_image_url",
            "only data: URLs are accepted (data:image/png;base64,...): the sidecar fetches "
            "nothing, so that no caller can make it request an address",
        )
    header = _DATA_URL.match(url[: HEADER_CHARS + 6])
    if scheme != "data" or header is None:
        raise ImageRefused(
            "unsupported_image_url",
            "not a data: URL; send the image inline as data:image/png;base64,... (the sidecar "
            "fetches nothing)",
        )
    media_type, *params = (p.strip().lower() for p in header.group(1).split(";"))
    if "base64" not in params:
        raise ImageRefused("invalid_image", "the data URL is not base64 (;base64, is missing)")
    if media_type not in ACCEPTED:
        raise ImageRefused(
            "invalid_image",
            "the data URL's media type must be image/png, image/jpeg, image/webp or image/gif",
        )
    data = url[header.end() :]
    if len(data) > url_chars(limits.bytes) - HEADER_CHARS:
        raise ImageRefused("image_too_large", _too_many_bytes(limits))
    return media_type, data


@dataclass(frozen=True)
class Header:
    """An image's file and what its header says, read before any pixel is decoded."""

    raw: bytes
    media_type: str
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def decode(media_type: str, data: str, limits: Limits) -> bytes:
    """The image as PNG bytes (RGB, its first frame, upright); ImageRefused otherwise. Costs
    CPU: run it in a thread (`Images.prepare`)."""
    return render(header(media_type, data, limits), limits)


def header(media_type: str, data: str, limits: Limits) -> Header:
    """The file from its base64, checked by its header (type, pixels, sides); nothing is
    decoded (images/memory.py counts an image by this before it is). ImageRefused otherwise."""
    try:
        raw = base64.b64decode(data.encode("ascii").translate(None, _WHITESPACE), validate=True)
    except (UnicodeEncodeError, binascii.Error, ValueError):
        raise ImageRefused("invalid_image", "the data URL's base64 is not valid") from None
    if len(raw) > limits.bytes:
        raise ImageRefused("image_too_large", _too_many_bytes(limits))
    if not raw:
        raise ImageRefused("invalid_image", "the image is empty")
    with _opened(raw, media_type, limits) as image:
        _check_header(image, media_type, limits)
        return Header(raw, media_type, *image.size)


def render(head: Header, limits: Limits) -> bytes:
    """The checked image decoded and written as the PNG the worker gets; ImageRefused if its
    pixels cannot be read (a truncated file fails here)."""
    with _opened(head.raw, head.media_type, limits) as image:
        _check_header(image, head.media_type, limits)
        return _png(image)


@contextlib.contextmanager
def _opened(raw: bytes, media_type: str, limits: Limits) -> Iterator[Image.Image]:
    """Pillow's image of `raw` (its header read, nothing decoded); any failure inside, the
    decoding included, is the image's refusal."""
    try:
        with Image.open(io.BytesIO(raw), formats=_FORMATS) as image:
            yield image
    except ImageRefused:
        raise
    except Image.DecompressionBombError:  # past Pillow's own bound (twice its default)
        raise ImageRefused("image_too_large", _too_many_pixels(limits)) from None
    except Exception:
        raise ImageRefused(
            "invalid_image",
            f"the image cannot be read as {media_type} (not an image, a truncated or damaged "
            "file, or another format)",
        ) from None


def _check_header(image: Image.Image, media_type: str, limits: Limits) -> None:
    found = MEDIA_TYPES.get(image.format or "")
    if found != media_type:
        raise ImageRefused(
            "invalid_image", f"the data URL says {media_type} but the image is {found}"
        )
    width, height = image.size
    if width * height > limits.pixels:
        raise ImageRefused("image_too_large", _too_many_pixels(limits, width, height))
    size = f"the image is {width} x {height} pixels"
    if min(width, height) < MIN_SIDE:
        raise ImageRefused("invalid_image", f"{size}: each side must be at least {MIN_SIDE}")
    if max(width, height) > MAX_ASPECT * min(width, height):
        raise ImageRefused(
            "invalid_image",
            f"{size}: its long side may be at most {MAX_ASPECT} times its short side",
        )
    if max(width, height) > MAX_SIDE:
        raise ImageRefused("image_too_large", f"{size}: each side may be at most {MAX_SIDE}")


def _png(image: Image.Image) -> bytes:
    image.seek(0)  # the first frame of an animation
    image.load()  # the whole file: a truncated one fails here
    upright = ImageOps.exif_transpose(image)
    out = io.BytesIO()
    _rgb(upright).save(out, "PNG", compress_level=1)  # the fastest: it only crosses a pipe
    return out.getvalue()


def _rgb(image: Image.Image) -> Image.Image:
    """RGB, transparency laid on white (a logo's transparent background, shown on white as a
    page would, not the black its pixels may hold)."""
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        flat = Image.new("RGB", rgba.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba.getchannel("A"))
        return flat
    return image if image.mode == "RGB" else image.convert("RGB")


def _too_many_bytes(limits: Limits) -> str:
    return f"the image is larger than {limits.bytes} bytes (MAX_IMAGE_BYTES)"


def _too_many_pixels(limits: Limits, width: int | None = None, height: int | None = None) -> str:
    size = f" ({width} x {height})" if width is not None else ""
    return f"the image has more than {limits.pixels} pixels{size} (MAX_IMAGE_PIXELS)"


class Images:
    """The web process's image checks: the limits, the bound on decoding at once, and the
    bound on the memory images take (images/memory.py)."""

    def __init__(self, settings: Settings) -> None:
        self.limits = Limits.of(settings)
        self._decoding = asyncio.Semaphore(DECODING_AT_ONCE)
        self.memory = ImageMemory(settings.image_memory_mb * 2**20)

    async def prepare(self, refs: Sequence[ImageRef], record: RequestRecord) -> tuple[bytes, ...]:
        """Each image as checked PNG bytes, in order; ApiError (a 400 naming the field of
        the first image refused) otherwise. Every image is checked cheaply (count, URL, type,
        size, then its header) and the request's images counted against IMAGE_MEMORY_MB
        before any is decoded (503 images_busy when they do not fit now). The request's log
        line counts them."""
        if not refs:
            return ()
        record.images = len(refs)
        limits = self.limits
        if len(refs) > limits.count:
            raise ApiError(
                "too_many_images",
                f"the request holds {len(refs)} images; at most {limits.count} are accepted "
                "(MAX_IMAGES), earlier turns' included",
            )
        payloads = []
        for ref in refs:
            try:
                payloads.append(payload(ref.url, limits))
            except ImageRefused as refused:
                raise _refusal(ref, refused) from None
        heads = []
        for ref, (media_type, data) in zip(refs, payloads, strict=True):
            try:
                heads.append(await asyncio.to_thread(header, media_type, data, limits))
            except ImageRefused as refused:
                raise _refusal(ref, refused) from None
        del payloads
        reservation = self._reserve(heads)
        record.on_end(reservation.release)  # whatever follows, until the request is over
        decoded = []
        for ref, head in zip(refs, heads, strict=True):
            try:
                async with self._decoding:
                    png = await asyncio.to_thread(render, head, limits)
            except ImageRefused as refused:
                raise _refusal(ref, refused) from None
            decoded.append(png)
        del heads  # the files: only the PNGs are held from here on
        reservation.shrink_to(sum(len(png) for png in decoded))
        return tuple(decoded)

    def _reserve(self, heads: Sequence[Header]) -> Reservation:
        memory = self.memory
        need = image_memory.cost([h.pixels for h in heads], [len(h.raw) for h in heads])
        if need > memory.budget_bytes:
            raise ApiError(
                "image_too_large",
                f"the request's images need {need / 2**20:.0f} MiB to be decoded (their pixels, "
                f"read from their headers); at most {memory.budget_bytes / 2**20:.0f} MiB are "
                "(IMAGE_MEMORY_MB): send fewer or smaller images",
            )
        reservation = memory.reserve(need)
        if reservation is None:
            raise ApiError(
                "images_busy",
                "the images of other requests fill the memory set aside for images "
                "(IMAGE_MEMORY_MB); retry later",
                headers={"Retry-After": str(RETRY_OVERLOADED_S)},
            )
        return reservation


def _refusal(ref: ImageRef, refused: ImageRefused) -> ApiError:
    return ApiError(refused.reason, f"{ref.param}: {refused.message}", param=ref.param)
