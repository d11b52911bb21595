"""Accessibility: axe-core at desktop and phone widths, the keyboard alone, the phone layout."""

from __future__ import annotations

from typing import Literal

import pytest
from axe_playwright_python.sync_playwright import Axe  # type: ignore[import-untyped]
from playwright.sync_api import (
    Browser,
    Page,
    ViewportSize,
    expect,
)

from chatapp.relay import wire
from scripts.run import services
from tests.chatapp.fake_sidecar import FakeSidecar
from tests.e2e.browser.support import (
    CODE,
    MARKDOWN_REPLY,
    ndjson_body,
    replies,
    reply,
    save_screenshot,
    send,
)

pytestmark = pytest.mark.browser


def serious_violations(page: Page) -> list[str]:
    """axe-core's serious and critical findings (WCAG 2.1 A/AA and best practices)."""
    options = {
        "resultTypes": ["violations"],
        "runOnly": {
            "type": "tag",
            "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"],
        },
    }
    results = Axe().run(page, options=options)
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']]}"
        for v in results.response["violations"]
        if v["impact"] in ("serious", "critical")
    ]


def formatted_chat(page: Page, app: services.Service) -> None:
    """A chat with a formatted reply, a reply stopped at the length limit and a failed send."""
    page.goto(app.url)
    send(page, "How do I sort in Python?")
    expect(reply(page)).to_have_attribute("data-state", "done")
    body = ndjson_body(wire.delta("A long answer"), wire.done(3, 10.0, 5.0, finish_reason="length"))
    page.route("**/chat", lambda route: route.fulfill(status=200, body=body))
    send(page, "More")
    expect(reply(page)).to_have_attribute("data-finish-reason", "length")
    page.unroute("**/chat")


@pytest.mark.parametrize(
    ("viewport", "scheme"),
    [
        ({"width": 1100, "height": 760}, "light"),
        ({"width": 390, "height": 844}, "light"),
        ({"width": 1100, "height": 760}, "dark"),
    ],
    ids=["desktop", "phone", "desktop-dark"],
)
def test_axe_finds_no_serious_violations(
    fake_app: tuple[FakeSidecar, services.Service],
    browser: Browser,
    viewport: ViewportSize,
    scheme: Literal["light", "dark"],
) -> None:
    fake, app = fake_app
    fake.readyz = (200, {"status": "ready", "model": "Phi-3-mini-4k-instruct"})
    replies(fake, MARKDOWN_REPLY)
    phone = viewport["width"] < 500
    context = browser.new_context(viewport=viewport, color_scheme=scheme, is_mobile=phone)
    page = context.new_page()
    try:
        formatted_chat(page, app)
        assert serious_violations(page) == []
        if phone:
            page.locator("#open-sidebar").click()
            expect(page.locator("#sidebar")).to_be_visible()
            assert serious_violations(page) == []
            page.keyboard.press("Escape")
        page.locator("#chat-menu summary").click()
        expect(page.locator("#rename-chat")).to_be_visible()
        assert serious_violations(page) == []
        page.keyboard.press("Escape")
        page.locator("#open-settings").click()
        expect(page.locator("#settings-dialog")).to_be_visible()
        assert serious_violations(page) == []
        page.keyboard.press("Escape")
        if scheme == "dark":
            save_screenshot(page, "chat-dark.png")
    finally:
        context.close()


