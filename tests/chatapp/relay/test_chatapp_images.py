"""Images through `POST /chat` (issue 36): OpenAI's content parts checked in the app, sent on
as /predict's parts or unchanged to an OpenAI-compatible server; the body limit raised for
images only; at most MAX_IMAGE_CHATS large bodies at once; the capability in /healthz."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from chatapp.relay import images
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar, chunk, sse
from tests.chatapp.image_files import data_url, image_bytes, image_part

PNG = image_bytes(8, 6)
JPEG = image_bytes(8, 6, fmt="JPEG")
GIF = image_bytes(8, 6, fmt="GIF")
WEBP = image_bytes(8, 6, fmt="WEBP")


def look(*parts: dict[str, Any], text: str = "What is this?") -> dict[str, Any]:
    """A conversation of one user turn: `parts`, then the text."""
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]}


def assert_refused(response: Any, status: int, type: str, words: str) -> None:
    assert response.status_code == status, response.get_data()
    error = response.get_json()["error"]
    assert error["type"] == type
    assert words in error["message"], error["message"]


@pytest.mark.parametrize(
    ("data", "mime"),
    [(PNG, "image/png"), (JPEG, "image/jpeg"), (GIF, "image/gif"), (WEBP, "image/webp")],
)
def test_predict_gets_the_content_parts(
    client: FlaskClient, fake: FakeSidecar, data: bytes, mime: str
) -> None:
    body = look(image_part(data_url(data, mime)))
    with client.post("/chat", json={**body, "conversation_id": "c1"}) as response:
        assert response.status_code == 200, response.get_data()
        assert list(fs.ndjson(response.get_data()))[-1]["done"] is True
    assert fake.paths == ["/predict"]
    assert fake.requests == [{**body, "cache_scope": "c1"}]


def test_text_only_turns_stay_strings_and_detail_goes_on(
    client: FlaskClient, fake: FakeSidecar
) -> None:
    """A message without images goes as its string (a sidecar from before images reads it);
    text parts alone are one string, a part per line (as the sidecar joins them); `detail` goes
    on as given."""
    part = {"type": "image_url", "image_url": {"url": data_url(PNG), "detail": "low"}}
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}],
            },
            {"role": "assistant", "content": "Hi."},
            {"role": "user", "content": [part, {"type": "text", "text": "And this?"}]},
        ]
    }
    with client.post("/chat", json=body) as response:
        assert response.status_code == 200
    sent = fake.requests[0]["messages"]
    assert [m["content"] for m in sent[:3]] == ["Be brief.", "Hel\nlo", "Hi."]
    assert sent[3]["content"] == [part, {"type": "text", "text": "And this?"}]


def test_an_image_alone_is_a_turn(client: FlaskClient, fake: FakeSidecar) -> None:
    body = {"messages": [{"role": "user", "content": [image_part(data_url(PNG))]}]}
    with client.post("/chat", json=body) as response:
        assert response.status_code == 200
    assert fake.requests[0]["messages"] == body["messages"]


def test_the_openai_upstream_passes_the_parts_through(
    make_app: Callable[..., Flask], fake: FakeSidecar
) -> None:
    fake.predict = lambda h: sse(h, [chunk("A square."), chunk(finish="stop")])
    client = make_app(UPSTREAM_API="openai").test_client()
    body = look(image_part(data_url(JPEG, "image/jpeg")), image_part(data_url(PNG)))
    with client.post("/chat", json=body) as response:
        assert response.status_code == 200
        lines = list(fs.ndjson(response.get_data()))
    assert "".join(line.get("delta", "") for line in lines) == "A square."
    assert fake.paths == ["/v1/chat/completions"]
    assert fake.requests[0]["messages"] == body["messages"]


def b64(data: bytes) -> str:
    return data_url(data).partition(",")[2]


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("https://example.com/cat.png", "fetches no address"),
        ("http://169.254.169.254/latest/meta-data", "fetches no address"),
        ("file:///etc/passwd", "fetches no address"),
        ("cat.png", "must be a data: URL"),
        (f"data:image/png,{b64(PNG)}", "must be a data: URL"),
        (f"data:image/bmp;base64,{b64(PNG)}", "PNG, JPEG, WEBP or GIF image, not image/bmp"),
        (f"data:text/plain;base64,{b64(PNG)}", "not text/plain"),
        ("data:image/png;base64,iVBORw0K$$$", "not valid base64"),
        ("data:image/png;base64,iVBORw0KG", "not valid base64"),
        ("data:image/png;base64,", "is empty"),
        (data_url(JPEG, "image/png"), "not the image/png file"),
        (data_url(b"hello, not an image", "image/gif"), "not the image/gif file"),
        (data_url(b"RIFF\x00\x00\x00\x00WAVEfmt ", "image/webp"), "not the image/webp file"),
    ],
)
def test_bad_images_are_refused_in_the_app(
    client: FlaskClient, fake: FakeSidecar, url: str, words: str
) -> None:
    response = client.post("/chat", json=look(image_part(url)))
    assert_refused(response, 400, "invalid_image", words)
    assert "Image 1 of message 1" in response.get_json()["error"]["message"]
    assert fake.requests == []


@pytest.mark.parametrize(
    ("message", "words"),
    [
        ({"role": "assistant", "content": [image_part(data_url(PNG))]}, "only your own messages"),
        ({"role": "system", "content": [image_part(data_url(PNG))]}, "only your own messages"),
        ({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}, "neither text"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {}}]}, "with a url"),
        ({"role": "user", "content": []}, "must have a text content"),
        ({"role": "user", "content": [{"type": "text", "text": " "}]}, "is empty"),
        (
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url(PNG), "detail": "max"}}
                ],
            },
            "detail must be one of auto, low, high",
        ),
        ({"role": "user", "content": [{"type": "text", "text": "nul\x00"}]}, "control characters"),
    ],
)
def test_images_where_they_cannot_be(
    client: FlaskClient, fake: FakeSidecar, message: dict[str, Any], words: str
) -> None:
    turns = [message] if message["role"] == "user" else [message, {"role": "user", "content": "Hi"}]
    if message["role"] == "assistant":
        turns = [{"role": "user", "content": "Hi"}, message, {"role": "user", "content": "So?"}]
    response = client.post("/chat", json={"messages": turns})
    assert response.status_code == 400, response.get_data()
    assert words in response.get_json()["error"]["message"]
    assert fake.requests == []


def test_too_many_images_and_too_large_an_image(
    make_app: Callable[..., Flask], fake: FakeSidecar
) -> None:
    client = make_app(MAX_IMAGES=2, MAX_IMAGE_BYTES=len(PNG)).test_client()
    part = image_part(data_url(PNG))
    turns = [look(part)["messages"][0], {"role": "assistant", "content": "ok"}]
    response = client.post("/chat", json={"messages": [*turns, look(part, part)["messages"][0]]})
    assert_refused(response, 413, "payload_too_large", "more than 2 images; start a new chat")
    larger = PNG + b"\0"  # one byte over
    response = client.post("/chat", json=look(image_part(data_url(larger))))
    assert_refused(response, 413, "payload_too_large", "is larger than the")
    with client.post("/chat", json=look(part, part)) as streamed:
        assert streamed.status_code == 200
    assert len(fake.requests) == 1


def test_an_app_without_images(make_app: Callable[..., Flask], fake: FakeSidecar) -> None:
    client = make_app(MAX_IMAGES=0).test_client()
    response = client.post("/chat", json=look(image_part(data_url(PNG))))
    assert_refused(response, 400, "invalid_image", "does not take images")
    assert 'data-max-images="0"' in client.get("/").get_data(as_text=True)


def test_the_body_limit_is_raised_for_images_only(
    make_app: Callable[..., Flask], fake: FakeSidecar
) -> None:
    """The text keeps MAX_REQUEST_BYTES; only images may make a body larger, each within its
    own bound, and the whole within the text's bound plus MAX_IMAGES images."""
    config = {"MAX_CONTENT_LENGTH": 2000, "MAX_IMAGE_BYTES": 30_000, "MAX_IMAGES": 2}
    client = make_app(**config).test_client()
    photo = image_bytes(1, 1) + b"\0" * 25_000  # a PNG's head and 25 KB
    part = image_part(data_url(photo))
    with client.post("/chat", json=look(part, part, text="x" * 1500)) as response:
        assert response.status_code == 200, response.get_data()  # about 68 KB in all
    # The same text without the images' room: over the text's bound.
    response = client.post("/chat", json=look(text="x" * 2100))
    assert_refused(response, 413, "payload_too_large", "too long to send")
    response = client.post("/chat", json=look(part, text="x" * 2100))
    assert_refused(response, 413, "payload_too_large", "too long to send")
    # Text posing as an image URL counts as an image, and is refused as one.
    fake_part = image_part("data:image/png;base64," + "A" * 20_000)
    response = client.post("/chat", json=look(fake_part))
    assert_refused(response, 400, "invalid_image", "not the image/png file")
    # A body over the whole bound is refused before it is read.
    limit = images.body_limit({**config})
    raw = json.dumps(look(text="x" * (limit + 10)))
    response = client.post("/chat", data=raw, content_type="application/json")
    assert_refused(response, 413, "payload_too_large", "too long to send")
    assert len(fake.requests) == 1


