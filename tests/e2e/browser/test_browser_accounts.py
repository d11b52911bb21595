"""The page signed in as two users (App Service's Easy Auth headers, injected by Playwright as
the platform's front end would add them): chats come from the server, per user; list, open,
rename, search and delete go through it; the browser's own chats are offered for import."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Route, expect

from scripts.run import services
from tests.e2e.browser.support import chat_request, reply, send

pytestmark = pytest.mark.browser


def principal(name: str) -> dict[str, str]:
    return {"X-MS-CLIENT-PRINCIPAL-ID": f"{name}-oid", "X-MS-CLIENT-PRINCIPAL-NAME": name}


def _context(browser: Browser, name: str) -> BrowserContext:
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    context.set_extra_http_headers(principal(name))
    context.set_default_timeout(30_000)
    return context


def _server_chats(app: services.Service, name: str, query: str = "") -> list[dict[str, str]]:
    url = f"{app.url}/api/chats" + (f"?q={query}" if query else "")
    chats: list[dict[str, str]] = httpx.get(url, headers=principal(name)).json()["chats"]
    return chats


def _ask(page: Page, text: str) -> dict[str, object]:
    body = chat_request(page, lambda: send(page, text))
    expect(reply(page)).to_have_attribute("data-state", "done", timeout=60_000)
    return body


def test_two_users_each_see_only_their_own_chats(
    browser: Browser, signed_in_app: services.Service
) -> None:
    app = signed_in_app
    alice_context, bob_context = _context(browser, "alice"), _context(browser, "bob")
    alice, bob = alice_context.new_page(), bob_context.new_page()
    try:
        alice.goto(app.url)
        expect(alice.locator("#signed-in")).to_have_text("Signed in as alice")
        first = _ask(alice, "Walrus facts, please")
        # Only the new message goes, with the chat's id: the server keeps the rest.
        assert first["messages"] == [{"role": "user", "content": "Walrus facts, please"}]
        chat_id = first["chat_id"]
        second = _ask(alice, "And penguins?")
        assert second["chat_id"] == chat_id and len(second["messages"]) == 1  # type: ignore[arg-type]
        expect(alice.locator(".chat-link")).to_have_text(["Walrus facts, please"])

        bob.goto(app.url)
        expect(bob.locator("#signed-in")).to_have_text("Signed in as bob")
        expect(bob.locator("#chat-list-empty")).to_be_visible()
        bob.locator("#chat-search-input").fill("walrus")
        expect(bob.locator(".chat-link")).to_have_count(0)
        bob.locator("#chat-search-input").fill("")
        _ask(bob, "Bob's own question")
        expect(bob.locator(".chat-link")).to_have_text(["Bob's own question"])

        # Alice's chat comes back from the server after a reload, turns and all.
        alice.reload()
        expect(alice.locator(".message")).to_have_count(4)
        expect(alice.locator(".message.user .text")).to_have_text(
            ["Walrus facts, please", "And penguins?"]
        )
        expect(alice.locator(".chat-link")).to_have_text(["Walrus facts, please"])
        alice.locator("#chat-search-input").fill("penguin")
        expect(alice.locator(".chat-link")).to_have_text(["Walrus facts, please"])
        alice.locator("#chat-search-input").fill("bob")
        expect(alice.locator(".chat-link")).to_have_count(0)
        alice.locator("#chat-search-input").fill("")
        expect(alice.locator(".chat-link")).to_have_count(1)

        # Rename and delete go to the server.
        alice.locator("#chat-menu summary").click()
        alice.locator("#rename-chat").click()
        alice.locator("#rename-input").fill("Sea animals")
        alice.locator("#rename-input").press("Enter")
        expect(alice.locator("#chat-title")).to_have_text("Sea animals")
        _wait_for(lambda: [c["title"] for c in _server_chats(app, "alice")] == ["Sea animals"])
        assert [c["title"] for c in _server_chats(app, "bob")] == ["Bob's own question"]
        alice.locator("#chat-menu summary").click()
        alice.locator("#delete-chat").click()
        expect(alice.locator("#delete-text")).to_contain_text("removed from your account")
        alice.locator("#delete-form button[type=submit]").click()
        _wait_for(lambda: _server_chats(app, "alice") == [])
        assert len(_server_chats(app, "bob")) == 1
        assert (
            httpx.get(f"{app.url}/api/chats/{chat_id}", headers=principal("bob")).status_code == 404
        )
    finally:
        alice_context.close()
        bob_context.close()


def test_the_browsers_own_chats_are_offered_for_import_once(
    browser: Browser, signed_in_app: services.Service
) -> None:
    app = signed_in_app
    context = _context(browser, "carol")
    page = context.new_page()
    try:
        page.goto(app.url)
        kept = {
            "id": "0123456789abcdef0123456789abcdef",
            "title": "From before",
            "renamed": True,
            "created": 1700000000000,
            "updated": 1700000005000,
            "messages": [
                {"role": "user", "content": "An old question"},
                {
                    "role": "assistant",
                    "content": "An old answer",
                    "ending": {"state": "done", "note": "", "badge": "", "finish_reason": "stop"},
                },
            ],
        }
        index = {
            "current": kept["id"],
            "chats": [{"id": kept["id"], "title": "From before", "updated": kept["updated"]}],
        }
        page.evaluate(
            "([chat, index]) => {"
            " localStorage.setItem(`chat.v1.chat.${chat.id}`, JSON.stringify(chat));"
            " localStorage.setItem('chat.v1.index', JSON.stringify(index)); }",
            [kept, index],
        )
        page.reload()
        expect(page.locator("#import-text")).to_contain_text("1 chat from before you signed in")
        page.locator("#import-chats").click()
        expect(page.locator("#import-offer")).to_be_hidden()
        expect(page.locator(".chat-link")).to_have_text(["From before"])
        stored = _server_chats(app, "carol")
        assert [c["title"] for c in stored] == ["From before"]
        opened = httpx.get(f"{app.url}/api/chats/{stored[0]['id']}", headers=principal("carol"))
        assert [(m["role"], m["content"], m.get("finish")) for m in opened.json()["messages"]] == [
            ("user", "An old question", None),
            ("assistant", "An old answer", "stop"),
        ]
        page.locator(".chat-link").click()
        expect(page.locator(".message.user .text")).to_have_text(["An old question"])
        page.reload()  # asked once: not offered again
        expect(page.locator(".chat-link")).to_have_count(1)
        expect(page.locator("#import-offer")).to_be_hidden()
    finally:
        context.close()


def _wait_for(condition: object, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError("the server never showed the change")


def test_a_message_sent_while_the_page_is_still_opening_is_sent_once_it_has(
    browser: Browser, signed_in_app: services.Service
) -> None:
    """Enter pressed before GET /api/me has answered (the page has no chat open yet) waits for
    the page instead of throwing: the message goes, into a chat kept on the server."""
    app = signed_in_app
    context = _context(browser, "alice")
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    held: list[Route] = []
    page.route("**/api/me", lambda route: held.append(route))
    try:
        page.goto(app.url, wait_until="commit")
        while not held:  # the page's listeners are in place before it asks who this is
            page.wait_for_timeout(50)
        send(page, "Walrus facts, please")
        expect(page.locator(".message")).to_have_count(0)  # nothing open to send it in yet
        expect(page.locator("#prompt")).to_have_value("Walrus facts, please")
        body = chat_request(page, held[0].continue_)
        assert body["messages"] == [{"role": "user", "content": "Walrus facts, please"}]
        expect(reply(page)).to_have_attribute("data-state", "done", timeout=60_000)
        expect(page.locator("#prompt")).to_have_value("")
        chats = _server_chats(app, "alice")
        assert [chat["id"] for chat in chats] == [body["chat_id"]]
    finally:
        context.close()
    assert errors == [], "the page threw"
