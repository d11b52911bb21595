"""What the browser tests share: driving the page, the replies they script, checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from playwright.sync_api import (
    Locator,
    Page,
)

from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar

REPO = Path(__file__).resolve().parents[3]


SCREENSHOTS = REPO / "build" / "screenshots"


CHROMIUM = Path("/usr/bin/chromium")


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


def ndjson_body(*lines: bytes) -> bytes:
    return b"".join(lines)
