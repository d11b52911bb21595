"""The chat page with images end to end on the real sidecar (issue 36): the generated tiny
`phi3v` model (`tiny_vision_model_dir`, `make_model.py --preset tiny-vision`) reads the image,
and the tiny text model's sidecar says it reads text only.

Needs the worker side (vision-engine) and the web process side (vision-web) of issue 36: the
fixture `tiny_vision_model_dir`, `image_url` parts on /predict, `image_input` in /readyz."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Page, expect

from scripts.run import services
from tests.chatapp.image_files import data_url, gradient_png, image_bytes, image_part
from tests.e2e.browser.support import chat_request, reply, send
from tests.e2e.browser.test_browser_images import (
    attach_by_button,
    file_payload,
    paste,
    sent_images,
    shown,
    text_of,
)
from tests.e2e.conftest import AppFactory

pytestmark = pytest.mark.browser

PHOTO = image_bytes(120, 90, (30, 120, 200), "JPEG")
STRIPES = gradient_png(200, 60)


@pytest.fixture(scope="module")
def vision_app(
    vision_sidecar_service: services.Service, start_app: AppFactory
) -> Iterator[services.Service]:
    with start_app(vision_sidecar_service.url) as app:
        yield app


def test_an_image_chat_on_the_vision_model(
    page: Page, vision_app: services.Service, vision_sidecar_service: services.Service
) -> None:
    assert (
        httpx.get(vision_sidecar_service.url + "/readyz", timeout=5).json()["image_input"] is True
    )
    page.goto(vision_app.url)
    expect(page.locator("#model-status")).to_contain_text("Model ready")
    expect(page.locator("#attach")).to_have_attribute("aria-disabled", "false")

    attach_by_button(page, file_payload("photo.jpg", "image/jpeg", PHOTO))
    expect(page.locator("#attachments .attachment")).to_have_count(1)
    body = chat_request(page, lambda: send(page, "What is in the picture?"))
    assert sent_images(body) == [[("image/jpeg", PHOTO)]]
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "done", timeout=120_000)
    # The page shows what the sidecar answers the same content parts directly (greedy).
    expected = httpx.post(
        vision_sidecar_service.url + "/predict", json={"messages": body["messages"]}, timeout=120
    ).text
    assert expected
    expect(answer.locator(".text")).to_have_text(expected)
    shown(page, ".message.user .open-image img")

    # Reloaded, the chat goes on with its image; a pasted second image joins it.
    page.reload()
    shown(page, ".message.user .open-image img")
    paste(page, "stripes.png", "image/png", STRIPES)
    expect(page.locator("#attachments .attachment")).to_have_count(1)
    second = chat_request(page, lambda: send(page, "And this one?"))
    assert sent_images(second) == [[("image/jpeg", PHOTO)], [], [("image/png", STRIPES)]]
    assert text_of(second["messages"][1]) == expected
    expect(reply(page)).to_have_attribute("data-state", "done", timeout=120_000)
    expect(page.locator(".message.user .open-image")).to_have_count(2)


def test_the_text_model_says_it_reads_text_only(
    page: Page, live_app: services.Service, sidecar_service: services.Service
) -> None:
    """The tiny text model: /readyz says image_input false, the page turns images off, and an
    image sent anyway (an older page) is the sidecar's 400, relayed as the chat's error."""
    assert httpx.get(sidecar_service.url + "/readyz", timeout=5).json()["image_input"] is False
    health = httpx.get(live_app.url + "/healthz", timeout=5).json()
    assert health["sidecar"]["detail"]["image_input"] is False
    page.goto(live_app.url)
    expect(page.locator("#attach")).to_have_attribute("aria-disabled", "true")
    expect(page.locator("#attach")).to_have_accessible_description(
        "The model reads text only: it cannot see images."
    )
    turn = {"role": "user", "content": [image_part(data_url(image_bytes(64, 48)))]}
    response = httpx.post(live_app.url + "/chat", json={"messages": [turn]}, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request"
