"""Edit and Regenerate in a chat kept on the server (signed in through App Service's headers, on
the real sidecar and the tiny model): the stored chat is cut back and goes on, so after each
action and after a reload the server holds exactly what the page showed; a page whose view is
older than the server's cuts nothing and says so."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Route, expect

from scripts.run import services
from tests.e2e.browser.support import reply, send

pytestmark = pytest.mark.browser
ALICE = {"X-MS-CLIENT-PRINCIPAL-ID": "alice-oid", "X-MS-CLIENT-PRINCIPAL-NAME": "alice"}


@pytest.fixture
def alice(browser: Browser) -> Iterator[Page]:
    context: BrowserContext = browser.new_context(viewport={"width": 1100, "height": 760})
    context.set_extra_http_headers(ALICE)
    context.set_default_timeout(30_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert errors == [], "the page threw"


def streamed(page: Page, action: Callable[[], Any]) -> tuple[dict[str, Any], str]:
    """The POST /chat `action()` makes the page send, and the reply text its answer carried.
    The request goes to the app as it is (`route.fetch`) and its answer back to the page whole:
    Chromium does not keep the body of a stream the page reads for the test to read after."""
    seen: dict[str, Any] = {}

    def relay(route: Route) -> None:
        answer = route.fetch(timeout=60_000)
        seen["request"] = json.loads(route.request.post_data or "")
        seen["body"] = answer.body()
        route.fulfill(response=answer)

    page.route("**/chat", relay)
    try:
        action()
        expect(reply(page)).to_have_attribute("data-state", "done", timeout=60_000)
    finally:
        page.unroute("**/chat", relay)
    lines = [json.loads(line) for line in seen["body"].splitlines() if line.strip()]
    return seen["request"], "".join(line["delta"] for line in lines if "delta" in line)


def stored(app: services.Service, chat_id: str) -> list[tuple[str, str]]:
    chat = httpx.get(f"{app.url}/api/chats/{chat_id}", headers=ALICE).json()
    return [(m["role"], m["content"]) for m in chat["messages"]]


def test_edit_and_regenerate_in_a_server_chat_keep_what_the_page_shows(
    alice: Page, signed_in_app: services.Service
) -> None:
    app, page = signed_in_app, alice
    page.goto(app.url)
    expect(page.locator("#signed-in")).to_have_text("Signed in as alice")
    first, first_reply = streamed(page, lambda: send(page, "Walrus facts, please"))
    chat_id = first["chat_id"]
    _, second_reply = streamed(page, lambda: send(page, "And penguins?"))
    assert len(stored(app, chat_id)) == 4

    # Edit the last message: the server's copy is cut at it, and the edited turn goes on.
    page.locator(".message.user .edit").click()
    page.locator("#edit-box").fill("And seals?")

    def submit() -> None:
        page.locator("#edit-box").press("Enter")

    edited, edited_reply = streamed(page, submit)
    assert edited == {"chat_id": chat_id, "messages": [{"role": "user", "content": "And seals?"}]}
    expect(page.locator(".message")).to_have_count(4)
    expect(page.locator(".message.user .text")).to_have_text(["Walrus facts, please", "And seals?"])
    assert stored(app, chat_id) == [
        ("user", "Walrus facts, please"),
        ("assistant", first_reply),
        ("user", "And seals?"),
        ("assistant", edited_reply),
    ]

    # Regenerate the last reply: cut at its question, the question sent again.
    again, regenerated = streamed(page, lambda: reply(page).locator(".regenerate").click())
    assert again == edited
    expect(page.locator(".message")).to_have_count(4)
    assert stored(app, chat_id) == [
        ("user", "Walrus facts, please"),
        ("assistant", first_reply),
        ("user", "And seals?"),
        ("assistant", regenerated),
    ]
    assert second_reply  # the tiny model always says something

    # The stored chat is what the page showed, after a reload too; Edit is offered there.
    page.reload()
    expect(page.locator(".message")).to_have_count(4)
    expect(page.locator(".message.user .text")).to_have_text(["Walrus facts, please", "And seals?"])
    expect(page.locator(".message.user .edit")).to_have_count(1)
    expect(reply(page).locator(".regenerate")).to_have_count(1)
    _, after_reload = streamed(page, lambda: reply(page).locator(".regenerate").click())
    assert stored(app, chat_id)[-1] == ("assistant", after_reload)
    assert len(stored(app, chat_id)) == 4


def test_a_page_older_than_the_server_cuts_nothing_and_says_so(
    alice: Page, signed_in_app: services.Service
) -> None:
    app, page = signed_in_app, alice
    page.goto(app.url)
    first, _ = streamed(page, lambda: send(page, "Walrus facts, please"))
    chat_id = first["chat_id"]
    # Another tab goes on with the chat: this page's view is now older than the server's.
    elsewhere = httpx.post(
        f"{app.url}/chat",
        json={"chat_id": chat_id, "messages": [{"role": "user", "content": "From another tab"}]},
        headers=ALICE,
        timeout=60,
    )
    assert elsewhere.status_code == 200
    assert json.loads(elsewhere.text.splitlines()[-1])["done"] is True
    before = stored(app, chat_id)
    assert len(before) == 4
    reply(page).locator(".regenerate").click()
    expect(reply(page)).to_contain_text("changed elsewhere", timeout=15_000)
    expect(page.locator("#prompt")).to_have_value("Walrus facts, please")  # offered again
    assert stored(app, chat_id) == before


def test_a_chat_with_a_system_message_the_page_does_not_show_is_cut_at_the_right_place(
    alice: Page, signed_in_app: services.Service
) -> None:
    """An API client's chat may hold a system message the page leaves out: the page names its
    messages by the server's positions all the same."""
    app, page = signed_in_app, alice
    turns = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Walrus facts, please"},
        {"role": "assistant", "content": "They are big."},
    ]
    made = httpx.post(f"{app.url}/api/chats", json={"messages": turns}, headers=ALICE)
    assert made.status_code == 201
    chat_id = made.json()["id"]
    page.goto(app.url)
    expect(page.locator(".message")).to_have_count(2)
    _, regenerated = streamed(page, lambda: reply(page).locator(".regenerate").click())
    assert stored(app, chat_id) == [
        ("system", "Be brief."),
        ("user", "Walrus facts, please"),
        ("assistant", regenerated),
    ]
    page.locator(".message.user .edit").click()
    page.locator("#edit-box").fill("Seal facts")
    _, edited = streamed(page, lambda: page.locator("#edit-box").press("Enter"))
    assert stored(app, chat_id) == [
        ("system", "Be brief."),
        ("user", "Seal facts"),
        ("assistant", edited),
    ]
