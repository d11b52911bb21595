"""The web process's image checks (web/images/decoding.py) on real files made with Pillow: what is
accepted and what the model worker then gets (RGB PNG bytes), and each hostile file's refusal,
decided before anything is decoded where it can be. Also where each image stands in its
message (web/generation/messages.py) and how many bytes a body may hold for its images."""

from __future__ import annotations

import asyncio
import base64
import io
import threading
from collections.abc import Callable
from typing import Any

import pytest
from PIL import Image, ImageFile

from sidecar.settings import Settings
from sidecar.web.errors import ApiError
from sidecar.web.generation.messages import ImagePart, TextPart, images_of, text_of
from sidecar.web.images import decoding as images
from sidecar.web.images.decoding import ImageRef, ImageRefused, Images, Limits
from sidecar.web.observability.record import RequestRecord
from tests.sidecar.web.images.image_files import (
    animated_gif,
    bomb_png,
    data_url,
    encoded,
    jpeg,
    png,
    truncated_jpeg,
    webp,
)

LIMITS = Limits(count=4, bytes=5 * 1024 * 1024, pixels=7680 * 4320)


def checked(url: str, limits: Limits = LIMITS) -> Image.Image:
    """The image the model worker would get for `url` (images/decoding.py's two steps, in order)."""
    media_type, data = images.payload(url, limits)
    out = images.decode(media_type, data, limits)
    image = Image.open(io.BytesIO(out))
    assert image.format == "PNG" and image.mode == "RGB"
    return image


def refused(url: str, limits: Limits = LIMITS) -> ImageRefused:
    with pytest.raises(ImageRefused) as raised:
        checked(url, limits)
    return raised.value


@pytest.mark.parametrize(
    ("make", "media_type", "color"),
    [
        (png, "image/png", (200, 30, 30)),
        (jpeg, "image/jpeg", (30, 200, 30)),
        (webp, "image/webp", (30, 30, 200)),
        (lambda: animated_gif((250, 250, 0), (0, 0, 0)), "image/gif", (250, 250, 0)),
    ],
    ids=["png", "jpeg", "webp", "gif"],
)
def test_the_four_formats_become_rgb_pngs(
    make: Callable[[], bytes], media_type: str, color: tuple[int, int, int]
) -> None:
    image = checked(data_url(make(), media_type))
    assert image.size in ((48, 32), (40, 30))
    red, green, blue = image.getpixel((10, 10))  # type: ignore[misc]
    assert max(abs(red - color[0]), abs(green - color[1]), abs(blue - color[2])) <= 3


def test_an_animated_gif_gives_its_first_frame() -> None:
    image = checked(data_url(animated_gif((0, 0, 255), (255, 0, 0), (0, 255, 0)), "image/gif"))
    assert image.getpixel((5, 5)) == (0, 0, 255)
    frames = [Image.new("RGB", (20, 20), c) for c in ((0, 255, 0), (255, 0, 0))]
    apng = encoded(frames[0], "PNG", save_all=True, append_images=frames[1:])
    assert checked(data_url(apng)).getpixel((5, 5)) == (0, 255, 0)


def test_a_camera_jpeg_with_a_second_picture_is_a_jpeg() -> None:
    first, second = Image.new("RGB", (30, 20), "white"), Image.new("RGB", (30, 20), "black")
    mpo = encoded(first, "MPO", save_all=True, append_images=[second])
    assert Image.open(io.BytesIO(mpo)).format == "MPO"
    assert checked(data_url(mpo, "image/jpeg")).getpixel((3, 3)) == (255, 255, 255)


def test_an_image_is_turned_upright_by_its_exif_orientation() -> None:
    photo = Image.new("RGB", (60, 20), "white")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to show it, as browsers do
    image = checked(data_url(encoded(photo, "JPEG", exif=exif.tobytes()), "image/jpeg"))
    assert image.size == (20, 60)


def test_transparency_is_laid_on_white_and_other_modes_become_rgb() -> None:
    clear = Image.new("RGBA", (16, 16), (0, 0, 0, 0))
    assert checked(data_url(encoded(clear, "PNG"))).getpixel((1, 1)) == (255, 255, 255)
    grey = Image.new("L", (16, 16), 128)
    assert checked(data_url(encoded(grey, "PNG"))).getpixel((1, 1)) == (128, 128, 128)
    cmyk = Image.new("CMYK", (16, 16), (0, 0, 0, 0))
    assert checked(data_url(encoded(cmyk, "JPEG"), "image/jpeg")).getpixel((1, 1)) == (
        255,
        255,
        255,
    )
    palette = Image.new("P", (16, 16), 0)
    palette.info["transparency"] = 0
    assert checked(data_url(encoded(palette, "GIF"), "image/gif")).getpixel((1, 1)) == (
        255,
        255,
        255,
    )


