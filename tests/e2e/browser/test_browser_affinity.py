"""ARR affinity (infra/main.bicep, clientAffinityEnabled): App Service's front end keeps a
browser on one instance by a cookie, so the page's requests must carry it: a chat's next turn
then reaches the sidecar that holds its KV cache. Checked through a stand-in for the front end
(front_end.py) that sets the cookie, HttpOnly, and records what each request carried."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from scripts.run import services
from tests.e2e.browser.front_end import AFFINITY, FrontEnd
from tests.e2e.browser.support import reply, send

pytestmark = pytest.mark.browser


def test_the_pages_chats_and_polls_carry_the_affinity_cookie(
    page: Page, live_app: services.Service
) -> None:
    with FrontEnd(live_app.url) as front:
        page.goto(front.url)
        expect(page.locator("#model-status")).to_contain_text("Model ready")
        send(page, "Hello")
        expect(reply(page)).to_have_attribute("data-state", "done")
        send(page, "And again")
        expect(reply(page)).to_have_attribute("data-state", "done")
        page.context.close()  # before the front end stops: no keep-alive connection left
    sent = front.requests
    assert sent[0].path == "/" and AFFINITY not in sent[0].cookie  # the cookie came from us
    cookie = f"{AFFINITY}={front.instance}"
    chats = [r for r in sent if (r.method, r.path) == ("POST", "/chat")]
    assert len(chats) == 2
    assert all(cookie in r.cookie.split("; ") for r in chats), chats
    polls = [r for r in sent if r.path == "/healthz"]
    assert polls and all(cookie in r.cookie.split("; ") for r in polls), polls
