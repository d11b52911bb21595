"""The chat page in headless Chromium, against the real app and (mostly) the real sidecar."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from axe_playwright_python.sync_playwright import Axe  # type: ignore[import-untyped]
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Dialog,
    Locator,
    Page,
    ViewportSize,
    expect,
    sync_playwright,
)

from chatapp import wire
from scripts import make_model, services
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar
from tests.e2e import live
from tests.e2e.conftest import AppFactory
from tests.support.engines import paced

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "build" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")


# Module scope: Playwright's sync API keeps an event loop running in this thread while it is
# open, which would break asyncio.run() in every test after this module.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        message = "Debian's chromium is not at /usr/bin/chromium (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs it: a missing browser is a broken setup
        pytest.skip(message)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    def on_console(message: ConsoleMessage) -> None:
        # Error statuses (503, ...) are logged by the browser itself; anything else, such as a
        # Content-Security-Policy violation, is a defect of the page.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            errors.append(message.text)

    page.on("console", on_console)
    page.set_default_timeout(10_000)
    yield page
    context.close()
    assert errors == [], "the page logged errors"


def send(page: Page, text: str) -> None:
    page.locator("#prompt").fill(text)
    page.locator("#prompt").press("Enter")


def save_screenshot(page: Page, name: str) -> None:
    """The whole conversation: the viewport grows to the page's height for the picture (a
    full-page capture would paint the sticky header and composer in the middle)."""
    size = page.viewport_size or {"width": 1100, "height": 760}
    height = max(size["height"], page.evaluate("document.documentElement.scrollHeight"))
    page.set_viewport_size({"width": size["width"], "height": height})
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name))
    page.set_viewport_size(size)


def reply(page: Page) -> Locator:
    return page.locator(".message.assistant").last


def test_streamed_reply_and_second_turn(
    page: Page, live_app: services.Service, sidecar_service: services.Service
) -> None:
    page.goto(live_app.url)
    expect(page.locator("#model-status")).to_contain_text("Model ready")
    prompt = page.locator("#prompt")
    expect(prompt).to_be_focused()
    send(page, make_model.LONG_PROMPT)
    expect(page.locator(".message.user .text")).to_have_text(make_model.LONG_PROMPT)
    first = reply(page)
    expect(first).to_have_attribute("data-state", "done")
    expected = httpx.post(
        sidecar_service.url + "/predict",
        json={"messages": [{"role": "user", "content": make_model.LONG_PROMPT}]},
        timeout=30,
    ).text
    expect(first.locator(".text")).to_have_text(expected)
    # The page names the model as the sidecar reports it (GET /healthz "model").
    model = httpx.get(live_app.url + "/healthz", timeout=5).json()["model"]
    assert isinstance(model, str) and model
    expect(page.locator("#model-name")).to_have_text(model)
    expect(first.locator(".role")).to_have_text(model)
    expect(first.locator(".meta")).to_contain_text("tokens/s")
    expect(first.locator(".meta")).to_contain_text("first token")
    expect(prompt).to_have_value("")
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#stop")).to_be_disabled()
    save_screenshot(page, "chat.png")

    # The second turn, typed with a new line, carries the whole conversation.
    prompt.type("And")
    prompt.press("Shift+Enter")  # a new line, not a send
    prompt.type("then?")
    expect(prompt).to_have_value("And\nthen?")
    with page.expect_request("**/chat") as request_info:
        prompt.press("Enter")
    sent = json.loads(request_info.value.post_data or "")
    assert sent["messages"] == [
        {"role": "user", "content": make_model.LONG_PROMPT},
        {"role": "assistant", "content": expected},
        {"role": "user", "content": "And\nthen?"},
    ]
    assert set(sent) == {"messages", "conversation_id"}  # no settings chosen: no options
    conversation_id = sent["conversation_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", conversation_id)
    expect(page.locator(".message.user .text").last).to_have_text("And\nthen?")
    expect(reply(page)).to_have_attribute("data-state", "done")

    # New chat forgets the history, and is a new conversation.
    page.locator("#new-chat").click()
    expect(page.locator(".message")).to_have_count(0)
    expect(page.locator("#empty")).to_be_visible()
    with page.expect_request("**/chat") as request_info:
        send(page, "Hi")
    sent = json.loads(request_info.value.post_data or "")
    assert len(sent["messages"]) == 1
    assert sent["conversation_id"] != conversation_id
    expect(reply(page)).to_have_attribute("data-state", "done")


def test_phone_sized_screen(browser: Browser, live_app: services.Service) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = context.new_page()
    try:
        page.goto(live_app.url)
        send(page, make_model.LONG_PROMPT)
        expect(reply(page)).to_have_attribute("data-state", "done")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
        expect(page.locator("#send")).to_be_in_viewport()
        expect(page.locator("#new-chat")).to_be_in_viewport()  # the header stays
        save_screenshot(page, "chat-phone.png")
    finally:
        context.close()


def test_stop_stops_the_reply(
    page: Page, paced_app: services.Service, paced_sidecar: services.Service
) -> None:
    cancelled = live.metric(paced_sidecar, "sidecar_requests_total", outcome="cancelled")
    page.goto(paced_app.url)
    send(page, make_model.LONG_PROMPT)
    answer = reply(page)
    # Streaming: text shows while the reply is still being written.
    expect(answer.locator(".text")).not_to_be_empty()
    expect(answer).to_have_attribute("data-state", "streaming")
    expect(page.locator("#send")).to_be_disabled()
    page.locator("#stop").click()
    expect(answer).to_have_attribute("data-state", "stopped")
    expect(answer.locator(".meta")).to_contain_text("Stopped")
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#stop")).to_be_disabled()
    expect(page.locator("#prompt")).to_be_focused()
    live.wait_until(
        lambda: (
            live.metric(paced_sidecar, "sidecar_requests_total", outcome="cancelled")
            == cancelled + 1
        ),
        5,
        "the sidecar to cancel the generation",
    )


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
    settings = paced(pace=0.0, load_delay=2.0)
    with (
        services.sidecar(tiny_model_dir, tmp_path / "sc.log", wait=False, env=settings) as sidecar,
        start_app(sidecar.url) as app,
    ):
        services.wait_for(sidecar.url + "/healthz", sidecar.process, sidecar.log_path, 30)
        page.goto(app.url)
        expect(page.locator("#model-status")).to_contain_text("Model loading")
        send(page, "Hello")
        answer = reply(page)
        expect(answer.locator(".meta")).to_contain_text("Model loading, retrying in")
        expect(answer).to_have_attribute("data-state", "done", timeout=20_000)
        page.context.close()


@pytest.fixture
def fake_app(start_app: AppFactory) -> Iterator[tuple[FakeSidecar, services.Service]]:
    """The app in front of a fake sidecar, for replies the real model will not write."""
    with FakeSidecar() as fake, start_app(fake.url) as app:
        yield fake, app


def test_model_output_is_shown_as_text(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    hostile = ['<img src=x onerror="alert(1)">', " and <scr", "ipt>alert(2)</script> ", "&amp;"]
    fake.predict = lambda h: fs.reply(h, hostile)
    dialogs: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.goto(app.url)
    send(page, "<b>bold?</b>")
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "done")
    # Replies are Markdown: its raw HTML shows as the text it is; "&amp;" is its way to write "&".
    expect(answer.locator(".text")).to_have_text("".join(hostile).replace("&amp;", "&"))
    expect(page.locator(".message.user .text")).to_have_text("<b>bold?</b>")
    assert page.locator("#log img, #log script, #log b").count() == 0
    page.wait_for_timeout(300)
    assert dialogs == []


def test_cut_off_reply_is_marked(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    fake.predict = lambda h: fs.reply(h, ["The first half ", "and é"], end=False)
    page.goto(app.url)
    send(page, "Hi")
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "cut-off")
    expect(answer.locator(".text")).to_have_text("The first half and é")
    expect(answer.locator(".meta")).to_contain_text("Cut off")
    expect(answer.locator(".meta")).to_contain_text("stopped in the middle of the reply")
    # The part received stays in the conversation.
    fake.predict = lambda h: fs.reply(h, ["ok"])
    with page.expect_request("**/chat") as request_info:
        send(page, "Go on")
    messages: list[dict[str, Any]] = json.loads(request_info.value.post_data or "")["messages"]
    assert messages[1] == {"role": "assistant", "content": "The first half and é"}


def test_long_conversation_drops_its_oldest_turns(start_app: AppFactory, browser: Browser) -> None:
    with FakeSidecar() as fake, start_app(fake.url, MAX_REQUEST_BYTES="3000") as app:
        fake.predict = lambda h: fs.reply(h, ["é" * 400])  # 800 bytes
        context = browser.new_context()
        page = context.new_page()
        try:
            page.goto(app.url)
            for turn in range(4):
                send(page, f"Question {turn}")
                expect(reply(page)).to_have_attribute("data-state", "done")
            with page.expect_request("**/chat") as request_info:
                send(page, "Last question")
            body = request_info.value.post_data or ""
            assert len(body.encode()) <= 3000
            messages = json.loads(body)["messages"]
            assert messages[0]["role"] == "user" and messages[-1]["content"] == "Last question"
            assert 1 < len(messages) < 9
            expect(reply(page)).to_have_attribute("data-state", "done")
        finally:
            context.close()


# ---- Formatted replies, kept chats, settings, endings, accessibility -------------------------

MARKDOWN_REPLY = """## Three ways to sort

