"""The model picker (issue 56) in the page: on our real sidecar serving three models by name
(MODELS_FILE: the tiny model pinned and the default, the tiny vision model pinned, the small
model loaded when asked for), the picker lists them with loaded and cold badges, the paperclip
follows what the chosen model reads, the chosen model is sent, named in its reply's meta line
and kept with the chat over a reload (in the browser, and on the server for a signed-in user).
A cold model's loading line, and a service with one model, on the fake."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from scripts.run import services
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar
from tests.e2e.browser.support import chat_request, reply, save_screenshot, send
from tests.e2e.browser.test_browser_accessibility import serious_violations
from tests.e2e.conftest import AppFactory

pytestmark = pytest.mark.browser

ALICE = {"X-MS-CLIENT-PRINCIPAL-ID": "alice-oid", "X-MS-CLIENT-PRINCIPAL-NAME": "alice"}


@pytest.fixture(scope="module")
def three_models(
    tiny_model_dir: Path,
    tiny_vision_model_dir: Path,
    small_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[services.Service]:
    folder = tmp_path_factory.mktemp("three-models")
    tables: list[dict[str, Any]] = [
        {"id": "tiny", "path": str(tiny_model_dir), "pinned": True},
        {"id": "tiny-vision", "path": str(tiny_vision_model_dir), "pinned": True},
        {"id": "small", "path": str(small_model_dir)},
    ]
    with services.several_models(folder, tables) as sidecar:
        yield sidecar


@pytest.fixture
def cold_small(three_models: services.Service) -> services.Service:
    """The sidecar with its small model not loaded, as at its start."""
    response = httpx.post(f"{three_models.url}/v1/models/small/unload", timeout=30)
    assert response.status_code == 200
    return three_models


@pytest.fixture
def app(cold_small: services.Service, start_app: AppFactory) -> Iterator[services.Service]:
    with start_app(cold_small.url) as app:
        yield app


def options(page: Page) -> list[str]:
    return page.locator("#model-picker option").all_text_contents()


def test_the_models_with_their_badges_and_the_paperclip_following_the_choice(
    app: services.Service, page: Page
) -> None:
    page.goto(app.url)
    picker = page.get_by_label("Model", exact=True)  # the select, by its label
    expect(picker).to_be_visible()
    expect(picker.locator("option")).to_have_text(
        ["tiny (default) · loaded", "tiny-vision · loaded", "small · cold"]
    )
    expect(picker).to_have_value("tiny")
    badge = page.locator("#model-badge")
    expect(badge).to_have_text("Loaded")
    expect(picker).to_have_accessible_description("Loaded")
    attach = page.locator("#attach")
    expect(attach).to_have_attribute("aria-disabled", "true")  # the tiny model reads text
    expect(attach).to_have_accessible_description(
        "The model reads text only: it cannot see images."
    )
    # By keyboard: the vision model, then the small one
    picker.focus()
    page.keyboard.press("ArrowDown")
    expect(picker).to_have_value("tiny-vision")
    expect(attach).to_have_attribute("aria-disabled", "false")
    page.keyboard.press("ArrowDown")
    expect(picker).to_have_value("small")
    expect(badge).to_have_text("Cold")
    expect(badge).to_have_attribute("data-state", "cold")
    # Not loaded yet: what it reads is not known, so images are offered
    expect(attach).to_have_attribute("aria-disabled", "false")
    # One model's name no longer names every reply: the header shows none
    expect(page.locator("#model-name")).to_be_hidden()
    assert serious_violations(page) == []
    save_screenshot(page, "chat-model-picker.png")


def test_the_chosen_model_is_sent_named_and_kept(app: services.Service, page: Page) -> None:
    page.goto(app.url)
    picker = page.locator("#model-picker")
    expect(picker).to_have_value("tiny")
    picker.select_option("small")
    body = chat_request(page, lambda: send(page, "Hello"))
    assert body["model"] == "small"
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "done", timeout=60_000)
    expect(answer.locator(".reply-model")).to_have_text("small")
    expect(answer.locator(".role")).to_have_text("Assistant")
    # Loaded by that reply: the list, asked again when it ended, says so
    expect(page.locator("#model-badge")).to_have_text("Loaded")
    expect(picker.locator("option")).to_have_text(
        ["tiny (default) · loaded", "tiny-vision · loaded", "small · loaded"]
    )
    # The next turn asks it again, and a reload keeps the choice and the reply's model
    assert chat_request(page, lambda: send(page, "Again"))["model"] == "small"
    expect(reply(page)).to_have_attribute("data-state", "done", timeout=60_000)
    page.reload()
    expect(picker).to_have_value("small")
    expect(page.locator(".message.assistant .reply-model")).to_have_text(["small", "small"])
    # A new chat starts with the model chosen last; another model there leaves this one's
    page.locator("#new-chat").click()
    expect(picker).to_have_value("small")
    picker.select_option("tiny")
    assert chat_request(page, lambda: send(page, "Other"))["model"] == "tiny"
    expect(reply(page)).to_have_attribute("data-state", "done", timeout=60_000)
    page.locator(".chat-link", has_text="Hello").click()
    expect(picker).to_have_value("small")
    page.locator(".chat-link", has_text="Other").click()
    expect(picker).to_have_value("tiny")


def test_a_chat_kept_on_the_server_keeps_its_model(
    cold_small: services.Service, start_app: AppFactory, browser: Browser, tmp_path: Path
) -> None:
    database = f"sqlite:///{tmp_path / 'chats.db'}"
    with start_app(cold_small.url, AUTH_MODE="appservice", DATABASE_URL=database) as app:
        context = browser.new_context(viewport={"width": 1100, "height": 760})
        context.set_extra_http_headers(ALICE)
        context.set_default_timeout(30_000)
        page = context.new_page()
        try:
            page.goto(app.url)
            expect(page.locator("#signed-in")).to_have_text("Signed in as alice")
            page.locator("#model-picker").select_option("small")
            body = chat_request(page, lambda: send(page, "Walrus facts"))
            assert body["model"] == "small" and "chat_id" in body
            expect(reply(page)).to_have_attribute("data-state", "done", timeout=60_000)
            stored = httpx.get(f"{app.url}/api/chats/{body['chat_id']}", headers=ALICE).json()
            assert [m.get("model") for m in stored["messages"]] == [None, "small"]
            # Another model chosen for the next chat, then back: each chat goes on with its own
            page.locator("#new-chat").click()
            page.locator("#model-picker").select_option("tiny-vision")
            page.reload()
            expect(page.locator("#model-picker")).to_have_value("small")  # its last reply's
            expect(page.locator(".message.assistant .reply-model")).to_have_text("small")
            assert chat_request(page, lambda: send(page, "More"))["model"] == "small"
            expect(reply(page)).to_have_attribute("data-state", "done", timeout=60_000)
        finally:
            context.close()


# Our sidecar's list on the fake: the default loaded, a cold model whose last load took 12.3 s.
TWO_MODELS = {
    "object": "list",
    "data": [
        {"id": "phi3-mini", "input_modalities": ["text"], "state": "loaded", "default": True},
        {"id": "smollm2", "input_modalities": ["text"], "state": "available", "load_s": 12.3},
    ],
}


def test_a_cold_model_is_said_to_be_loading(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    fake.models = (200, TWO_MODELS)

    def predict(h: fs.Handler) -> None:
        fs.start_events(h)
        for seconds, left in ((0.0, 12), (1.0, 11)):
            event = {"loading": {"model": "smollm2", "seconds": seconds, "seconds_left": left}}
            fs.write_chunk(h, fs.event_line(event))
            time.sleep(1.0)
        fs.write_text(h, "Loaded and ready.")
        fs.write_done(h, 3)

    fake.predict = predict
    page.goto(app.url)
    expect(page.locator("#model-picker option")).to_have_text(
        ["phi3-mini (default) · loaded", "smollm2 · cold, loads in ~12 s"]
    )
    page.locator("#model-picker").select_option("smollm2")
    expect(page.locator("#model-badge")).to_have_text("Cold, loads in ~12 s")
    send(page, "Hello")
    reading = reply(page).locator(".reading")
    expect(reading).to_have_text("Loading smollm2 · about 12 s")
    expect(reading).to_have_text("Loading smollm2 · about 11 s")
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(reading).to_have_count(0)
    expect(reply(page).locator(".text")).to_have_text("Loaded and ready.")
    assert json.loads(fake.raw_bodies[0])["model"] == "smollm2"


def test_a_model_taken_out_is_said_and_one_model_offers_no_choice(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    fake.models = (200, TWO_MODELS)
    gone = {"error": {"message": "no model 'smollm2' here", "type": "not_found"}}
    fake.predict = lambda h: fs.refuse(h, 404, gone)
    page.goto(app.url)
    page.locator("#model-picker").select_option("smollm2")
    # The sidecar restarted with one model: the chat says so, and the list no longer offers any
    fake.models = (200, {"object": "list", "data": [TWO_MODELS["data"][0]]})
    send(page, "Hello")
    expect(reply(page)).to_have_attribute("data-state", "error")
    expect(reply(page).locator(".text")).to_have_text(
        "The model service has no model named 'smollm2'; choose another model."
    )
    expect(page.locator("#model-row")).to_be_hidden()
    fake.predict = lambda h: fs.reply(h, ["Hi."])
    body = chat_request(page, lambda: send(page, "Hello again"))
    assert "model" not in body  # one model: the service's default answers, as before
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(reply(page).locator(".reply-model")).to_have_count(0)
