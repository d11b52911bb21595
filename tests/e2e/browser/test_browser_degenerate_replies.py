"""Replies a small model writes when it is stuck (issue 38, finding 4): thousands of list
markers, quote markers, brackets, emphasis delimiters or backticks. Each one used to be able to
overflow marked's recursive lexer, which left the reply "streaming" for good: Send disabled,
Stop and Esc doing nothing, and the chat never stored. Now nesting is capped before marked reads
the text (markdown.js, `capNesting` and the emphasis guard) and a block that still cannot be
rendered shows as plain text, so every reply finishes."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from playwright.sync_api import (
    Page,
    expect,
)

from scripts.run import services
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar
from tests.e2e import live
from tests.e2e.browser.support import REPO, pieces, reply, save_screenshot, send

pytestmark = pytest.mark.browser

DEGENERATE = {
    "dashes": "- " * 1500,  # the issue's own: on a line of its own, one thematic break
    "stuck-list": "- " * 1500 + "and so on",  # the same run going on: 1,500 nested lists
    "quotes": ">" * 1500,
    "quotes-3k": ">" * 3000,
    "indented-lists": "\n".join(" " * (2 * level) + f"- level {level}" for level in range(55)),
    "brackets": "[" * 5000,
    "stars": "*" * 1500 + "a" + "*" * 1500,
    "underscores": "_" * 1500 + "a" + "_" * 1500,
    "emphasis": "*a " * 1000 + "b" + " a*" * 1000,
    "backticks": "`" * 3000,
}

# The deepest element in a rendered reply. Unbounded, the browser's HTML parser stops at 512;
# capped, lists and quotes nest 8 markers a line and 32 columns of indentation deep at most.
MAX_DEPTH = 48
DEPTH = """(root) => {
  const depth = (node) => Math.max(0, ...[...node.children].map(depth)) + 1;
  return depth(root) - 1;
}"""


def stored_chat(page: Page) -> dict[str, Any]:
    chat: dict[str, Any] = page.evaluate(
        """() => {
          const index = JSON.parse(localStorage.getItem("chat.v1.index"));
          return JSON.parse(localStorage.getItem("chat.v1.chat." + index.current));
        }"""
    )
    return chat


def until_stopped(text: str) -> Any:
    """The reply's text at once, then silence until the page stops it (the relay pings)."""

    def predict(h: fs.Handler) -> None:
        fs.start_events(h)
        fs.write_text(h, text)
        fs.wait_until_client_closes(h, 30)

    return predict


@pytest.mark.parametrize("name", DEGENERATE)
def test_a_degenerate_reply_finishes_stops_and_is_kept(
    fake_app: tuple[FakeSidecar, services.Service], page: Page, name: str
) -> None:
    fake, app = fake_app
    text = DEGENERATE[name]
    page.goto(app.url)
    send_button, stop_button = page.locator("#send"), page.locator("#stop")

    # Streamed to its end: the reply finishes, the page takes the next message.
    fake.predict = lambda h: fs.reply(h, pieces(text, 64), delay=0.002)
    send(page, "Write it")
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "done")
    expect(send_button).to_be_enabled()
    expect(stop_button).to_be_disabled()
    expect(answer.locator(".text > *").first).to_be_attached()  # rendered (an <hr> has no text)
    assert answer.locator(".text").evaluate(DEPTH) <= MAX_DEPTH

    # Stopped while it is being written, with the Stop button, then with Esc.
    fake.predict = until_stopped(text)
    for stop in (stop_button.click, lambda: page.keyboard.press("Escape")):
        send(page, "Again")
        answer = reply(page)
        expect(answer.locator(".text > *").first).to_be_attached()
        expect(answer).to_have_attribute("data-state", "streaming")
        expect(send_button).to_be_disabled()
        stop()
        expect(answer).to_have_attribute("data-state", "stopped")
        expect(send_button).to_be_enabled()
        expect(stop_button).to_be_disabled()
    live.wait_until(fake.client_gone.is_set, 10, "the app to drop the stopped reply")

    # Kept whole: a reload shows the chat again, each reply as it ended.
    messages = stored_chat(page)["messages"]
    assert [m["content"] for m in messages if m["role"] == "assistant"] == [text] * 3
    page.reload()
    answers = page.locator(".message.assistant")
    expect(answers).to_have_count(3)
    expect(page.locator(".message.user .text")).to_have_text(["Write it", "Again", "Again"])
    states = answers.evaluate_all("(nodes) => nodes.map((node) => node.dataset.state)")
    assert states == ["done", "stopped", "stopped"]
    for answer in answers.all():
        expect(answer.locator(".text > *").first).to_be_attached()
        assert answer.locator(".text").evaluate(DEPTH) <= MAX_DEPTH
    expect(send_button).to_be_enabled()
    if name == "stuck-list":
        save_screenshot(page, "chat-degenerate-list.png")