Python has **three** common ways (see [the docs](https://docs.python.org/3/howto/sorting.html)):

1. `sorted()` returns a new list
2. `list.sort()` sorts in place
3. `heapq` keeps a heap

| method | returns | stable |
|---|---|:---:|
| `sorted(xs)` | a new list | yes |
| `xs.sort()` | `None` | yes |

```python
def top(xs, n=3):
    # the n largest, largest first
    return sorted(xs, reverse=True)[:n]
```

> Tip: `key=` takes a function.
"""
CODE = (
    "def top(xs, n=3):\n    # the n largest, largest first\n    return sorted(xs, reverse=True)[:n]"
)


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def replies(fake: FakeSidecar, *texts: str) -> None:
    """The fake sidecar answers each request with the next text (the last one from then on)."""
    queue = list(texts)

    def predict(h: fs.Handler) -> None:
        fs.reply(h, [queue.pop(0) if len(queue) > 1 else queue[0]])

    fake.predict = predict


def chat_request(page: Page, action: Any) -> dict[str, Any]:
    """The JSON body of the POST /chat that `action()` makes the page send."""
    with page.expect_request("**/chat") as request_info:
        action()
    body: dict[str, Any] = json.loads(request_info.value.post_data or "")
    return body


def no_dialogs(page: Page) -> list[str]:
    dialogs: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    return dialogs


def test_markdown_reply_is_rendered_while_it_streams(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    fake.readyz = (200, {"status": "ready", "model": "Phi-3-mini-4k-instruct"})
    fake.predict = lambda h: fs.reply(h, pieces(MARKDOWN_REPLY, 6), delay=0.03)
    page.goto(app.url)
    expect(page.locator("#model-name")).to_have_text("Phi-3-mini-4k-instruct")
    send(page, "How do I sort in Python?")
    answer = reply(page)
    body = answer.locator(".markdown")
    # While the reply is written, its finished blocks are rendered once and kept: the heading
    # and paragraph seen while the list is written are the very nodes shown at the end (no
    # full re-render per piece; only the open block is rendered again).
    expect(body.locator("ol > li").first).to_be_visible()
    expect(answer).to_have_attribute("data-state", "streaming")
    heading = body.locator("h2").element_handle()
    paragraph = body.locator("p").first.element_handle()
    expect(page.locator("#announcer")).to_be_empty()  # not announced piece by piece
    expect(body.locator("ol > li")).to_have_count(3)
    expect(answer).to_have_attribute("data-state", "done")
    for node in (heading, paragraph):
        assert node.evaluate("(node) => node.isConnected && node.closest('.markdown') !== null")
    assert heading.evaluate("(node) => node.isConnected && node.closest('.markdown') !== null")
    assert heading.evaluate("(node) => node === document.querySelector('.markdown h2')")

    expect(answer.locator(".role")).to_have_text("Phi-3-mini-4k-instruct")
    expect(body.locator("h2")).to_have_text("Three ways to sort")
    expect(body.locator("strong")).to_have_text("three")
    expect(body.locator("ol > li").first).to_have_text("sorted() returns a new list")
    expect(body.locator("ol > li code").first).to_have_text("sorted()")
    expect(body.locator("table th")).to_have_text(["method", "returns", "stable"])
    expect(body.locator("table tbody tr")).to_have_count(2)
    expect(body.locator("table th[align=center]")).to_have_text("stable")
    expect(body.locator("blockquote")).to_contain_text("Tip:")
    link = body.locator("a")
    expect(link).to_have_attribute("href", "https://docs.python.org/3/howto/sorting.html")
    expect(link).to_have_attribute("target", "_blank")
    expect(link).to_have_attribute("rel", "noopener noreferrer nofollow")
    code = body.locator(".code-block")
    expect(code.locator(".code-lang")).to_have_text("python")
    expect(code.locator("pre")).to_have_text(CODE)
    expect(code.locator("code.hljs .hljs-keyword").first).to_have_text("def")
    expect(code.locator("button.copy-code")).to_have_text("Copy code")
    # Announced once, whole, when complete.
    expect(page.locator("#announcer")).to_contain_text(
        "Phi-3-mini-4k-instruct replied: Three ways to sort Python has three common ways"
    )
    expect(page.locator("#chat-title")).to_have_text("How do I sort in Python?")
    save_screenshot(page, "chat-markdown.png")


# Markdown written to get past the sanitiser: raw HTML, scriptable URLs, mutation XSS, images.
HOSTILE_MARKDOWN = (Path(__file__).parent / "hostile_markdown.md").read_text(encoding="utf-8")

CHECK_RENDERED = """(root) => {
  const bad = [];
  const allowed = new Set(["A", "BLOCKQUOTE", "BR", "CODE", "DEL", "EM", "H1", "H2", "H3", "H4",
    "H5", "H6", "HR", "LI", "OL", "P", "PRE", "S", "SPAN", "STRONG", "TABLE", "TBODY", "TD", "TH",
    "THEAD", "TR", "UL", "DIV", "BUTTON"]);
  for (const el of root.querySelectorAll("*")) {
    if (!allowed.has(el.tagName)) bad.push("tag " + el.tagName);
    if ((el.tagName === "DIV" && !el.matches(".code-block, .code-head, .table-wrap")) ||
        (el.tagName === "BUTTON" && !el.matches(".copy-code"))) bad.push("own " + el.outerHTML);
    for (const attr of el.attributes) {
      const name = attr.name.toLowerCase();
      if (name.startsWith("on") || name === "style" || name === "src" || name === "id" ||
          name.startsWith("data-") || name === "action" || name === "formaction") {
        bad.push(el.tagName + " " + name);
      }
    }
    if (el.tagName === "A" && el.hasAttribute("href")) {
      const href = el.getAttribute("href");
      if (!/^(https?|mailto):/i.test(href)) bad.push("href " + href);
      if (el.getAttribute("rel") !== "noopener noreferrer nofollow" || el.target !== "_blank") {
        bad.push("link " + el.outerHTML);
      }
    }
  }
  return bad;
}"""


def test_incremental_rendering_ends_as_a_full_render(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    """Rendered a block at a time, piece by piece, a reply ends with the same DOM as when it is
    rendered whole; and each piece costs far less than rendering the whole reply again."""
    _, app = fake_app
    page.goto(app.url)
    samples = [MARKDOWN_REPLY, HOSTILE_MARKDOWN, "- a\n- b\n\n- c\n\n  more c\n\nafter\n" * 3]
    result = page.evaluate(
        """async ([samples, steps]) => {
          const markdown = await import("/static/markdown.js");
          const different = [];
          for (const sample of samples) {
            for (const step of steps) {
              const streamed = document.createElement("div");
              const stream = new markdown.MarkdownStream(streamed);
              for (let end = step; end < sample.length; end += step) {
                stream.text = sample.slice(0, end);
                stream.render(false);
              }
              stream.finish(sample);
              const whole = document.createElement("div");
              markdown.renderMarkdown(whole, sample);
              if (streamed.innerHTML !== whole.innerHTML) {
                different.push([sample.slice(0, 20), step]);
              }
            }
          }
          const long = (samples[0] + "\\n").repeat(30);
          const target = document.createElement("div");
          const stream = new markdown.MarkdownStream(target);
          let started = performance.now();
          for (let end = 10; end < long.length; end += 10) {
            stream.text = long.slice(0, end);
            stream.render(false);
          }
          const perPiece = (performance.now() - started) / Math.floor(long.length / 10);
          started = performance.now();
          for (let i = 0; i < 20; i += 1) {
            markdown.renderMarkdown(document.createElement("div"), long);
          }
          const whole = (performance.now() - started) / 20;
          return { different, perPiece, whole };
        }""",
        [samples, [1, 3, 7, 40]],
    )
    assert result["different"] == []
    assert result["perPiece"] < result["whole"] / 5, result


def assert_rendered_safely(page: Page, dialogs: list[str]) -> None:
    for body in page.locator(".message.assistant .markdown").all():
        assert body.evaluate(CHECK_RENDERED) == []
    page.wait_for_timeout(300)  # anything scheduled (onload, autofocus, refresh) has run by now
    assert dialogs == []
    assert page.evaluate("window.__violations") == []
    assert page.evaluate("getComputedStyle(document.body).display") != "none"
    assert page.url.startswith("http://127.0.0.1")


def test_hostile_markdown_never_runs(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    fake.predict = lambda h: fs.reply(h, pieces(HOSTILE_MARKDOWN, 11), delay=0.005)
    dialogs = no_dialogs(page)
    page.add_init_script(
        "window.__violations = [];"
        "document.addEventListener('securitypolicyviolation',"
        " (e) => window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));"
    )
    page.goto(app.url)
    send(page, "Show me everything")
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "done")
    text = answer.locator(".markdown")
    # Raw HTML shows as text; links that are not http(s) lose their address.
    expect(text).to_contain_text("<script>alert('script')</script>")
    expect(text).to_contain_text("<b onmouseover=\"alert('b')\">inline</b>")
    expect(text).to_contain_text("Plain <b>entity</b>")
    expect(text.locator("pre")).to_contain_text("code <script>alert('code')</script>")
    expect(text.locator("a", has_text="image: img")).to_have_attribute(
        "href", "https://evil.test/track.png"
    )  # an image is a link to click, never loaded
    expect(text.locator("a", has_text="ok")).to_have_attribute("href", "https://example.com")
    hrefs = text.locator("a[href]").evaluate_all("(links) => links.map((a) => a.href)")
    assert sorted(hrefs) == ["https://evil.test/track.png", "https://example.com/"]
    for name in ("md js", "md JS", "md data", "vb", "relative"):
        expect(text.get_by_text(name, exact=True)).not_to_have_attribute("href", re.compile(".*"))
    assert_rendered_safely(page, dialogs)
    for link in text.locator("a:not([href])").all():
        link.click()  # nothing to follow, nothing runs
    assert_rendered_safely(page, dialogs)

    # The same reply restored from storage, and stored data made hostile by hand.
    page.evaluate(
        """() => {
        const index = JSON.parse(localStorage.getItem("chat.v1.index"));
        const id = index.chats[0].id;
        const chat = JSON.parse(localStorage.getItem("chat.v1.chat." + id));
        chat.title = "<img src=x onerror=alert('title')>";
        chat.messages.push({role: "user", content: "<img src=x onerror=alert('user')>"});
        chat.messages.push({role: "assistant", content: "<svg onload=alert('stored')>",
          ending: {state: "done", badge: "<b onclick=alert(1)>x</b>", note: "<i>n</i>"}});
        chat.messages.push({role: "system", content: "dropped"});
        localStorage.setItem("chat.v1.chat." + id, JSON.stringify(chat));
        index.chats[0].title = chat.title;
        localStorage.setItem("chat.v1.index", JSON.stringify(index));
      }"""
    )
    page.reload()
    expect(page.locator(".message.assistant")).to_have_count(2)
    expect(page.locator("#chat-title")).to_have_text("<img src=x onerror=alert('title')>")
    expect(page.locator(".chat-link")).to_have_text(["<img src=x onerror=alert('title')>"])
    expect(page.locator(".message.user .text").last).to_have_text(
        "<img src=x onerror=alert('user')>"
    )
    expect(reply(page).locator(".meta")).to_have_text("<b onclick=alert(1)>x</b><i>n</i>")
    assert page.locator("#log img, #log svg, #sidebar img, #log b, #log i").count() == 0
    assert_rendered_safely(page, dialogs)


def test_reload_restores_the_chat_and_the_list(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    replies(fake, "First **answer**", "Second answer", "Other chat answer")
    page.goto(app.url)
    expect(page.locator("#chat-list-empty")).to_be_visible()
    send(page, "First question")
    expect(reply(page)).to_have_attribute("data-state", "done")
    first = chat_request(page, lambda: send(page, "Second question"))
    expect(reply(page)).to_have_attribute("data-state", "done")

    page.reload()
    expect(page.locator(".message")).to_have_count(4)
    expect(page.locator(".message.user .text")).to_have_text(["First question", "Second question"])
    expect(page.locator(".message.assistant").first.locator("strong")).to_have_text("answer")
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(page.locator("#chat-title")).to_have_text("First question")
    expect(page.locator(".chat-link[aria-current=page]")).to_have_text("First question")
    # The restored chat goes on: the whole history, the same conversation id.
    third = chat_request(page, lambda: send(page, "Third"))
    assert [m["content"] for m in third["messages"]] == [
        "First question",
        "First **answer**",
        "Second question",
        "Second answer",
        "Third",
    ]
    assert third["conversation_id"] == first["conversation_id"]
    expect(reply(page)).to_have_attribute("data-state", "done")

    # A second chat; the list has both, the most recent first, and switches between them.
    page.locator("#new-chat").click()
    expect(page.locator("#chat-title")).to_have_text("New chat")
    other = chat_request(page, lambda: send(page, "Another topic"))
    assert other["conversation_id"] != first["conversation_id"]
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(page.locator(".chat-link")).to_have_text(["Another topic", "First question"])
    page.locator(".chat-link", has_text="First question").click()
    expect(page.locator(".message.user .text")).to_have_count(3)
    page.reload()
    expect(page.locator("#chat-title")).to_have_text("First question")
    expect(page.locator(".message.user .text")).to_have_count(3)


def test_rename_export_and_delete(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    replies(fake, "Use `sorted()`.\n\n```python\nsorted(xs)\n```")
    page.goto(app.url)
    menu = page.locator("#chat-menu summary")
    menu.click()
    expect(page.locator("#rename-chat")).to_be_disabled()  # nothing to rename yet
    menu.click()
    send(page, "How to sort?")
    expect(reply(page)).to_have_attribute("data-state", "done")

    menu.click()
    page.locator("#rename-chat").click()
    expect(page.locator("#rename-dialog")).to_be_visible()
    page.locator("#rename-input").fill("Sorting notes")
    page.locator("#rename-input").press("Enter")
    expect(page.locator("#rename-dialog")).to_be_hidden()
    expect(page.locator("#chat-title")).to_have_text("Sorting notes")
    expect(page.locator(".chat-link")).to_have_text(["Sorting notes"])

    menu.click()
    with page.expect_download() as download_info:
        page.locator("#export-json").click()
    download = download_info.value
    assert download.suggested_filename == "sorting-notes.json"
    exported = json.loads(Path(download.path()).read_text(encoding="utf-8"))
    assert exported["title"] == "Sorting notes"
    assert exported["messages"] == [
        {"role": "user", "content": "How to sort?"},
        {
            "role": "assistant",
            "content": "Use `sorted()`.\n\n```python\nsorted(xs)\n```",
            "finish_reason": "stop",  # the sidecar's done event says how it ended
        },
    ]
    assert re.fullmatch(r"[0-9a-f]{32}", exported["id"])
    menu.click()
    with page.expect_download() as download_info:
        page.locator("#export-markdown").click()
    download = download_info.value
    assert download.suggested_filename == "sorting-notes.md"
    assert Path(download.path()).read_text(encoding="utf-8") == (
        "# Sorting notes\n\n## You\n\nHow to sort?\n\n"
        "## Assistant\n\nUse `sorted()`.\n\n```python\nsorted(xs)\n```\n"
    )

    page.reload()
    expect(page.locator("#chat-title")).to_have_text("Sorting notes")
    menu.click()
    page.locator("#delete-chat").click()
    expect(page.locator("#delete-dialog")).to_contain_text("Sorting notes")
    page.locator("#delete-cancel").click()
    expect(page.locator(".chat-link")).to_have_count(1)
    menu.click()
    page.locator("#delete-chat").click()
    page.locator("#delete-dialog button[type=submit]").click()
    expect(page.locator(".chat-link")).to_have_count(0)
    expect(page.locator(".message")).to_have_count(0)
    expect(page.locator("#chat-title")).to_have_text("New chat")
    page.reload()
    expect(page.locator(".chat-link")).to_have_count(0)
    expect(page.locator(".message")).to_have_count(0)
    assert page.evaluate("Object.keys(localStorage).filter((k) => k.includes('.chat.'))") == []


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


def ndjson_body(*lines: bytes) -> bytes:
    return b"".join(lines)


def test_endings_say_why_a_reply_ended(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    _, app = fake_app
    # The app's own wire format, as chatapp.wire writes it.
    done = wire.done(64, 120.0, 9.5, finish_reason="length", prompt_tokens=300, cached_tokens=256)
    length_body = ndjson_body(
        wire.delta("The answer starts"), wire.PING, wire.delta(" and goes on"), done
    )
    stop_body = ndjson_body(wire.delta("Short."), wire.done(2, 80.0, 12.0, finish_reason="stop"))
    plain_body = ndjson_body(wire.delta("Old app."), wire.done(2, 80.0, None))
    bodies = [length_body, stop_body, plain_body]
    page.route(
        "**/chat",
        lambda route: route.fulfill(
            status=200, content_type="application/x-ndjson", body=bodies.pop(0)
        ),
    )
    page.goto(app.url)
    send(page, "Tell me everything")
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "done")
    expect(answer).to_have_attribute("data-finish-reason", "length")
    expect(answer.locator(".meta .badge")).to_have_text("Stopped at the length limit")
    expect(answer.locator(".meta")).to_contain_text("64 tokens")
    expect(answer.locator(".meta")).to_contain_text("256 of 300 prompt tokens cached")
    expect(page.locator("#announcer")).to_contain_text(
        "replied: The answer starts and goes on Stopped at the length limit."
    )
    send(page, "Short one")
    short = reply(page)
    expect(short).to_have_attribute("data-finish-reason", "stop")
    expect(short.locator(".meta .badge")).to_have_count(0)
    send(page, "Old app")
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(reply(page).locator(".meta")).to_have_text("first token 80 ms · 2 tokens")

    page.reload()  # the endings are kept with the chat
    restored = page.locator(".message.assistant").first
    expect(restored).to_have_attribute("data-finish-reason", "length")
    expect(restored.locator(".meta .badge")).to_have_text("Stopped at the length limit")


def test_a_stopped_reply_is_kept_as_stopped(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    fake.predict = lambda h: fs.reply(h, pieces("word " * 400, 5), delay=0.02)
    page.goto(app.url)
    send(page, "Go on and on")
    answer = reply(page)
    expect(answer.locator(".text")).not_to_be_empty()
    page.keyboard.press("Escape")
    expect(answer).to_have_attribute("data-state", "stopped")
    expect(answer).to_have_attribute("data-finish-reason", "cancelled")
    expect(answer.locator(".meta .badge")).to_have_text("Stopped")
    page.reload()
    expect(reply(page)).to_have_attribute("data-state", "stopped")
    expect(reply(page).locator(".meta .badge")).to_have_text("Stopped")


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


def test_a_reload_mid_reply_keeps_the_part_received(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    fake.predict = lambda h: fs.reply(h, pieces("word " * 400, 5), delay=0.02)
    page.goto(app.url)
    send(page, "Go on and on")
    expect(reply(page).locator(".text")).to_contain_text("word word word")
    page.reload()
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "cut-off")
    expect(answer.locator(".meta")).to_contain_text(
        "Cut offThe page was closed before the reply was complete."
    )
    expect(answer.locator(".text")).to_contain_text("word word word")
    expect(page.locator(".message.user .text")).to_have_text(["Go on and on"])


def test_full_storage_is_said_and_the_chat_goes_on(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    replies(fake, "Noted.")
    page.goto(app.url)
    page.evaluate(
        """() => {  // fill this origin's localStorage to its quota
        let chunk = "x".repeat(1 << 20);
        for (let i = 0; chunk.length > 16; i += 1) {
          try {
            localStorage.setItem("filler." + i, chunk);
          } catch {
            chunk = chunk.slice(chunk.length / 2);
          }
        }
      }"""
    )
    send(page, "Remember this")
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(page.locator("#storage-note")).to_contain_text("storage for the page is full")
    send(page, "And this")  # the chat itself goes on in the page
    expect(page.locator(".message.assistant[data-state=done]")).to_have_count(2)
    page.evaluate(
        "Object.keys(localStorage).filter((k) => k.startsWith('filler.'))"
        ".forEach((k) => localStorage.removeItem(k))"
    )
    send(page, "Now keep it")
    expect(page.locator(".message.assistant[data-state=done]")).to_have_count(3)
    expect(page.locator("#storage-note")).to_be_hidden()
    page.reload()
    expect(page.locator(".message.user .text")).to_have_text(
        ["Remember this", "And this", "Now keep it"]
    )