def test_whitespace_inside_the_base64_is_tolerated() -> None:
    text = base64.encodebytes(png()).decode()  # lines of 76 characters, as MIME writes them
    assert "\n" in text.strip()
    assert checked("data:image/png;base64," + text).size == (48, 32)
    spaced = "data:image/png;base64, " + " \r\n\t".join(base64.b64encode(png()).decode())
    assert checked(spaced).size == (48, 32)


def test_the_header_is_read_as_rfc_2397_says() -> None:
    url = "DATA:Image/PNG;name=photo.png;BASE64," + base64.b64encode(png()).decode()
    assert checked(url).size == (48, 32)


def test_each_side_from_14_pixels_and_at_most_200_times_the_other() -> None:
    assert checked(data_url(png(14, 14))).size == (14, 14)
    assert checked(data_url(png(14, 2800))).size == (14, 2800)
    assert checked(data_url(png(6000, 30))).size == (6000, 30)
    one = refused(data_url(png(1, 1)))
    assert (one.reason, one.message) == (
        "invalid_image",
        "the image is 1 x 1 pixels: each side must be at least 14",
    )
    assert refused(data_url(png(13, 500))).reason == "invalid_image"
    narrow = refused(data_url(png(20, 30000)))
    assert (narrow.reason, narrow.message) == (
        "invalid_image",
        "the image is 20 x 30000 pixels: its long side may be at most 200 times its short side",
    )
    assert refused(data_url(png(2801, 14))).reason == "invalid_image"
    long = refused(data_url(png(16385, 100)))
    assert (long.reason, long.message) == (
        "image_too_large",
        "the image is 16385 x 100 pixels: each side may be at most 16384",
    )
    assert checked(data_url(png(16384, 100))).size == (16384, 100)