def test_large_bodies_at_once_are_bounded(
    make_app: Callable[..., Flask], fake: FakeSidecar
) -> None:
    """MAX_IMAGE_CHATS=1: while one chat with images streams, another is answered 503 busy
    with Retry-After, unread; a text-only chat goes on; once the first ends, images go again."""
    client = make_app(MAX_IMAGE_CHATS=1, MAX_CONTENT_LENGTH=1024).test_client()
    photo = image_bytes(1, 1) + b"\0" * 2000
    with_image = look(image_part(data_url(photo)))
    first = client.post("/chat", json=with_image, buffered=False)
    assert first.status_code == 200
    second = client.post("/chat", json=with_image)
    assert_refused(second, 503, "busy", "as many chats with images as it takes")
    assert second.headers["Retry-After"] == "5"
    with client.post("/chat", json={"messages": [{"role": "user", "content": "Hi"}]}) as text:
        assert text.status_code == 200
    first.close()
    with client.post("/chat", json=with_image) as third:
        assert third.status_code == 200
    assert len(fake.requests) == 3


def test_the_log_line_counts_images_and_holds_none(
    client: FlaskClient, fake: FakeSidecar, caplog: pytest.LogCaptureFixture
) -> None:
    url = data_url(PNG)
    body = look(image_part(url), image_part(url))
    with caplog.at_level(logging.INFO, logger="chatapp.request"), client.post("/chat", json=body):
        pass
    (record,) = [r for r in caplog.records if r.name == "chatapp.request"]
    fields = record.fields  # type: ignore[attr-defined]
    assert fields["images"] == 2 and fields["messages"] == 1
    assert url[30:60] not in json.dumps(fields)


