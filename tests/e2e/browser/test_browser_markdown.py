"""Replies as Markdown: rendered while they stream, the same as a full render, and never run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import (
    Dialog,
    Page,
    expect,
)

from scripts.run import services
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar
from tests.e2e.browser.support import CODE, MARKDOWN_REPLY, pieces, reply, save_screenshot, send

pytestmark = pytest.mark.browser


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
HOSTILE_MARKDOWN = (Path(__file__).parents[1] / "hostile_markdown.md").read_text(encoding="utf-8")


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
