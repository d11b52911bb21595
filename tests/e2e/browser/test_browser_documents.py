"""The library on the page (issue 44): add a file with the picker, watch it become ready (read
by the indexer process gunicorn's master starts), ask with "Use my documents", open a
citation. Embeddings come from a real sidecar's encoder; only the chat reply is scripted (the
fake sidecar forwards /v1/embeddings to the real one), since no model cites [1] on demand."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from scripts.run import services
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar
from tests.e2e.browser.support import chat_request, reply, save_screenshot, send
from tests.e2e.conftest import AppFactory

pytestmark = pytest.mark.browser

GUIDE = Path(__file__).parents[2] / "chatapp" / "documents" / "files" / "guide.md"
REPLY = "Descale once a month with citric acid [1]. Never boil it dry [9]."


@pytest.fixture(params=["none"])
def library_app(
    request: pytest.FixtureRequest,
    encoder_sidecar: services.Service,
    tiny_encoder_dir: Path,
    start_app: AppFactory,
    tmp_path: Path,
) -> Iterator[services.Service]:
    """The app (gunicorn, its indexer process) under AUTH_MODE `request.param`."""
    with FakeSidecar() as fake:

        def answer(h: fs.Handler) -> None:
            if h.path == "/v1/embeddings":
                real = httpx.post(
                    encoder_sidecar.url + h.path,
                    content=fake.raw_bodies[-1],
                    headers={"Content-Type": "application/json"},
                    timeout=60,
                )
                fs.refuse(h, real.status_code, real.json())
            else:
                fs.reply(h, [REPLY])

        fake.predict = answer
        with start_app(
            fake.url,
            EMBED_MODEL="tiny",
            EMBED_TOKENIZER=str(tiny_encoder_dir),
            EMBED_MAX_TOKENS="32",
            DOCUMENT_SEARCH="fusion",
            DATA_DIR=str(tmp_path / "data"),
            AUTH_MODE=request.param,
        ) as app:
            yield app


def test_add_a_file_ask_and_open_a_citation(page: Page, library_app: services.Service) -> None:
    page.goto(library_app.url)
    page.locator("#open-library").click()
    page.locator("#library-input").set_input_files(str(GUIDE))
    item = page.locator(".library-item", has_text="guide.md")
    expect(item).to_have_attribute("data-status", "ready", timeout=60_000)
    expect(item).to_contain_text("passages")
    page.locator("#library-close").click()

    page.locator("#use-documents").check()
    body = chat_request(page, lambda: send(page, "How do I descale the kettle?"))
    assert body["documents"] is True
    chip = reply(page).locator("button.citation")
    expect(chip).to_have_text("1")
    expect(reply(page).locator("s.citation.unknown")).to_have_text("[9]")
    save_screenshot(page, "documents-citation.png")
    chip.click()
    dialog = page.locator("#citation-dialog")
    expect(dialog).to_be_visible()
    expect(page.locator("#citation-where")).to_contain_text("guide.md")
    expect(page.locator("#citation-text")).not_to_be_empty()
    page.locator("#citation-close").click()

    # The follow-up sends the first turn back with the passages it was given.
    follow = chat_request(page, lambda: send(page, "And the warranty?"))
    first = follow["messages"][0]
    assert first["content"] == "How do I descale the kettle?"
    assert first["grounding"].startswith("Passages from my documents:")


def _signed_in(browser: Browser, name: str) -> Page:
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    context.set_extra_http_headers(
        {"X-MS-CLIENT-PRINCIPAL-ID": f"{name}-oid", "X-MS-CLIENT-PRINCIPAL-NAME": name}
    )
    context.set_default_timeout(30_000)
    return context.new_page()


def _stored_messages(app: services.Service, name: str, chat_id: str, count: int) -> None:
    headers = {"X-MS-CLIENT-PRINCIPAL-ID": f"{name}-oid", "X-MS-CLIENT-PRINCIPAL-NAME": name}
    deadline = time.monotonic() + 30
    while True:
        chat = httpx.get(f"{app.url}/api/chats/{chat_id}", headers=headers).json()
        if len(chat["messages"]) >= count or time.monotonic() > deadline:
            assert len(chat["messages"]) == count, chat
            return
        time.sleep(0.1)


def _add_guide(page: Page) -> None:
    page.locator("#open-library").click()
    page.locator("#library-input").set_input_files(str(GUIDE))
    item = page.locator(".library-item", has_text="guide.md")
    expect(item).to_have_attribute("data-status", "ready", timeout=60_000)
    page.locator("#library-close").click()


@pytest.mark.parametrize("library_app", ["appservice"], indirect=True)
def test_a_signed_in_users_library_and_a_stored_chats_citations_and_sources(
    browser: Browser, library_app: services.Service
) -> None:
    """Signed in (server chats and the library on one page): a grounded turn goes with the
    stored chat's id; its citation chips and its sources, the uncited ones too, come back when
    the chat is opened again; another user's library is empty, and his grounded reply still
    says after a reload that no source matched."""
    alice = _signed_in(browser, "alice")
    try:
        alice.goto(library_app.url)
        expect(alice.locator("#signed-in")).to_have_text("Signed in as alice")
        _add_guide(alice)
        alice.locator("#use-documents").check()
        body = chat_request(alice, lambda: send(alice, "How do I descale the kettle?"))
        assert body["documents"] is True and isinstance(body.get("chat_id"), str)
        expect(reply(alice)).to_have_attribute("data-state", "done", timeout=60_000)
        expect(reply(alice).locator("button.citation")).to_have_text("1")
        sources = reply(alice).locator(".sources li")
        expect(sources.first).to_contain_text("guide.md")
        listed = sources.all_inner_texts()
        # The turn is stored when the response closes, just after the page saw its end.
        _stored_messages(library_app, "alice", str(body["chat_id"]), 2)
        alice.reload()  # the chat, its citations and its sources, from the server
        expect(alice.locator(".message")).to_have_count(2)
        expect(sources).to_have_count(len(listed))
        assert sources.all_inner_texts() == listed  # as the page listed them, "cited" marked
        cited = reply(alice).locator(".sources li.cited")
        expect(cited).to_have_count(1)
        expect(cited).to_contain_text("[1]")
        expect(reply(alice).locator(".sources li:not(.cited)")).to_have_count(len(listed) - 1)
        chip = reply(alice).locator("button.citation")
        expect(chip).to_have_text("1")
        chip.click()
        expect(alice.locator("#citation-where")).to_contain_text("guide.md")
    finally:
        alice.context.close()
    bob = _signed_in(browser, "bob")
    try:
        bob.goto(library_app.url)
        expect(bob.locator("#signed-in")).to_have_text("Signed in as bob")
        bob.locator("#open-library").click()
        expect(bob.locator(".library-item")).to_have_count(0)
        bob.locator("#library-close").click()
        bob.locator("#use-documents").check()
        body = chat_request(bob, lambda: send(bob, "How do I descale the kettle?"))
        expect(reply(bob)).to_have_attribute("data-state", "done", timeout=60_000)
        nothing = "No source in your documents matched"
        expect(reply(bob).locator(".sources-heading")).to_have_text(nothing)
        _stored_messages(library_app, "bob", str(body["chat_id"]), 2)
        bob.reload()
        expect(bob.locator(".message")).to_have_count(2)
        expect(reply(bob).locator(".sources-heading")).to_have_text(nothing)
        expect(reply(bob).locator(".sources li")).to_have_count(0)
    finally:
        bob.context.close()


@pytest.fixture
def slow_library_app(
    encoder_sidecar: services.Service,
    tiny_encoder_dir: Path,
    start_app: AppFactory,
    tmp_path: Path,
) -> Iterator[services.Service]:
    """The app over a sidecar that reads the grounded prompt for 3 s (its progress events, as
    the real one writes them: tests/chatapp/relay/test_chatapp_progress.py), then answers
    citing [1] (issue 54)."""
    with FakeSidecar() as fake:

        def answer(h: fs.Handler) -> None:
            if h.path == "/v1/embeddings":
                real = httpx.post(
                    encoder_sidecar.url + h.path,
                    content=fake.raw_bodies[-1],
                    headers={"Content-Type": "application/json"},
                    timeout=60,
                )
                fs.refuse(h, real.status_code, real.json())
                return
            fs.start_events(h)
            for read, left in ((0, 12.0), (410, 7.0), (820, 2.0)):
                progress = {"read": read, "total": 1000, "seconds_left": left}
                fs.write_chunk(h, fs.event_line({"progress": progress}))
                time.sleep(1.5)
            fs.write_text(h, "Descale once a month with citric acid [1].")
            fs.write_done(h, 9)
            fs.end_chunks(h)

        fake.predict = answer
        with start_app(
            fake.url,
            EMBED_MODEL="tiny",
            EMBED_TOKENIZER=str(tiny_encoder_dir),
            EMBED_MAX_TOKENS="32",
            DOCUMENT_SEARCH="fusion",
            DATA_DIR=str(tmp_path / "data"),
        ) as app:
            yield app


def test_sources_at_once_and_the_reading_visible(
    page: Page, slow_library_app: services.Service
) -> None:
    page.goto(slow_library_app.url)
    _add_guide(page)
    page.locator("#use-documents").check()
    send(page, "How do I descale the kettle?")
    sources = reply(page).locator(".sources li")
    expect(sources.first).to_contain_text("guide.md")  # before any word of the reply
    assert reply(page).locator(".text").inner_text() == ""
    count = sources.count()
    reading = reply(page).locator(".reading")
    expect(reading).to_contain_text(f"Reading {count} source")
    expect(reading).to_contain_text("% · about")
    save_screenshot(page, "documents-reading.png")
    expect(reply(page)).to_have_attribute("data-state", "done", timeout=30_000)
    expect(reading).to_have_count(0)  # gone with the first word
    expect(sources).to_have_count(count)  # kept under the reply
    cited = reply(page).locator(".sources li.cited")
    expect(cited).to_have_count(1)
    expect(cited).to_contain_text("[1]")
    save_screenshot(page, "documents-sources.png")
    page.emulate_media(color_scheme="dark")
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()  # kept in the browser's chat: the sources come back with it
    expect(page.locator(".message.assistant .sources li")).to_have_count(count)
    expect(page.locator(".message.assistant .sources li.cited")).to_have_count(1)
    save_screenshot(page, "documents-sources-phone-dark.png")


def test_a_long_question_shows_its_reading(page: Page, slow_library_app: services.Service) -> None:
    """Not grounded: the progress line says "Reading your message"."""
    page.goto(slow_library_app.url)
    send(page, "A long pasted text, read slowly.")
    expect(reply(page).locator(".reading")).to_contain_text("Reading your message · ")
    expect(reply(page).locator(".sources")).to_have_count(0)
    expect(reply(page)).to_have_attribute("data-state", "done", timeout=30_000)
    expect(reply(page).locator(".reading")).to_have_count(0)