@pytest.mark.parametrize(
    ("said", "shown"), [(True, True), (False, False), ("yes", None), (None, None)]
)
def test_the_capability_reaches_the_page(
    client: FlaskClient, fake: FakeSidecar, said: Any, shown: bool | None
) -> None:
    body = dict(fs.READY)
    if said is not None:
        body["image_input"] = said
    fake.readyz = (200, body)
    detail = client.get("/healthz").get_json()["sidecar"]["detail"]
    assert detail.get("image_input") == shown
    assert ("image_input" in detail) == (shown is not None)


@pytest.mark.parametrize(
    ("modalities", "shown"), [(["text", "image"], True), (["text"], False), (None, None)]
)
def test_the_openai_capability_from_the_model_list(
    make_app: Callable[..., Flask], fake: FakeSidecar, modalities: Any, shown: bool | None
) -> None:
    entry: dict[str, Any] = {"id": "vision-model", "object": "model"}
    if modalities is not None:
        entry["input_modalities"] = modalities
    fake.models = (200, {"object": "list", "data": [entry]})
    client = make_app(UPSTREAM_API="openai").test_client()
    detail = client.get("/healthz").get_json()["sidecar"]["detail"]
    assert detail["model"] == "vision-model"
    assert detail.get("image_input") == shown
    assert ("image_input" in detail) == (shown is not None)


def test_the_page_may_show_blob_images_only(client: FlaskClient) -> None:
    """The pictures a person attached are shown from object URLs (blob:); no other image
    source is allowed (data: would let a reply's markup carry one past the sanitiser's
    allow-list, were it ever to let an image through)."""
    response = client.get("/")
    policy = [p.strip() for p in response.headers["Content-Security-Policy"].split(";")]
    assert "img-src 'self' blob:" in policy
    html = response.get_data(as_text=True)
    assert 'data-max-image-bytes="5242880"' in html and 'data-max-images="4"' in html
    assert 'accept="image/png,image/jpeg,image/webp,image/gif"' in html
