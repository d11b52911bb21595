"""Chats with images through the app as production runs it (gunicorn's gevent worker, its
body deadline): a body larger than MAX_REQUEST_BYTES by its image goes through, the same size
of text does not, and MAX_IMAGE_CHATS bounds the large bodies a process holds at once. The
fake sidecar records what arrived and holds a reply open on demand."""

from __future__ import annotations

import json
import threading

import httpx

from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar
from tests.chatapp.image_files import data_url, image_part, noise_png
from tests.e2e.conftest import AppFactory

PHOTO = noise_png(400, 400)  # about 480 KB: 640 KB of base64


def look(*parts: dict[str, object], text: str = "What is this?") -> dict[str, object]:
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]}


def test_an_image_body_passes_where_text_of_its_size_does_not(start_app: AppFactory) -> None:
    with FakeSidecar() as fake, start_app(fake.url, WEB_CONCURRENCY="1") as app:
        body = look(image_part(data_url(PHOTO)))
        response = httpx.post(app.url + "/chat", json=body, timeout=30)
        assert response.status_code == 200, response.text
        assert list(fs.ndjson(response.content))[-1]["done"] is True
        assert fake.requests[0]["messages"] == body["messages"]
        text = {"messages": [{"role": "user", "content": "x" * 700_000}]}
        response = httpx.post(app.url + "/chat", json=text, timeout=30)
        assert response.status_code == 413
        assert response.json()["error"]["type"] == "payload_too_large"
        assert len(fake.requests) == 1


def test_large_bodies_at_once_are_bounded_per_process(start_app: AppFactory) -> None:
    release = threading.Event()

    def hold(handler: fs.Handler) -> None:  # the first reply stays open until released
        fs.start_events(handler)
        fs.write_text(handler, "Looking")
        release.wait(20)
        fs.write_done(handler, 1)

    settings = {"WEB_CONCURRENCY": "1", "MAX_IMAGE_CHATS": "1"}
    with FakeSidecar() as fake, start_app(fake.url, **settings) as app:
        fake.predict = hold
        body = look(image_part(data_url(PHOTO)))
        with (
            httpx.Client(timeout=30) as client,
            client.stream("POST", app.url + "/chat", json=body) as first,
        ):
            assert first.status_code == 200
            lines = first.iter_lines()
            next(lines)  # the reply has started: its body is held
            second = httpx.post(app.url + "/chat", json=body, timeout=30)
            assert second.status_code == 503
            assert second.json()["error"]["type"] == "busy"
            assert second.headers["Retry-After"] == "5"
            fake.predict = lambda h: fs.reply(h, ["Hi"])
            text = httpx.post(
                app.url + "/chat",
                json={"messages": [{"role": "user", "content": "Hi"}]},
                timeout=30,
            )
            assert text.status_code == 200  # text-only chats never wait for a slot
            release.set()
            assert json.loads([line for line in lines if line][-1])["done"] is True
        third = httpx.post(app.url + "/chat", json=body, timeout=30)
        assert third.status_code == 200, third.text
        assert len(fake.requests) == 3  # the refused one never reached the sidecar
