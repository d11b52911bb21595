"""Two app processes (gunicorn, as deployed, two workers each) on one real PostgreSQL: they
migrate an empty database once between them, and each sees the chats the other keeps, at
once, per user."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from scripts.run import services
from tests.support import postgres

ALICE = {"X-Forwarded-User": "alice"}
BOB = {"X-Forwarded-User": "bob"}


def test_two_instances_on_one_postgresql_see_the_same_chats(
    postgres_url: str, sidecar_service: services.Service, tmp_path: Path
) -> None:
    settings = {
        "DATABASE_URL": postgres.fresh_database(postgres_url),
        "AUTH_MODE": "header",
        "TRUSTED_PROXIES": "127.0.0.1",
        "WEB_CONCURRENCY": "2",
    }
    with (
        services.chatapp(sidecar_service.url, tmp_path / "one.log", env=settings) as one,
        services.chatapp(sidecar_service.url, tmp_path / "two.log", env=settings) as two,
    ):
        made = httpx.post(one.url + "/api/chats", json={"title": "from one"}, headers=ALICE)
        assert made.status_code == 201
        chat = made.json()["id"]
        listed = httpx.get(two.url + "/api/chats", headers=ALICE).json()["chats"]
        assert [c["id"] for c in listed] == [chat]
        body = {"chat_id": chat, "messages": [{"role": "user", "content": "Hi"}]}
        reply = httpx.post(
            two.url + "/chat", json={**body, "max_new_tokens": 3}, headers=ALICE, timeout=120
        )
        assert json.loads(reply.text.splitlines()[-1])["done"] is True
        opened = httpx.get(f"{one.url}/api/chats/{chat}", headers=ALICE).json()
        assert [m["role"] for m in opened["messages"]] == ["user", "assistant"]
        renamed = httpx.patch(f"{two.url}/api/chats/{chat}", json={"title": "b"}, headers=ALICE)
        assert renamed.status_code == 200
        assert httpx.get(f"{one.url}/api/chats?q=b", headers=ALICE).json()["chats"][0]["id"] == chat
        assert httpx.get(f"{two.url}/api/chats/{chat}", headers=BOB).status_code == 404
        assert httpx.delete(f"{one.url}/api/chats/{chat}", headers=ALICE).status_code == 204
        assert httpx.get(f"{two.url}/api/chats", headers=ALICE).json() == {"chats": []}