def test_capped_nesting_streams_as_it_renders_whole(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    """Rendered a block at a time while it streams, a degenerate reply ends with the same DOM as
    when it is rendered whole (the cap depends only on the text before each line)."""
    _, app = fake_app
    page.goto(app.url)
    samples = [
        *DEGENERATE.values(),
        "Intro\n\n" + "> " * 20 + "deep\n\nThen\n\n```\n" + "- " * 20 + "code\n```\n" + "- " * 20,
    ]
    different = page.evaluate(
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
          return different;
        }""",
        [samples, [97, 500]],
    )
    assert different == []


CAPPED = [
    # (what the model wrote, the rendered reply's text, its deepest list or quote)
    ("- " * 12 + "x", "- - - - x", 8),
    (">" * 12 + " x", ">>>> x", 8),
    ("1. " * 12 + "x", "1. 1. 1. 1. x", 8),
    ("- " * 8 + "x", "x", 8),
    ("* " * 12, "", 0),  # a thematic break, as written
    ("```\n" + "- " * 12 + "x\n" + " " * 60 + "y\n```", "- " * 12 + "x\n" + " " * 60 + "y", 0),
    ("*a " * 12 + "b" + " a*" * 12, "a a a a a a a a *a *a *a *a b a* a* a* a* a a a a a a a a", 0),
]


@pytest.mark.parametrize(("source", "shown", "nesting"), CAPPED)
def test_what_the_cap_leaves(
    fake_app: tuple[FakeSidecar, services.Service],
    page: Page,
    source: str,
    shown: str,
    nesting: int,
) -> None:
    """Eight levels are rendered; past them the markers show as the characters they are, and
    code keeps what it holds."""
    _, app = fake_app
    page.goto(app.url)
    result = page.evaluate(
        """async (source) => {
          const markdown = await import("/static/markdown.js");
          const root = document.createElement("div");
          markdown.renderMarkdown(root, source);
          let nesting = 0;
          for (const node of root.querySelectorAll("*")) {
            let depth = 0;
            for (let up = node; up !== root; up = up.parentElement) {
              if (["UL", "OL", "BLOCKQUOTE"].includes(up.tagName)) depth += 1;
            }
            nesting = Math.max(nesting, depth);
          }
          const code = root.querySelector("pre");
          return { text: (code || root).textContent.trim(), nesting, max: markdown.MAX_NESTING };
        }""",
        source,
    )
    assert result["max"] == 8
    assert (result["text"].endswith(shown), result["nesting"]) == (True, nesting), json.dumps(
        result
    )


MARKED = REPO / "main-app/chatapp/static/vendor/marked/marked.esm.js"


def faulty_marked(page: Page) -> None:
    """Serve the vendored marked with faults that no reply causes on demand any more: its lexer
    throws on a paragraph that starts with LEXFAULT (as it threw when "- - - …x" overflowed the
    stack), its renderer on a paragraph that holds PARSEFAULT."""
    source = MARKED.read_text(encoding="utf-8")
    tokenizer = re.search(r"(\w+) as Tokenizer\b", source)
    renderer = re.search(r"(\w+) as Renderer\b", source)
    assert tokenizer and renderer
    patch = f"""
;{{
  const paragraph = {tokenizer[1]}.prototype.paragraph;
  {tokenizer[1]}.prototype.paragraph = function (src) {{
    if (src.startsWith("LEXFAULT")) throw new RangeError("Maximum call stack size exceeded");
    return paragraph.call(this, src);
  }};
  const render = {renderer[1]}.prototype.paragraph;
  {renderer[1]}.prototype.paragraph = function (token) {{
    if (token.raw.includes("PARSEFAULT")) throw new Error("injected");
    return render.call(this, token);
  }};
}}
"""
    page.route(
        "**/vendor/marked/marked.esm.js*",
        lambda route: route.fulfill(
            status=200, content_type="text/javascript", body=source + patch
        ),
    )


FAULTY_REPLY = """Intro with **bold**.

LEXFAULT - - - x *not emphasis*

- a list item

PARSEFAULT *as written*

Outro."""


def test_a_block_that_cannot_be_rendered_shows_as_text(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    """A block marked fails on shows as the text the model wrote; the blocks around it stay
    Markdown, and the reply finishes and is kept."""
    fake, app = fake_app
    faulty_marked(page)
    fake.predict = lambda h: fs.reply(h, pieces(FAULTY_REPLY, 5), delay=0.005)
    page.goto(app.url)
    send(page, "Write it")
    answer = reply(page)
    for view in (answer, None):
        if view is None:  # the same reply, restored from storage
            page.reload()
            view = reply(page)
        expect(view).to_have_attribute("data-state", "done")
        expect(page.locator("#send")).to_be_enabled()
        body = view.locator(".markdown")
        expect(body.locator(".plain-text")).to_have_text(
            ["LEXFAULT - - - x *not emphasis*", "PARSEFAULT *as written*"]
        )
        expect(body.locator("strong")).to_have_text("bold")
        expect(body.locator("ul > li")).to_have_text("a list item")
        expect(body.locator("p:not(.plain-text)")).to_have_text(["Intro with bold.", "Outro."])
    assert stored_chat(page)["messages"][1]["content"] == FAULTY_REPLY
