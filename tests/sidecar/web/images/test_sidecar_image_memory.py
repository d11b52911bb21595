"""The images' memory bound (web/images/memory.py, IMAGE_MEMORY_MB): a request's images are
counted from their headers before any is decoded, held as their PNGs until the request ends,
refused 503 images_busy (Retry-After) when the budget cannot hold them now and 400
image_too_large when it never could; the count covers what decoding really takes (peak RSS,
measured in a fresh process per image kind)."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from scripts.run import services
from scripts.run.services import Service
from sidecar.settings import Settings
from sidecar.web.errors import ApiError
from sidecar.web.images import memory as image_memory
from sidecar.web.images.decoding import ImageRef, Images
from sidecar.web.observability.record import RequestRecord
from tests.sidecar.support import metrics
from tests.sidecar.web.images.image_files import chat_body, data_url

REPO = Path(__file__).resolve().parents[4]


def picture(width: int, height: int, kind: str = "JPEG", mode: str = "RGB", seed: int = 0) -> bytes:
    """A photo-like image: coarse colour, upscaled, with grain (what a camera's file holds)."""
    rng = np.random.default_rng(seed)
    bands = len(mode)
    coarse = (rng.random((height // 16 + 1, width // 16 + 1, bands)) * 255).astype(np.uint8)
    base = Image.fromarray(coarse.squeeze(), mode).resize((width, height), Image.Resampling.BICUBIC)
    grain = rng.integers(-8, 8, size=(height, width, bands))
    pixels = np.clip(np.asarray(base).reshape(height, width, bands) + grain, 0, 255)
    out = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8).squeeze(), mode).save(out, kind)
    return out.getvalue()


def ref(data: bytes, media_type: str = "image/jpeg", i: int = 0) -> ImageRef:
    return ImageRef(data_url(data, media_type), f"messages.0.content.{i}.image_url.url")


def cost_of(*files: bytes) -> int:
    sizes = [Image.open(io.BytesIO(f)).size for f in files]
    return image_memory.cost([w * h for w, h in sizes], [len(f) for f in files])


def checker(budget_bytes: int) -> Images:
    found = Images(Settings())
    found.memory = image_memory.ImageMemory(budget_bytes)
    return found


def test_a_request_is_refused_while_others_images_fill_the_budget() -> None:
    photo = picture(600, 400)
    need = cost_of(photo, photo)
    found = checker(need + need // 10)  # one request's images, and less than their PNGs

    async def scenario() -> None:
        first = RequestRecord("first", "POST", "/v1/chat/completions")
        pngs = await found.prepare([ref(photo), ref(photo, i=1)], first)
        held = found.memory.in_use
        assert held == sum(len(png) for png in pngs) < need  # its PNGs, until it ends
        second = RequestRecord("second", "POST", "/v1/chat/completions")
        with pytest.raises(ApiError) as refused:
            await found.prepare([ref(photo), ref(photo, i=1)], second)
        assert refused.value.reason == "images_busy"
        assert refused.value.headers["Retry-After"] == "2"
        second.ended()
        assert found.memory.in_use == held and found.memory.refused == 1
        first.ended()
        assert found.memory.in_use == 0
        third = RequestRecord("third", "POST", "/v1/chat/completions")
        await found.prepare([ref(photo), ref(photo, i=1)], third)
        third.ended()
        assert found.memory.in_use == 0

    asyncio.run(scenario())


def test_images_that_could_never_fit_are_too_large_and_a_bad_one_releases_its_count() -> None:
    photo = picture(600, 400)
    found = checker(cost_of(photo) - 1)

    async def scenario() -> None:
        record = RequestRecord("big", "POST", "/predict")
        with pytest.raises(ApiError) as refused:
            await found.prepare([ref(photo)], record)
        assert refused.value.reason == "image_too_large"
        assert "IMAGE_MEMORY_MB" in refused.value.message
        assert found.memory.in_use == 0
        found.memory.budget_bytes = 10 * cost_of(photo)
        cut = photo[: len(photo) * 2 // 3]  # its header is whole, its pixels are not
        record = RequestRecord("cut", "POST", "/predict")
        with pytest.raises(ApiError) as refused:
            await found.prepare([ref(photo), ref(cut, i=1)], record)
        assert refused.value.reason == "invalid_image"
        assert str(refused.value.param).endswith("1.image_url.url")
        assert found.memory.in_use > 0  # counted until the request ends
        record.ended()
        assert found.memory.in_use == 0

    asyncio.run(scenario())


# VmHWM, not ru_maxrss: Linux keeps a forking parent's ru_maxrss across exec (pytest's).
MEASURE = """
import base64, gc, sys
from sidecar.web.images.decoding import Limits, header, render

def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

path, media = sys.argv[1], sys.argv[2]
data = base64.b64encode(open(path, "rb").read()).decode()
limits = Limits(8, 2**31, 10**9)
head = header(media, data, limits)
gc.collect()
base = peak()
png = render(head, limits)
print(peak() - base)
"""


@pytest.mark.slow  # an image of 6 megapixels made and decoded, five times
@pytest.mark.parametrize(
    ("kind", "mode", "media_type"),
    [
        ("JPEG", "RGB", "image/jpeg"),
        ("PNG", "RGBA", "image/png"),
        ("PNG", "L", "image/png"),
        ("WEBP", "RGB", "image/webp"),
        ("GIF", "P", "image/gif"),
    ],
)
def test_the_count_covers_what_decoding_really_takes(
    tmp_path: Path, kind: str, mode: str, media_type: str
) -> None:
    """Peak RSS while one 6-megapixel image is decoded and written as PNG, in a fresh process:
    within what image_memory counts for it, and not less than a sixth of it (one count for
    every kind: a palette GIF takes the least, 5.6 bytes a pixel of the 24 counted; WebP the
    most, 18.9)."""
    file = tmp_path / f"image.{kind.lower()}"
    source = picture(3000, 2000, kind if kind != "GIF" else "PNG", "RGB" if mode == "P" else mode)
    if kind == "GIF":
        Image.open(io.BytesIO(source)).convert("P").save(file, "GIF")
    else:
        file.write_bytes(source)
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(file), media_type],
        cwd=REPO / "phi3-sidecar",
        capture_output=True,
        text=True,
        check=True,
    )
    peak = int(done.stdout)
    counted = cost_of(file.read_bytes())
    assert counted / 6 < peak <= counted, (peak, counted)


@pytest.fixture(scope="module")
def bounded(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A text model (images are decoded all the same before it refuses them) with room for
    the images of about two of the requests below."""
    photo = picture(2000, 1500)
    budget_mb = 2 * cost_of(*[photo] * 4) // 2**20 + 1
    log = tmp_path_factory.mktemp("logs") / "sidecar-image-memory.log"
    with services.sidecar(tiny_model_dir, log, IMAGE_MEMORY_MB=str(budget_mb)) as service:
        yield service


def test_twelve_requests_of_four_photos_over_http(bounded: Service) -> None:
    """The probe's load: 12 requests with 4 photos each at once. Those the budget holds are
    decoded (and refused by the text model), the others get 503 images_busy at once; every
    count is given back."""
    photos = [picture(2000, 1500, seed=i) for i in range(4)]
    body = json.dumps(chat_body(*(data_url(p, "image/jpeg") for p in photos), max_tokens=2))
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def send() -> None:
        response = httpx.post(
            bounded.url + "/v1/chat/completions",
            content=body,
            headers={"Content-Type": "application/json"},
            timeout=120,
        )
        with lock:
            answers.append(response)

    threads = [threading.Thread(target=send) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    codes = sorted(r.json()["error"]["code"] for r in answers)
    busy = codes.count("overloaded")
    assert busy + codes.count("image_input_unsupported") == 12
    assert busy > 0 and codes.count("image_input_unsupported") >= 2
    for response in answers:
        if response.status_code == 503:
            assert response.headers["retry-after"] == "2"
            assert response.json()["error"]["type"] == "server_error"
    counts = metrics(bounded.url)
    assert counts['sidecar_image_refusals_total{reason="images_busy"}'] == busy
    assert counts["sidecar_image_memory_bytes"] == 0
