"""Images in the page (issue 36): attached by the button, pasted, dropped; thumbnails, limits,
sent through /chat to a sidecar that reports `image_input`, shown in the message, kept over a
reload (IndexedDB), kept by Edit and Regenerate, deleted with the chat; the text-only notice.

The sidecar here is the fake (tests/chatapp/fake_sidecar.py) made to say it reads images and
to record what it received; the real vision model is in test_images_real.py."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import FilePayload, Page, expect

from scripts.run import services
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar
from tests.chatapp.image_files import (
    from_data_url,
    gradient_png,
    image_bytes,
    noise_png,
    size_of,
)
from tests.e2e.browser.support import chat_request, replies, reply, save_screenshot, send
from tests.e2e.browser.test_browser_accessibility import serious_violations
from tests.e2e.conftest import AppFactory

pytestmark = pytest.mark.browser

RED = image_bytes(40, 30, (220, 30, 30))
BLUE_JPEG = image_bytes(30, 20, (20, 40, 220), "JPEG")
GREEN = image_bytes(24, 24, (20, 160, 60))
SEEING = {**fs.READY, "image_input": True}


@pytest.fixture
def vision_app(
    fake_app: tuple[FakeSidecar, services.Service],
) -> Iterator[tuple[FakeSidecar, services.Service]]:
    """The app before a (fake) sidecar whose model reads images."""
    fake, app = fake_app
    fake.readyz = (200, SEEING)
    yield fake, app


def file_payload(name: str, mime: str, data: bytes) -> FilePayload:
    return {"name": name, "mimeType": mime, "buffer": data}


def attach_by_button(page: Page, *files: FilePayload) -> None:
    with page.expect_file_chooser() as chooser:
        page.locator("#attach").click()
    chooser.value.set_files(list(files))


# A File in a DataTransfer, as the clipboard or a drag gives it to the page.
_TRANSFER = """([name, type, b64]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], name, { type }));
  return data;
}"""


def paste(page: Page, name: str, mime: str, data: bytes) -> None:
    transfer = page.evaluate_handle(_TRANSFER, [name, mime, base64.b64encode(data).decode()])
    page.evaluate(
        """(data) => document.getElementById("prompt").dispatchEvent(
          new ClipboardEvent("paste", { clipboardData: data, bubbles: true, cancelable: true }))""",
        transfer,
    )


def drop(page: Page, name: str, mime: str, data: bytes) -> None:
    transfer = page.evaluate_handle(_TRANSFER, [name, mime, base64.b64encode(data).decode()])
    for kind in ("dragover", "drop"):
        page.dispatch_event("#composer", kind, {"dataTransfer": transfer})


def sent_images(body: dict[str, Any]) -> list[list[tuple[str, bytes]]]:
    """Per message of a /chat (or /predict) body, its images as (MIME type, bytes)."""
    result = []
    for message in body["messages"]:
        content = message["content"]
        parts = content if isinstance(content, list) else []
        result.append([from_data_url(p["image_url"]["url"]) for p in parts if p["type"] != "text"])
    return result


def text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content if part["type"] == "text")


def shown(page: Page, selector: str) -> None:
    """The image at `selector` has loaded (its pixels are there, not a broken icon)."""
    page.wait_for_function(
        "(s) => { const i = document.querySelector(s); return i?.complete && i.naturalWidth > 0 }",
        arg=selector,
    )


def kept_images(page: Page) -> int:
    """How many image files the page keeps in IndexedDB."""
    count: int = page.evaluate(
        """() => new Promise((resolve) => {
          const open = indexedDB.open("chat-images");
          open.onsuccess = () => {
            const db = open.result;
            if (!db.objectStoreNames.contains("images")) return resolve(0);
            const request = db.transaction("images").objectStore("images").count();
            request.onsuccess = () => resolve(request.result);
          };
        })"""
    )
    return count


def test_attach_by_button_send_show_and_reload(
    vision_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = vision_app
    replies(fake, "A red rectangle.", "Still red.")
    page.goto(app.url)
    expect(page.locator("#model-status")).to_contain_text("Model ready")
    attach = page.locator("#attach")
    expect(attach).to_have_attribute("aria-disabled", "false")
    expect(attach).to_have_accessible_name("Attach images")

    attach_by_button(page, file_payload("red.png", "image/png", RED))
    thumbnails = page.locator("#attachments .attachment img")
    expect(thumbnails).to_have_count(1)
    expect(thumbnails).to_have_attribute("alt", "Image 1: red.png")
    shown(page, "#attachments .attachment img")
    expect(page.locator("#attachments .remove-attachment")).to_have_accessible_name(
        "Remove image 1: red.png"
    )

    body = chat_request(page, lambda: send(page, "What is this?"))
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(reply(page).locator(".text")).to_have_text("A red rectangle.")
    # As OpenAI's content parts, the image first, the file as it was (small enough to keep).
    last = body["messages"][-1]
    assert last["role"] == "user"
    assert [part["type"] for part in last["content"]] == ["image_url", "text"]
    assert last["content"][1] == {"type": "text", "text": "What is this?"}
    assert sent_images(body)[-1] == [("image/png", RED)]
    # The sidecar got it so, as /predict's content parts.
    assert fake.paths == ["/predict"]
    assert sent_images(fake.requests[0])[-1] == [("image/png", RED)]
    assert text_of(fake.requests[0]["messages"][-1]) == "What is this?"
    expect(page.locator("#attachments .attachment")).to_have_count(0)

    # The sent message shows it; a click opens it whole, Esc gives the focus back.
    opener = page.locator(".message.user .open-image")
    expect(opener).to_have_accessible_name("Open image 1: red.png")
    shown(page, ".message.user .open-image img")
    opener.click()
    dialog = page.locator("#image-dialog")
    expect(dialog).to_be_visible()
    shown(page, "#image-full")
    assert page.evaluate("document.getElementById('image-full').naturalWidth") == 40
    expect(page.locator("#image-heading")).to_have_text("Image 1: red.png")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(opener).to_be_focused()
    save_screenshot(page, "chat-image.png")

    # A reload shows the image again (IndexedDB) and sends it again with the history.
    page.reload()
    expect(page.locator(".message.user .open-image img")).to_have_count(1)
    shown(page, ".message.user .open-image img")
    second = chat_request(page, lambda: send(page, "And now?"))
    assert sent_images(second) == [[("image/png", RED)], [], []]
    assert [text_of(m) for m in second["messages"]] == [
        "What is this?",
        "A red rectangle.",
        "And now?",
    ]
    expect(reply(page)).to_have_attribute("data-state", "done")
    assert kept_images(page) == 1


def test_paste_drop_and_remove(
    vision_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = vision_app
    replies(fake, "Two pictures.")
    page.goto(app.url)
    expect(page.locator("#model-status")).to_contain_text("Model ready")
    paste(page, "image.png", "image/png", RED)
    drop(page, "blue.jpg", "image/jpeg", BLUE_JPEG)
    drop(page, "green.png", "image/png", GREEN)
    items = page.locator("#attachments .attachment img")
    expect(items).to_have_count(3)
    alts = items.evaluate_all("(images) => images.map((image) => image.alt)")
    assert alts == ["Image 1: image.png", "Image 2: blue.jpg", "Image 3: green.png"]
    # Removed from the keyboard: the focus moves to the next remove button.
    remove = page.locator("#attachments .remove-attachment").nth(1)
    remove.focus()
    page.keyboard.press("Enter")
    expect(items).to_have_count(2)
    expect(page.locator("#attachments .remove-attachment").nth(1)).to_be_focused()
    expect(page.locator("#announcer")).to_have_text("Removed image 2: blue.jpg.")

    body = chat_request(page, lambda: send(page, "Compare them"))
    assert sent_images(body) == [[("image/png", RED), ("image/png", GREEN)]]
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(page.locator(".message.user .open-image")).to_have_count(2)


def test_an_image_alone_is_a_message(
    vision_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = vision_app
    replies(fake, "A green square.")
    page.goto(app.url)
    paste(page, "image.png", "image/png", GREEN)
    expect(page.locator("#attachments .attachment")).to_have_count(1)
    body = chat_request(page, lambda: page.locator("#send").click())
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {
                    "type": "image_url",
                    "image_url": {"url": body["messages"][0]["content"][0]["image_url"]["url"]},
                }
            ],
        }
    ]
    assert sent_images(body) == [[("image/png", GREEN)]]
    expect(reply(page)).to_have_attribute("data-state", "done")
    expect(page.locator("#chat-title")).to_have_text("Image")


def test_limits_are_checked_in_the_page(start_app: AppFactory, page: Page) -> None:
    with (
        FakeSidecar() as fake,
        start_app(fake.url, MAX_IMAGES="2", MAX_IMAGE_BYTES="100000") as app,
    ):
        fake.readyz = (200, SEEING)
        page.goto(app.url)
        expect(page.locator("body")).to_have_attribute("data-max-images", "2")
        note = page.locator("#attach-note")
        expect(note).to_be_hidden()
        # Not an image at all, though named and typed as one.
        attach_by_button(page, file_payload("notes.png", "image/png", b"just text, not a PNG"))
        expect(note).to_have_text("“notes.png” could not be read as an image.")
        attach_by_button(page, file_payload("notes.txt", "text/plain", b"hello"))
        expect(note).to_have_text("“notes.txt” is not a PNG, JPEG, WEBP or GIF image.")
        expect(page.locator("#attachments .attachment")).to_have_count(0)
        # Random pixels: no encoding brings them under 100 KB.
        attach_by_button(page, file_payload("noise.png", "image/png", noise_png(400, 400)))
        expect(note).to_contain_text("“noise.png” is larger than the 98 KB allowed for an image")
        # Three at once, two allowed: two attached, and why not the third.
        attach_by_button(
            page,
            file_payload("a.png", "image/png", RED),
            file_payload("b.png", "image/png", GREEN),
            file_payload("c.jpg", "image/jpeg", BLUE_JPEG),
        )
        expect(page.locator("#attachments .attachment")).to_have_count(2)
        expect(note).to_have_text("A message can carry up to 2 images.")
        assert fake.requests == []


@pytest.mark.parametrize(
    ("name", "mime", "sent_as", "size"),
    [
        ("wide.png", "image/png", "image/png", (2400, 1800)),  # a PNG stays PNG when it fits
        ("photo.jpg", "image/jpeg", "image/jpeg", (1800, 2400)),  # a phone's portrait photo
    ],
)
def test_a_large_image_is_made_smaller_before_it_is_sent(
    vision_app: tuple[FakeSidecar, services.Service],
    page: Page,
    name: str,
    mime: str,
    sent_as: str,
    size: tuple[int, int],
) -> None:
    fake, app = vision_app
    replies(fake, "Large.")
    page.goto(app.url)
    png = gradient_png(*size)  # 4.3 megapixels: more than the model reads
    photo = png if mime == "image/png" else image_bytes(*size, (90, 140, 60), "JPEG")
    attach_by_button(page, file_payload(name, mime, photo))
    expect(page.locator("#attachments .attachment")).to_have_count(1)
    body = chat_request(page, lambda: send(page, "Describe"))
    ((sent_mime, data),) = sent_images(body)[-1]
    assert sent_mime == sent_as
    width, height = size_of(data)
    assert width * height <= 1344 * 1344
    # The aspect ratio kept, 1,803,813 pixels.
    assert (width, height) == ((1551, 1163) if size[0] > size[1] else (1163, 1551))
    expect(reply(page)).to_have_attribute("data-state", "done")


def test_edit_and_regenerate_keep_the_images(
    vision_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = vision_app
    replies(fake, "Red.", "Still red.", "Red again.")
    page.goto(app.url)
    attach_by_button(page, file_payload("red.png", "image/png", RED))
    expect(page.locator("#attachments .attachment")).to_have_count(1)
    send(page, "Colour?")
    expect(reply(page)).to_have_attribute("data-state", "done")

    regenerated = chat_request(page, lambda: reply(page).locator(".regenerate").click())
    assert sent_images(regenerated) == [[("image/png", RED)]]
    assert text_of(regenerated["messages"][0]) == "Colour?"
    expect(reply(page).locator(".text")).to_have_text("Still red.")

    page.locator(".message.user .edit").click()
    box = page.locator("#edit-box")
    box.fill("Which colour is it?")
    edited = chat_request(page, lambda: box.press("Enter"))
    assert sent_images(edited) == [[("image/png", RED)]]
    assert text_of(edited["messages"][0]) == "Which colour is it?"
    expect(reply(page).locator(".text")).to_have_text("Red again.")
    expect(page.locator(".message.user .open-image")).to_have_count(1)
    page.reload()
    expect(page.locator(".message.user .text")).to_have_text("Which colour is it?")
    shown(page, ".message.user .open-image img")


def test_the_json_export_holds_the_images(
    vision_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = vision_app
    replies(fake, "Red.")
    page.goto(app.url)
    attach_by_button(page, file_payload("red.png", "image/png", RED))
    send(page, "Colour?")
    expect(reply(page)).to_have_attribute("data-state", "done")
    page.locator("#chat-menu summary").click()
    with page.expect_download() as download:
        page.locator("#export-json").click()
    exported = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))
    (image,) = exported["messages"][0]["images"]
    assert (image["type"], image["name"]) == ("image/png", "red.png")
    assert from_data_url(image["url"]) == ("image/png", RED)
    assert "images" not in exported["messages"][1]
    page.locator("#chat-menu summary").click()
    with page.expect_download() as download:
        page.locator("#export-markdown").click()
    markdown = Path(download.value.path()).read_text(encoding="utf-8")
    assert "## You\n\n_(image 1: red.png)_\n\nColour?" in markdown


def test_deleting_a_chat_deletes_its_images(
    vision_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = vision_app
    replies(fake, "ok")
    page.goto(app.url)
    attach_by_button(page, file_payload("red.png", "image/png", RED))
    send(page, "One")
    expect(reply(page)).to_have_attribute("data-state", "done")
    page.locator("#new-chat").click()
    paste(page, "image.png", "image/png", GREEN)
    send(page, "Two")
    expect(reply(page)).to_have_attribute("data-state", "done")
    assert _eventually(page, lambda: kept_images(page) == 2)

    page.locator("#chat-menu summary").click()
    page.locator("#delete-chat").click()
    page.locator("#delete-dialog button[type=submit]").click()
    expect(page.locator(".chat-link")).to_have_count(1)
    assert _eventually(page, lambda: kept_images(page) == 1)
    # The other chat keeps its image.
    expect(page.locator(".message.user .text")).to_have_text("One")
    shown(page, ".message.user .open-image img")


def _eventually(page: Page, check: Any, tries: int = 50) -> bool:
    """Whether `check()` becomes true, asked every 0.1 s up to `tries` times (IndexedDB
    writes end after the reply is shown)."""
    for _ in range(tries):
        if check():
            return True
        page.wait_for_timeout(100)
    return bool(check())


def test_an_image_the_browser_lost_is_said_and_left_out(
    vision_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = vision_app
    replies(fake, "ok")
    page.goto(app.url)
    attach_by_button(page, file_payload("red.png", "image/png", RED))
    send(page, "Look")
    expect(reply(page)).to_have_attribute("data-state", "done")
    paste(page, "image.png", "image/png", GREEN)  # an image alone
    expect(page.locator("#attachments .attachment")).to_have_count(1)
    page.locator("#send").click()
    expect(page.locator(".message.assistant")).to_have_count(2)
    expect(reply(page)).to_have_attribute("data-state", "done")
    assert _eventually(page, lambda: kept_images(page) == 2)
    page.evaluate(
        """() => new Promise((resolve) => {
          const open = indexedDB.open("chat-images");
          open.onsuccess = () => {
            const tx = open.result.transaction("images", "readwrite");
            tx.objectStore("images").clear();
            tx.oncomplete = () => { open.result.close(); resolve(); };
          };
        })"""
    )
    page.reload()
    missing = "Image not kept in this browser: the model no longer sees it. Attach it again."
    expect(page.locator(".message.user .missing-image")).to_have_text([missing, missing])
    body = chat_request(page, lambda: send(page, "Again"))
    # The text stays; a turn that was an image alone goes, and its reply with it.
    assert body["messages"] == [
        {"role": "user", "content": "Look"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "Again"},
    ]
    expect(reply(page)).to_have_attribute("data-state", "done")


def test_a_refused_message_gives_its_images_back(
    vision_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = vision_app
    message = "image 1 of message 1 is not an image the model can read"
    fake.predict = lambda h: fs.refuse(
        h, 400, {"error": {"message": message, "type": "invalid_image"}}
    )
    page.goto(app.url)
    attach_by_button(page, file_payload("red.png", "image/png", RED))
    send(page, "Look")
    expect(reply(page)).to_have_attribute("data-state", "error")
    expect(reply(page).locator(".text")).to_contain_text(message)
    expect(page.locator("#prompt")).to_have_value("Look")
    expect(page.locator("#attachments .attachment")).to_have_count(1)
    replies(fake, "Fine now.")
    body = chat_request(page, lambda: page.locator("#prompt").press("Enter"))
    assert sent_images(body) == [[("image/png", RED)]]
    expect(reply(page)).to_have_attribute("data-state", "done")


def test_a_text_only_model_says_so(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    fake, app = fake_app
    fake.readyz = (200, {**fs.READY, "image_input": False})
    page.goto(app.url)
    attach = page.locator("#attach")
    expect(attach).to_have_attribute("aria-disabled", "true")
    expect(attach).to_have_attribute("title", "The model reads text only: it cannot see images.")
    expect(attach).to_have_accessible_description(
        "The model reads text only: it cannot see images."
    )
    note = page.locator("#attach-note")
    attach.focus()
    page.keyboard.press("Enter")  # no file picker: the note says why
    expect(note).to_have_text("The model reads text only: it cannot see images.")
    page.evaluate("document.getElementById('attach-note').textContent = ''")
    paste(page, "image.png", "image/png", RED)
    expect(note).to_have_text("The model reads text only: it cannot see images.")
    page.evaluate("document.getElementById('attach-note').textContent = ''")
    drop(page, "image.png", "image/png", RED)
    expect(note).to_have_text("The model reads text only: it cannot see images.")
    expect(page.locator("#attachments .attachment")).to_have_count(0)
    save_screenshot(page, "chat-text-only.png")
    # A text message still goes.
    replies(fake, "Hello.")
    send(page, "Hi")
    expect(reply(page)).to_have_attribute("data-state", "done")


def test_an_app_without_images_offers_none(start_app: AppFactory, page: Page) -> None:
    with FakeSidecar() as fake, start_app(fake.url, MAX_IMAGES="0") as app:
        fake.readyz = (200, SEEING)
        page.goto(app.url)
        expect(page.locator("#model-status")).to_contain_text("Model ready")
        attach = page.locator("#attach")
        expect(attach).to_have_attribute("aria-disabled", "true")
        expect(attach).to_have_attribute("title", "This chat app does not take images.")


def test_an_unknown_capability_offers_images(
    fake_app: tuple[FakeSidecar, services.Service], page: Page
) -> None:
    """A model service that does not say (an older sidecar, most OpenAI-compatible servers):
    images are offered, and its refusal shows as the chat's error."""
    fake, app = fake_app
    message = "only content parts of type 'text' are supported"
    fake.predict = lambda h: fs.refuse(
        h, 400, {"error": {"message": message, "type": "invalid_request"}}
    )
    page.goto(app.url)
    expect(page.locator("#model-status")).to_contain_text("Model ready")
    expect(page.locator("#attach")).to_have_attribute("aria-disabled", "false")
    attach_by_button(page, file_payload("red.png", "image/png", RED))
    send(page, "Look")
    expect(reply(page)).to_have_attribute("data-state", "error")
    expect(reply(page).locator(".text")).to_contain_text(message)
    assert fake.requests[0]["messages"][0]["content"][0]["type"] == "image_url"


@pytest.mark.parametrize("width", [1100, 390], ids=["desktop", "phone"])
def test_axe_with_images(
    vision_app: tuple[FakeSidecar, services.Service], page: Page, width: int
) -> None:
    fake, app = vision_app
    replies(fake, "A red rectangle.")
    page.set_viewport_size({"width": width, "height": 800})
    page.goto(app.url)
    attach_by_button(page, file_payload("red.png", "image/png", RED))
    send(page, "What is this?")
    expect(reply(page)).to_have_attribute("data-state", "done")
    paste(page, "image.png", "image/png", GREEN)
    attach_by_button(page, file_payload("notes.txt", "text/plain", b"hello"))
    expect(page.locator("#attach-note")).to_be_visible()
    expect(page.locator("#attachments .attachment")).to_have_count(1)
    assert serious_violations(page) == []
    if width < 500:
        save_screenshot(page, "chat-image-phone.png")
    page.locator(".message.user .open-image").click()
    shown(page, "#image-full")
    assert serious_violations(page) == []
