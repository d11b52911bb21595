"""The settings dialog, and the actions on a message: copy, regenerate, edit."""

from __future__ import annotations

import pytest
from playwright.sync_api import (
    Page,
    expect,
)

from scripts.run import services
from tests.chatapp.fake_sidecar import FakeSidecar
from tests.e2e.browser.support import CODE, chat_request, replies, reply, send
from tests.e2e.conftest import AppFactory

pytestmark = pytest.mark.browser


def test_settings_reach_the_request(start_app: AppFactory, page: Page) -> None:
    with FakeSidecar() as fake, start_app(fake.url, MAX_NEW_TOKENS_LIMIT="512") as app:
        page.goto(app.url)
        page.locator("#open-settings").click()
        dialog = page.locator("#settings-dialog")
        expect(dialog).to_be_visible()
        expect(page.locator("#setting-system")).to_be_focused()
        expect(page.locator("#setting-max-tokens")).to_have_attribute("max", "512")
        page.locator("#setting-system").fill("Answer in French.")
        page.locator("#setting-temperature").fill("0.7")
        page.locator("#setting-max-tokens").fill("513")  # above the app's limit
        page.locator("#settings-form button[type=submit]").click()
        expect(page.locator("#settings-error")).to_have_text(
            "Max reply length must be a whole number from 1 to 512, or empty."
        )
        expect(page.locator("#setting-max-tokens")).to_be_focused()
        page.locator("#setting-max-tokens").fill("64")
        page.locator("#setting-max-tokens").press("Enter")
        expect(dialog).to_be_hidden()
        expect(page.locator("#open-settings")).to_be_focused()
        expect(page.locator("#settings-summary")).to_contain_text("temperature 0.7")

        sent = chat_request(page, lambda: send(page, "Hello"))
        assert sent["messages"] == [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Hello"},
        ]
        assert sent["temperature"] == 0.7 and sent["max_new_tokens"] == 64
        expect(reply(page)).to_have_attribute("data-state", "done")
        assert fake.requests[-1]["temperature"] == 0.7  # the app passed them on
        assert fake.requests[-1]["max_new_tokens"] == 64

        # Kept per browser: after a reload, and in a new chat.
        page.reload()
        page.locator("#new-chat").click()
        sent = chat_request(page, lambda: send(page, "Again"))
        assert sent["messages"][0] == {"role": "system", "content": "Answer in French."}
        assert sent["temperature"] == 0.7 and sent["max_new_tokens"] == 64
        expect(reply(page)).to_have_attribute("data-state", "done")

        # Cancel changes nothing; Reset and Save go back to the defaults.
        page.locator("#open-settings").click()
        expect(page.locator("#setting-temperature")).to_have_value("0.7")
        page.locator("#setting-temperature").fill("1.5")
        page.keyboard.press("Escape")
        expect(dialog).to_be_hidden()
        page.locator("#open-settings").click()
        expect(page.locator("#setting-temperature")).to_have_value("0.7")
        page.locator("#settings-reset").click()
        page.locator("#settings-form button[type=submit]").click()
        sent = chat_request(page, lambda: send(page, "Defaults"))
        assert all(message["role"] != "system" for message in sent["messages"])
        assert "temperature" not in sent and "max_new_tokens" not in sent
        expect(reply(page)).to_have_attribute("data-state", "done")
        page.context.close()


def test_copy_regenerate_and_edit(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    replies(fake, f"First reply:\n\n```python\n{CODE}\n```", "Second **reply**", "Edited reply")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=app.url)
    page.goto(app.url)
    first = chat_request(page, lambda: send(page, "Write code"))
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "done")

    answer.locator("button.copy-code").click()
    expect(answer.locator("button.copy-code")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == CODE
    answer.get_by_role("button", name="Copy this reply").click()
    assert page.evaluate("navigator.clipboard.readText()") == (
        f"First reply:\n\n```python\n{CODE}\n```"
    )
    expect(page.locator("#announcer")).to_have_text("Copied to the clipboard.")

    # Regenerate: the same conversation again; the new reply replaces the old one.
    again = chat_request(page, lambda: answer.get_by_role("button", name="Regenerate").click())
    assert again == first
    expect(page.locator(".message.assistant")).to_have_count(1)
    expect(reply(page).locator("strong")).to_have_text("reply")
    expect(reply(page)).to_have_attribute("data-state", "done")

    # Edit the last message: it and its reply are replaced.
    page.get_by_role("button", name="Edit and resend your message").click()
    editor = page.locator(".edit-form textarea")
    expect(editor).to_be_focused()
    expect(editor).to_have_value("Write code")
    editor.press("Escape")  # cancel: nothing changes
    expect(page.locator(".edit-form")).to_have_count(0)
    expect(page.locator(".message.user .text")).to_have_text(["Write code"])
    page.get_by_role("button", name="Edit and resend your message").click()
    editor.fill("Write better code")
    edited = chat_request(page, lambda: editor.press("Enter"))
    assert edited["messages"] == [{"role": "user", "content": "Write better code"}]
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(page.locator(".message.user .text")).to_have_text(["Write better code"])
    expect(page.locator(".message.assistant .text")).to_have_text(["Edited reply"])
    page.reload()
    expect(page.locator(".message.user .text")).to_have_text(["Write better code"])
    expect(page.locator(".message.assistant .text")).to_have_text(["Edited reply"])
