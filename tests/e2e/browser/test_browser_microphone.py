"""The page's microphone in real Chromium (issue 57), its fake capture device playing a
sentence espeak-ng spoke: recorded with MediaRecorder, transcribed by the real Whisper tiny.en
through the app's POST /api/transcribe, the words put in the message box and not sent; Esc
drops a recording; the button is off with its sentence on a sidecar without a speech model,
and a refused microphone is a sentence too. Screenshots: build/screenshots/microphone-*.png."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Request, expect, sync_playwright

from scripts.run import services
from tests.e2e.browser.support import CHROMIUM, save_screenshot
from tests.e2e.conftest import AppFactory

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng"),
]

SENTENCE = "Paris is the capital and largest city of France."
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def voice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("voice") / "sentence.wav"
    subprocess.run(["espeak-ng", "-w", str(out), SENTENCE], check=True)
    return out


# Its own browser: the fake capture device plays the sentence (looped). Without
# --use-fake-ui-for-media-stream, each context's permissions decide: granted, or refused.
@pytest.fixture(scope="module")
def browser(voice: Path) -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not at /usr/bin/chromium")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={voice}",
                "--autoplay-policy=no-user-gesture-required",
            ],
        )
        yield launched
        launched.close()


def open_page(browser: Browser, url: str, *, allowed: bool = True, **options: Any) -> Page:
    context = browser.new_context(
        viewport=options.pop("viewport", {"width": 1100, "height": 760}),
        permissions=["microphone"] if allowed else [],
        **options,
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.set_default_timeout(20_000)
    page.goto(url)
    page.errors = errors  # type: ignore[attr-defined]
    return page


@pytest.fixture(scope="module")
def speech_app(
    speech_sidecar_service: services.Service, start_app: AppFactory
) -> Iterator[services.Service]:
    with start_app(speech_sidecar_service.url) as app:
        yield app


def watch(page: Page) -> list[str]:
    """The paths of the page's POST requests, as they are made."""
    posted: list[str] = []

    def seen(request: Request) -> None:
        if request.method == "POST":
            posted.append(request.url.split("/", 3)[-1])

    page.on("request", seen)
    return posted


def test_a_spoken_message_lands_in_the_box_unsent(
    browser: Browser, speech_app: services.Service
) -> None:
    page = open_page(browser, speech_app.url)
    posted = watch(page)
    mic = page.locator("#mic")
    expect(mic).to_have_attribute("aria-disabled", "false")
    expect(mic).to_have_attribute("title", "Speak your message (up to 0:10)")
    page.locator("#prompt").fill("Question:")
    mic.focus()
    page.keyboard.press("Enter")  # keyboard operable
    expect(mic).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#recording")).to_be_visible()
    expect(page.locator("#announcer")).to_have_text("Recording")
    expect(page.locator("#recording-time")).to_contain_text("0:04 / 0:10", timeout=10_000)
    save_screenshot(page, "microphone-recording.png")
    mic.click()  # stop: the recording goes to be transcribed
    expect(page.locator("#announcer")).to_have_text("Transcript ready", timeout=60_000)
    expect(mic).to_have_attribute("aria-pressed", "false")
    expect(page.locator("#recording")).to_be_hidden()
    text = page.locator("#prompt").input_value()
    assert text.startswith("Question: ")
    assert all(word in text.lower() for word in ("paris", "capital", "france")), text
    # Read and edited, never sent by itself.
    expect(page.locator(".message.user")).to_have_count(0)
    assert posted == ["api/transcribe"]
    assert page.errors == []  # type: ignore[attr-defined]
    page.context.close()


def test_escape_drops_a_recording(browser: Browser, speech_app: services.Service) -> None:
    page = open_page(browser, speech_app.url, viewport=PHONE, color_scheme="dark")
    posted = watch(page)
    mic = page.locator("#mic")
    expect(mic).to_have_attribute("aria-disabled", "false")
    mic.click()
    expect(page.locator("#recording")).to_be_visible()
    expect(page.locator("#recording-time")).to_contain_text("0:01")
    save_screenshot(page, "microphone-recording-phone-dark.png")
    page.keyboard.press("Escape")
    expect(mic).to_have_attribute("aria-pressed", "false")
    expect(page.locator("#recording")).to_be_hidden()
    expect(page.locator("#announcer")).to_have_text("Recording cancelled")
    page.wait_for_timeout(500)
    assert posted == [] and page.locator("#prompt").input_value() == ""
    page.context.close()


def test_a_refused_microphone_is_a_sentence(browser: Browser, speech_app: services.Service) -> None:
    page = open_page(browser, speech_app.url, allowed=False)
    expect(page.locator("#mic")).to_have_attribute("aria-disabled", "false")
    page.locator("#mic").click()
    expect(page.locator("#mic-note")).to_have_text(
        "The microphone is not allowed for this page: allow it in the browser's site settings "
        "to speak a message."
    )
    expect(page.locator("#recording")).to_be_hidden()
    page.context.close()


def test_without_a_speech_model_the_button_is_off(
    browser: Browser, live_app: services.Service
) -> None:
    sentence = "The model service has no speech model: voice input is off."
    phone: dict[str, Any] = {"viewport": PHONE, "color_scheme": "dark"}
    for options in ({}, phone):
        page = open_page(browser, live_app.url, **options)
        mic = page.locator("#mic")
        expect(mic).to_have_attribute("aria-disabled", "true")
        expect(mic).to_have_attribute("title", sentence)
        expect(page.locator("#mic-reason")).to_have_text(sentence)
        mic.click(force=True)  # aria-disabled: still focusable, it says why
        expect(page.locator("#mic-note")).to_have_text(sentence)
        expect(page.locator("#recording")).to_be_hidden()
        name = "phone-dark" if options else "desktop"
        save_screenshot(page, f"microphone-off-{name}.png")
        page.context.close()