HOSTILE: dict[str, tuple[Callable[[], str], str, str]] = {
    "truncated-jpeg": (
        lambda: data_url(truncated_jpeg(), "image/jpeg"),
        "invalid_image",
        "cannot be read as image/jpeg",
    ),
    "gif-named-png": (
        lambda: data_url(animated_gif((1, 2, 3), (4, 5, 6))),
        "invalid_image",
        "the data URL says image/png but the image is image/gif",
    ),
    "text-named-png": (
        lambda: data_url(b"Hello, I am a text file.\n" * 40),
        "invalid_image",
        "cannot be read as image/png",
    ),
    "jpeg-named-webp": (
        lambda: data_url(jpeg(), "image/webp"),
        "invalid_image",
        "the data URL says image/webp but the image is image/jpeg",
    ),
    "bmp": (
        lambda: data_url(encoded(Image.new("RGB", (4, 4)), "BMP"), "image/bmp"),
        "invalid_image",
        "media type must be image/png, image/jpeg, image/webp or image/gif",
    ),
    "bmp-named-png": (
        lambda: data_url(encoded(Image.new("RGB", (4, 4)), "BMP")),
        "invalid_image",
        "cannot be read as image/png",
    ),
    "svg": (
        lambda: data_url(b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/svg+xml"),
        "invalid_image",
        "media type must be",
    ),
    "text-plain": (lambda: data_url(png(), "text/plain"), "invalid_image", "media type must be"),
    "no-media-type": (lambda: data_url(png(), ""), "invalid_image", "media type must be"),
    "not-base64": (
        lambda: "data:image/png," + "%89PNG%0D%0A",
        "invalid_image",
        "not base64",
    ),
    "bad-base64": (
        lambda: "data:image/png;base64,iVBORw0KGgo!!!!",
        "invalid_image",
        "base64 is not valid",
    ),
    "base64-without-padding": (
        lambda: data_url(png()).rstrip("="),
        "invalid_image",
        "base64 is not valid",
    ),
    "url-safe-base64": (
        lambda: "data:image/png;base64," + base64.urlsafe_b64encode(b"\xfb\xff" * 30).decode(),
        "invalid_image",
        "base64 is not valid",
    ),
    "empty": (lambda: "data:image/png;base64,", "invalid_image", "the image is empty"),
    "http": (
        lambda: "http://169.254.169.254/latest/meta-data/",
        "unsupported_image_url",
        "the sidecar fetches nothing",
    ),
    "https": (
        lambda: "https://example.com/cat.png",
        "unsupported_image_url",
        "the sidecar fetches nothing",
    ),
    "file": (lambda: "file:///etc/passwd", "unsupported_image_url", "not a data: URL"),
    "no-scheme": (lambda: "cat.png", "unsupported_image_url", "not a data: URL"),
    "bomb": (lambda: data_url(bomb_png()), "image_too_large", "MAX_IMAGE_PIXELS"),
    "one-pixel": (lambda: data_url(png(1, 1)), "invalid_image", "at least 14"),
    "20x30000": (lambda: data_url(png(20, 30000)), "invalid_image", "200 times"),
    "huge-base64": (
        lambda: "data:image/png;base64," + "A" * (images.url_chars(LIMITS.bytes) + 4),
        "image_too_large",
        f"larger than {LIMITS.bytes} bytes (MAX_IMAGE_BYTES)",
    ),
}


@pytest.mark.parametrize("case", HOSTILE.values(), ids=HOSTILE.keys())
def test_each_hostile_image_is_refused_with_its_reason(
    case: tuple[Callable[[], str], str, str],
) -> None:
    make, reason, says = case
    url = make()
    error = refused(url)
    assert (error.reason, says in error.message) == (reason, True), error.message
    rest = url.partition(",")[2] or url.partition(":")[2] or url
    assert not rest or rest[:40] not in error.message  # the input is never echoed


def test_remote_urls_and_oversized_files_are_refused_before_any_decoding() -> None:
    for url in (HOSTILE["http"][0](), HOSTILE["huge-base64"][0](), HOSTILE["svg"][0]()):
        with pytest.raises(ImageRefused):
            images.payload(url, LIMITS)


def test_the_pixel_bound_is_read_from_the_header_before_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loads = []
    original = ImageFile.ImageFile.load

    def counted(self: ImageFile.ImageFile) -> Any:
        loads.append(self.size)
        return original(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", counted)
    small = Limits(count=4, bytes=LIMITS.bytes, pixels=100 * 100)
    error = refused(data_url(png(101, 100)), small)
    assert error.reason == "image_too_large"
    assert error.message == "the image has more than 10000 pixels (101 x 100) (MAX_IMAGE_PIXELS)"
    assert refused(data_url(bomb_png(4000, 4000)), small).reason == "image_too_large"
    assert loads == []  # refused from their headers alone
    assert checked(data_url(png(100, 100)), small).size == (100, 100)
    assert set(loads) == {(100, 100)}


def test_the_byte_bound_counts_the_file_not_its_base64() -> None:
    limits = Limits(count=4, bytes=2000, pixels=LIMITS.pixels)
    text = base64.encodebytes(bytes(2001)).decode()  # one byte over, with MIME's line breaks
    url = "data:image/png;base64," + text
    images.payload(url, limits)  # its base64 is within what 2000 bytes may take
    error = refused(url, limits)
    assert error.reason == "image_too_large" and "2000 bytes" in error.message
    small = png(16, 16)
    assert len(small) <= 2000 and checked(data_url(small), limits).size == (16, 16)


def test_a_data_url_of_the_largest_file_fits_its_allowance() -> None:
    size = 3000
    limits = Limits(count=1, bytes=size, pixels=LIMITS.pixels)
    raw = bytes(range(256)) * (size // 256) + bytes(size % 256)
    for text in (
        base64.b64encode(raw).decode(),
        base64.encodebytes(raw).decode(),  # 76-character lines
        "\r\n".join(base64.b64encode(raw).decode()[i : i + 64] for i in range(0, 4000, 64)),
    ):
        url = "data:image/png;name=a-long-file-name-as-some-tools-add-it.png;base64," + text
        assert len(url) <= images.url_chars(size)
        images.payload(url, limits)  # not refused for its length


def test_the_body_allowance_is_max_images_data_urls() -> None:
    settings = Settings(max_images=3, max_image_bytes=3 * 1024 * 1024)
    per_image = images.url_chars(3 * 1024 * 1024)
    assert images.body_allowance(settings) == 3 * per_image
    assert 4 * 1024 * 1024 < per_image < 4.2 * 1024 * 1024  # 4/3, line breaks, header
    assert images.body_allowance(Settings(max_images=0)) == 0


def refs(*urls: str) -> list[ImageRef]:
    return [ImageRef(url, f"messages.0.content.{i}.image_url.url") for i, url in enumerate(urls)]


def prepare(checker: Images, image_refs: list[ImageRef]) -> tuple[bytes, ...]:
    record = RequestRecord("rid", "POST", "/v1/chat/completions")
    result = asyncio.run(checker.prepare(image_refs, record))
    assert record.images == (len(image_refs) or None)  # the log line counts them
    return result


def test_prepare_returns_pngs_in_order_and_names_the_field_it_refuses() -> None:
    checker = Images(Settings(max_images=3))
    out = prepare(checker, refs(data_url(png(30, 40)), data_url(jpeg(50, 60), "image/jpeg")))
    assert [Image.open(io.BytesIO(b)).size for b in out] == [(30, 40), (50, 60)]
    with pytest.raises(ApiError) as raised:
        prepare(checker, refs(data_url(png()), data_url(truncated_jpeg(), "image/jpeg")))
    error = raised.value
    assert (error.reason, error.param) == ("invalid_image", "messages.0.content.1.image_url.url")
    assert error.message.startswith("messages.0.content.1.image_url.url: the image cannot be read")
    with pytest.raises(ApiError) as raised:
        prepare(checker, refs(*[data_url(png())] * 4))
    assert raised.value.reason == "too_many_images"
    assert raised.value.message == (
        "the request holds 4 images; at most 3 are accepted (MAX_IMAGES), earlier turns' included"
    )


def test_prepare_checks_every_url_before_it_decodes_any(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[str] = []
    original = images.decode

    def counted(media_type: str, data: str, limits: Limits) -> bytes:
        decoded.append(media_type)
        return original(media_type, data, limits)

    monkeypatch.setattr(images, "decode", counted)
    checker = Images(Settings())
    with pytest.raises(ApiError) as raised:
        prepare(checker, refs(data_url(png()), "https://example.com/a.png"))
    assert raised.value.reason == "unsupported_image_url" and decoded == []
    assert prepare(checker, []) == () and decoded == []


def test_max_images_zero_refuses_every_image() -> None:
    with pytest.raises(ApiError) as raised:
        prepare(Images(Settings(max_images=0)), refs(data_url(png())))
    assert raised.value.reason == "too_many_images"


def parts(*items: str | None) -> list[TextPart | ImagePart]:
    """Text parts for strings, an image part for None."""
    return [
        TextPart(type="text", text=item)
        if item is not None
        else ImagePart.model_validate({"type": "image_url", "image_url": {"url": "data:,"}})
        for item in items
    ]


@pytest.mark.parametrize(
    ("items", "text", "offsets"),
    [
        ((None, "What is this?"), "What is this?", [0]),
        (("What is this?", None), "What is this?", [13]),
        (("Compare", None, "with", None), "Compare\nwith", [8, 12]),
        ((None, None, "Both?"), "Both?", [0, 0]),
        ((None,), "", [0]),
        (("<|image_1|> typed", None), "<|image_1|> typed", [17]),  # typed tags stay text
    ],
)
def test_an_image_stands_where_the_next_text_part_begins(
    items: tuple[str | None, ...], text: str, offsets: list[int]
) -> None:
    content = parts(*items)
    assert text_of(content) == text
    placed = images_of(content, 3, "messages.1.content")
    assert [ref.offset for ref in placed] == offsets
    assert {ref.message for ref in placed} == {3}
    indices = [i for i, item in enumerate(items) if item is None]
    assert [ref.param for ref in placed] == [
        f"messages.1.content.{i}.image_url.url" for i in indices
    ]


def test_images_are_decoded_beside_the_event_loop_two_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five requests' images at once: two are decoded (in threads), the others wait for their
    turn, and the event loop goes on meanwhile (this test runs on it)."""
    release = threading.Event()
    inside: list[int] = []
    most = [0]
    lock = threading.Lock()
    original = images.render

    def held(head: images.Header, limits: Limits) -> bytes:
        with lock:
            inside.append(1)
            most[0] = max(most[0], len(inside))
        release.wait(30)
        with lock:
            inside.pop()
        return original(head, limits)

    monkeypatch.setattr(images, "render", held)
    checker = Images(Settings())

    async def scenario() -> list[tuple[bytes, ...]]:
        def request() -> Any:
            record = RequestRecord("rid", "POST", "/predict")
            return checker.prepare(refs(data_url(png())), record)

        tasks = [asyncio.create_task(request()) for _ in range(5)]
        for _ in range(3000):  # the loop turns while two decodes are held in their threads
            if len(inside) == images.DECODING_AT_ONCE:
                break
            await asyncio.sleep(0.01)
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert len(inside) == images.DECODING_AT_ONCE  # the third waits for a turn
        release.set()
        return list(await asyncio.gather(*tasks))

    results = asyncio.run(scenario())
    assert len(results) == 5 and all(len(r) == 1 for r in results)
    assert most[0] == images.DECODING_AT_ONCE
