"""The model service's state in the page: busy, restarting, down, loading."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import (
    Page,
    expect,
)

from scripts.models import make_model
from scripts.run import services
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar
from tests.e2e import live
from tests.e2e.browser.support import reply, send
from tests.e2e.conftest import AppFactory
from tests.support.engines import gated, open_gate

pytestmark = pytest.mark.browser


def test_busy_sidecar_is_retried(
    page: Page, paced_app: services.Service, paced_sidecar: services.Service
) -> None:
    body = {"messages": [{"role": "user", "content": make_model.LONG_PROMPT}]}
    started = threading.Event()
    release = threading.Event()

    def occupy() -> None:  # another user holds the only slot for a moment
        with httpx.stream("POST", paced_app.url + "/chat", json=body, timeout=30) as response:
            objs = live.lines(response)
            live.first_delta(objs)
            started.set()
            release.wait(10)

    other = threading.Thread(target=occupy)
    other.start()
    try:
        assert started.wait(10)
        page.goto(paced_app.url)
        send(page, "Hi")
        answer = reply(page)
        expect(answer).to_have_attribute("data-state", "waiting")
        expect(answer.locator(".meta")).to_contain_text("Model busy, retrying in")
        release.set()
        expect(answer).to_have_attribute("data-state", "done", timeout=20_000)
    finally:
        release.set()
        other.join()


def test_a_restarting_model_is_waited_for_and_retried(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    """The sidecar is replacing a crashed worker (503, phase restarting, Retry-After): the page
    says so, counts down and sends again, and the reply arrives."""
    fake, app = fake_app
    restarting = {
        "error": {"message": "the model is not ready", "type": "not_ready", "phase": "restarting"}
    }
    answers = [
        lambda h: fs.refuse(h, 503, restarting, {"Retry-After": "2"}),
        lambda h: fs.reply(h, ["Back again."]),
    ]
    fake.predict = lambda h: answers.pop(0)(h)
    page.goto(app.url)
    send(page, "Hello?")
    answer = reply(page)
    expect(answer.locator(".meta")).to_contain_text("Model restarting, retrying in")
    expect(answer).to_have_attribute("data-state", "done", timeout=10_000)
    expect(answer.locator(".text")).to_have_text("Back again.")


def test_sidecar_down_shows_a_sentence(page: Page, start_app: AppFactory) -> None:
    with start_app(f"http://127.0.0.1:{services.free_port()}") as app:
        page.goto(app.url)
        expect(page.locator("#model-status")).to_contain_text("Model service not reachable")
        send(page, "Hello?")
        answer = reply(page)
        expect(answer).to_have_attribute("data-state", "error")
        expect(answer.locator(".text")).to_have_text(
            "The model service is not reachable; it may be starting or stopped."
        )
        expect(page.locator(".message.user .meta")).to_contain_text("Not sent")
        expect(page.locator("#prompt")).to_have_value("Hello?")  # offered again
        expect(page.locator("#send")).to_be_enabled()
        page.context.close()  # before the app stops: no keep-alive connection to wait for


def test_model_loading_then_ready(
    page: Page, tiny_model_dir: Path, tmp_path: Path, start_app: AppFactory
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()  # the load waits for the gate, not a timer that a loaded machine outruns
    with (
        services.sidecar(
            tiny_model_dir, tmp_path / "sc.log", wait=False, env=gated(gate)
        ) as sidecar,
        start_app(sidecar.url) as app,
    ):
        services.wait_for(sidecar.url + "/healthz", sidecar.process, sidecar.log_path, 30)
        page.goto(app.url)
        expect(page.locator("#model-status")).to_contain_text("Model loading")
        send(page, "Hello")
        answer = reply(page)
        expect(answer.locator(".meta")).to_contain_text("Model loading, retrying in")
        open_gate(gate, 1)
        expect(answer).to_have_attribute("data-state", "done", timeout=30_000)
        page.context.close()