def test_keyboard_only(fake_app: tuple[FakeSidecar, services.Service], page: Page) -> None:
    fake, app = fake_app
    replies(fake, MARKDOWN_REPLY, "Second reply")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=app.url)
    page.goto(app.url)
    keyboard = page.keyboard

    # The page opens with the message box focused; the skip link (the first stop) leads back.
    expect(page.locator("#prompt")).to_be_focused()
    page.locator(".skip-link").focus()
    expect(page.locator(".skip-link")).to_be_in_viewport()
    keyboard.press("Enter")
    expect(page.locator("#prompt")).to_be_focused()
    keyboard.type("How do I sort in Python?")
    keyboard.press("Enter")
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(page.locator("#prompt")).to_be_focused()

    # Back from the message box: the reply's actions, then its blocks and code buttons.
    keyboard.press("Shift+Tab")
    expect(page.get_by_role("button", name="Regenerate this reply")).to_be_focused()
    keyboard.press("Shift+Tab")
    expect(page.get_by_role("button", name="Copy this reply")).to_be_focused()
    keyboard.press("Enter")
    expect(page.locator("#announcer")).to_have_text("Copied to the clipboard.")
    assert page.evaluate("navigator.clipboard.readText()") == MARKDOWN_REPLY
    keyboard.press("Shift+Tab")
    expect(page.locator(".markdown pre")).to_be_focused()  # scrolls sideways with arrows
    keyboard.press("Shift+Tab")
    expect(page.locator(".copy-code")).to_be_focused()
    keyboard.press("Space")
    assert page.evaluate("navigator.clipboard.readText()") == CODE

    # Edit the last message from the keyboard; Escape gives the focus back.
    page.get_by_role("button", name="Edit and resend your message").focus()
    keyboard.press("Enter")
    expect(page.locator(".edit-form textarea")).to_be_focused()
    keyboard.press("Escape")
    expect(page.get_by_role("button", name="Edit and resend your message")).to_be_focused()

    # The chat menu: open, move, act, all with keys.
    page.locator("#chat-menu summary").focus()
    keyboard.press("Enter")
    expect(page.locator("#rename-chat")).to_be_visible()
    keyboard.press("Tab")
    expect(page.locator("#rename-chat")).to_be_focused()
    keyboard.press("Enter")
    expect(page.locator("#rename-input")).to_be_focused()
    keyboard.press("Control+a")
    keyboard.type("Sorting")
    keyboard.press("Enter")
    expect(page.locator("#chat-title")).to_have_text("Sorting")
    expect(page.locator("#chat-menu summary")).to_be_focused()
    keyboard.press("Enter")
    keyboard.press("Escape")
    expect(page.locator("#rename-chat")).to_be_hidden()
    expect(page.locator("#chat-menu summary")).to_be_focused()

    # Settings: a modal dialog; Escape closes it and returns to its button.
    keyboard.press("Tab")
    expect(page.locator("#open-settings")).to_be_focused()
    keyboard.press("Enter")
    expect(page.locator("#setting-system")).to_be_focused()
    keyboard.press("Tab")
    expect(page.locator("#setting-temperature")).to_be_focused()
    keyboard.type("0.5")
    keyboard.press("Enter")
    expect(page.locator("#settings-dialog")).to_be_hidden()
    expect(page.locator("#open-settings")).to_be_focused()

    # The chat list: a new chat, then back to the first one by keyboard.
    page.locator("#new-chat").focus()
    keyboard.press("Enter")
    expect(page.locator("#prompt")).to_be_focused()
    keyboard.type("Another")
    keyboard.press("Enter")
    expect(reply(page)).to_have_attribute("data-state", "done")
    page.locator(".chat-link", has_text="Sorting").focus()
    keyboard.press("Enter")
    expect(page.locator("#chat-title")).to_have_text("Sorting")
    expect(page.locator("#prompt")).to_be_focused()


def test_phone_layout_with_a_formatted_reply(
    fake_app: tuple[FakeSidecar, services.Service], browser: Browser
) -> None:
    fake, app = fake_app
    wide = "| " + " | ".join(f"column {i}" for i in range(12)) + " |\n|" + "---|" * 12
    replies(fake, MARKDOWN_REPLY + "\n" + wide + "\n\n```\n" + "x = 1; " * 40 + "\n```\n")
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = context.new_page()
    try:
        page.goto(app.url)
        expect(page.locator("#sidebar")).to_be_hidden()
        send(page, "How do I sort in Python?")
        expect(reply(page)).to_have_attribute("data-state", "done")
        # Wide tables and code scroll inside the reply; the page itself never scrolls sideways.
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
        for control in ("#send", "#new-chat", "#open-settings", "#open-sidebar"):
            expect(page.locator(control)).to_be_in_viewport()
        save_screenshot(page, "chat-markdown-phone.png")

        # The chat list is a drawer: it opens over the page, which goes inert, and closes.
        page.locator("#open-sidebar").click()
        expect(page.locator("#sidebar")).to_be_visible()
        expect(page.locator("#open-sidebar")).to_have_attribute("aria-expanded", "true")
        expect(page.locator(".chat-link[aria-current=page]")).to_be_focused()
        assert page.evaluate("document.getElementById('main').inert") is True
        page.keyboard.press("Escape")
        expect(page.locator("#sidebar")).to_be_hidden()
        expect(page.locator("#open-sidebar")).to_be_focused()
        assert page.evaluate("document.getElementById('main').inert") is False
        page.locator("#open-sidebar").click()
        page.locator("#close-sidebar").click()
        expect(page.locator("#sidebar")).to_be_hidden()
        page.locator("#open-sidebar").click()
        expect(page.locator("#sidebar")).to_be_visible()
        page.mouse.click(370, 400)  # beside the drawer
        expect(page.locator("#sidebar")).to_be_hidden()
    finally:
        context.close()
