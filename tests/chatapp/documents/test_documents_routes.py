"""The library's HTTP contract on both engines, indexing in the app's own indexer thread with
a real sidecar's /v1/embeddings: upload, progress, refusals, the hash skip, search, delete,
and another owner's ids."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from chatapp import create_app
from scripts.run.services import Service

FILES = Path(__file__).parent / "files"
# Signed in as App Service's Easy Auth signs people in (AUTH_MODE=appservice), as the accounts
# tests do: the library is the signed-in user's.
USERS = {
    name: {"X-MS-CLIENT-PRINCIPAL-ID": f"{name}-oid", "X-MS-CLIENT-PRINCIPAL-NAME": name.title()}
    for name in ("alice", "bob")
}


@pytest.fixture
def app(database_url: str, encoder_sidecar: Service, tiny_encoder_dir: Path) -> Iterator[Flask]:
    app = create_app(
        {
            "TESTING": True,
            "DATABASE_URL": database_url,
            "SIDECAR_URL": encoder_sidecar.url,
            "EMBED_MODEL": "tiny",
            "EMBED_TOKENIZER": str(tiny_encoder_dir),
            "EMBED_MAX_TOKENS": 32,
            "DOCUMENT_SEARCH": "fusion",
            "AUTH_MODE": "appservice",
        }
    )
    yield app
    app.extensions["documents"].close()
    app.extensions["store"].close()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def upload(client: FlaskClient, *names: str, user: str = "alice") -> Any:
    files = [(io.BytesIO((FILES / name).read_bytes()), name) for name in names]
    response = client.post(
        "/api/documents",
        data={"file": files},
        headers=USERS[user],
        content_type="multipart/form-data",
    )
    assert response.status_code == 202, response.get_json()
    return response.get_json()["documents"]


def settled(client: FlaskClient, user: str = "alice", timeout: float = 120) -> list[Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        documents = client.get("/api/documents", headers=USERS[user]).get_json()
        if all(d["status"] in ("ready", "failed") for d in documents["documents"]):
            return list(documents["documents"])
        time.sleep(0.1)
    raise TimeoutError(documents)


def test_upload_index_search_delete(client: FlaskClient) -> None:
    added = upload(client, "guide.md", "guide.pdf", "scanned.pdf")
    assert [(d["name"], d["status"]) for d in added] == [
        ("guide.md", "queued"),
        ("guide.pdf", "queued"),
        ("scanned.pdf", "queued"),
    ]
    documents = {d["name"]: d for d in settled(client)}
    assert documents["guide.md"]["status"] == "ready" and documents["guide.md"]["chunks"] > 0
    assert documents["guide.md"]["progress"] == 1.0 and documents["guide.md"]["error"] is None
    assert documents["scanned.pdf"]["status"] == "failed"
    assert documents["scanned.pdf"]["error"]["type"] == "no_text"
    # The same bytes again: the document already held, not a second copy.
    assert upload(client, "guide.md")[0]["id"] == documents["guide.md"]["id"]

    response = client.post(
        "/api/search",
        json={"query": "How long is the warranty?", "k": 3},
        headers=USERS["alice"],
    )
    results = response.get_json()["results"]
    assert 1 <= len(results) <= 3
    assert set(results[0]) >= {"document_id", "name", "text", "page", "score"}
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    assert any("24 months" in r["text"] for r in results)
    assert {r["page"] for r in results if r["name"] == "guide.pdf"} <= {1, 2, 3}

    pdf = documents["guide.pdf"]["id"]
    assert client.delete(f"/api/documents/{pdf}", headers=USERS["alice"]).status_code == 204
    again = client.post(
        "/api/search", json={"query": "warranty receipt", "k": 10}, headers=USERS["alice"]
    ).get_json()["results"]
    assert all(r["document_id"] != pdf for r in again)
    assert client.get(f"/api/documents/{pdf}", headers=USERS["alice"]).status_code == 404


def test_another_owner_reaches_nothing(client: FlaskClient) -> None:
    (mine,) = upload(client, "guide.txt")
    settled(client)
    bob = USERS["bob"]
    assert client.get(f"/api/documents/{mine['id']}", headers=bob).status_code == 404
    assert client.delete(f"/api/documents/{mine['id']}", headers=bob).status_code == 404
    assert client.post(f"/api/documents/{mine['id']}/retry", headers=bob).status_code == 404
    assert client.post(f"/api/documents/{mine['id']}/cancel", headers=bob).status_code == 404
    assert client.get("/api/documents", headers=bob).get_json() == {"documents": []}
    found = client.post("/api/search", json={"query": "kettle boils a litre"}, headers=bob)
    assert found.get_json() == {"results": []}
    alice = client.get(f"/api/documents/{mine['id']}", headers=USERS["alice"])
    assert alice.get_json()["status"] == "ready"


def test_nobody_signed_in_is_refused_before_anything_is_read(client: FlaskClient) -> None:
    for method, path in [
        ("GET", "/api/documents"),
        ("GET", "/api/documents/1"),
        ("DELETE", "/api/documents/1"),
        ("POST", "/api/documents/1/retry"),
    ]:
        response = client.open(path, method=method)
        assert (response.status_code, response.get_json()["error"]["type"]) == (
            401,
            "unauthenticated",
        ), path
    files = {"file": [(io.BytesIO(b"The kettle boils."), "kettle.txt")]}
    upload = client.post("/api/documents", data=files, content_type="multipart/form-data")
    assert upload.status_code == 401
    search = client.post("/api/search", json={"query": "kettle"})
    assert search.status_code == 401


def test_bad_requests_are_refused_with_a_reason(client: FlaskClient) -> None:
    alice = USERS["alice"]
    no_files = client.post(
        "/api/documents", data={}, content_type="multipart/form-data", headers=alice
    )
    assert (no_files.status_code, no_files.get_json()["error"]["type"]) == (400, "no_files")
    as_json = client.post("/api/documents", json={"file": "x"}, headers=alice)
    assert as_json.status_code == 415
    for body, kind in [
        ({"query": ""}, "invalid_query"),
        ({"query": "x", "k": 0}, "invalid_k"),
        ({"query": "x", "k": True}, "invalid_k"),
        ([], "invalid_request"),
    ]:
        response = client.post("/api/search", json=body, headers=alice)
        assert (response.status_code, response.get_json()["error"]["type"]) == (400, kind)


def test_a_file_larger_than_a_chat_body_is_taken(client: FlaskClient) -> None:
    big = ("The kettle boils a litre in three minutes. " * 4000).encode()  # ~170 KB
    response = client.post(
        "/api/documents",
        data={"file": [(io.BytesIO(big), "big.txt")]},
        content_type="multipart/form-data",
        headers=USERS["alice"],
    )
    assert response.status_code == 202, response.get_json()


def test_a_busy_database_answers_503_with_retry_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer holds SQLite's write lock past the busy timeout (16 uploads of 6 MB at
    once did): the upload is answered 503 `busy` with Retry-After, in the app's error
    envelope, not 500; sent again once the lock is free, it is taken."""
    from chatapp.store import database, vectors_sqlite

    monkeypatch.setattr(database, "SQLITE_BUSY_TIMEOUT_MS", 200)  # read at each connect
    path = tmp_path / "chatapp.db"
    app = create_app(
        {
            "TESTING": True,
            "DATABASE_URL": f"sqlite:///{path}",
            "DOCUMENT_INDEXER": "off",
            "AUTH_MODE": "appservice",
        }
    )
    client = app.test_client()
    assert client.get("/api/documents", headers=USERS["alice"]).status_code == 200
    other = vectors_sqlite.driver().connect(str(path), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's long write
    try:
        files = {"file": [(io.BytesIO(b"The kettle boils."), "kettle.txt")]}
        busy = client.post(
            "/api/documents", data=files, content_type="multipart/form-data", headers=USERS["alice"]
        )
        assert busy.status_code == 503, busy.get_json()
        assert busy.headers["Retry-After"] == "2"
        assert busy.get_json()["error"]["type"] == "busy"
    finally:
        other.execute("ROLLBACK")
        other.close()
    files = {"file": [(io.BytesIO(b"The kettle boils."), "kettle.txt")]}
    again = client.post(
        "/api/documents", data=files, content_type="multipart/form-data", headers=USERS["alice"]
    )
    assert again.status_code == 202
    assert client.get("/api/documents", headers=USERS["alice"]).get_json()["documents"][0][
        "status"
    ] in ("queued", "reading")
    app.extensions["documents"].close()
    app.extensions["store"].close()
