"""The chat app under gunicorn against hostile requests, and with the sidecar's API key: every
case answers a 4xx in the one envelope or a correct reply (the hardening issue's cases)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import requests

from scripts.run import services
from tests.e2e.conftest import AppFactory

NESTED = "[" * 10_000 + "]" * 10_000


def raw_http(url: str, request: bytes) -> str:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
    return b"".join(chunks).decode("latin-1")


def test_2_deeply_nested_json_is_a_400(live_app: services.Service) -> None:
    response = httpx.post(
        live_app.url + "/chat", content=NESTED, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "The request's JSON is nested too deeply.",
        "type": "invalid_request",
    }


def test_4_a_garbage_chunk_size_is_a_400(live_app: services.Service) -> None:
    request = (
        b"POST /chat HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
    )
    answer = raw_http(live_app.url, request)
    assert answer.startswith("HTTP/1.1 400"), answer[:300]
    assert "Traceback" not in answer and "Traceback" not in live_app.log()


def test_7_the_reply_says_its_charset(live_app: services.Service) -> None:
    """The requests library decodes by the declared charset (it guessed wrongly without it)."""
    body = {"messages": [{"role": "user", "content": "Café, 你好, 🎉"}], "max_new_tokens": 24}
    response = requests.post(live_app.url + "/chat", json=body, timeout=60)
    assert response.headers["content-type"] == "application/x-ndjson; charset=utf-8"
    assert response.encoding == "utf-8"
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert lines[-1]["done"] is True
    text = "".join(line.get("delta", "") for line in lines)
    assert text.encode("utf-8").decode("utf-8") == text and "\ufffd" not in text


@pytest.mark.parametrize("path", ["/static//chat.js", "//static/chat.js", "/static/./chat.js"])
def test_8_a_forged_host_is_never_redirected_to(live_app: services.Service, path: str) -> None:
    answer = raw_http(
        live_app.url,
        f"GET {path} HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n".encode(),
    )
    assert "evil.example" not in answer
    assert not answer.startswith(("HTTP/1.1 301", "HTTP/1.1 302", "HTTP/1.1 307", "HTTP/1.1 308"))


def test_8_allowed_hosts(start_app: AppFactory, sidecar_service: services.Service) -> None:
    with start_app(sidecar_service.url, ALLOWED_HOSTS="127.0.0.1,*.example.com") as app:
        assert httpx.get(app.url + "/", timeout=10).status_code == 200
        ok = httpx.get(app.url + "/", headers={"host": "chat.example.com"}, timeout=10)
        assert ok.status_code == 200
        # Host names are case-insensitive (issue 25: an upper-case Host was refused).
        for host in ("CHAT.EXAMPLE.COM", "Chat.Example.com:8080"):
            ok = httpx.get(app.url + "/", headers={"host": host}, timeout=10)
            assert ok.status_code == 200, host
        for host in ("evil.test", "evil.com#.example.com", "evil.com/.example.com", "localhost"):
            refused = httpx.get(app.url + "/", headers={"host": host}, timeout=10)
            assert refused.status_code == 400
            assert refused.json()["error"]["type"] == "invalid_host"
        # The probes answer any name (issue 58: a Kubernetes probe asks by the pod's address).
        assert httpx.get(app.url + "/healthz", headers={"host": "evil.test"}).status_code == 200


@pytest.fixture(scope="module")
def keyed_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-keyed.log"
    with services.sidecar(tiny_model_dir, log, API_KEY="k-1,k-2") as service:
        yield service


def test_10_the_app_sends_the_sidecars_key(
    start_app: AppFactory, keyed_sidecar: services.Service
) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_new_tokens": 4}
    with start_app(keyed_sidecar.url, SIDECAR_API_KEY="k-2") as app:
        response = httpx.post(app.url + "/chat", json=body, timeout=60)
        assert response.status_code == 200
        assert json.loads(response.text.splitlines()[-1])["done"] is True
    with start_app(keyed_sidecar.url) as app:
        refused = httpx.post(app.url + "/chat", json=body, timeout=60)
        assert refused.status_code == 502
        assert refused.json()["error"]["type"] == "upstream_unauthorized"
        assert "SIDECAR_API_KEY" in refused.json()["error"]["message"]


# -- issue 25: misconfigurations name the real cause ---------------------------------------------

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_new_tokens": 4}


def test_a_wrong_key_makes_the_apps_healthz_not_ready(
    start_app: AppFactory, keyed_sidecar: services.Service
) -> None:
    # The sidecar's /readyz is open to probes: the app's /healthz said ready while every chat
    # was refused.
    with start_app(keyed_sidecar.url, SIDECAR_API_KEY="wrong") as app:
        health = httpx.get(app.url + "/healthz", timeout=10).json()
        assert health["sidecar"]["ready"] is False
        assert health["sidecar"]["error"] == "upstream_unauthorized"
        assert health["sidecar"]["detail"]["phase"] == "failed"
    with start_app(keyed_sidecar.url, SIDECAR_API_KEY="k-1") as app:
        assert httpx.get(app.url + "/healthz", timeout=10).json()["sidecar"]["ready"] is True


def test_an_openai_mode_app_without_its_key_says_so(
    start_app: AppFactory, keyed_sidecar: services.Service
) -> None:
    # It said the server "lists no model".
    with start_app(keyed_sidecar.url, UPSTREAM_API="openai") as app:
        refused = httpx.post(app.url + "/chat", json=CHAT, timeout=60)
        assert refused.status_code == 502
        assert refused.json()["error"]["type"] == "upstream_unauthorized"
        assert "UPSTREAM_API_KEY" in refused.json()["error"]["message"]


@pytest.fixture(scope="module")
def host_bound_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-hosts.log"
    with services.sidecar(
        tiny_model_dir, log, ALLOWED_HOSTS="sidecar.internal,127.0.0.1"
    ) as service:
        yield service


@pytest.mark.parametrize("api", ["predict", "openai"])
def test_a_sidecar_allowed_hosts_mismatch_is_not_blamed_on_the_user(
    start_app: AppFactory, host_bound_sidecar: services.Service, api: str
) -> None:
    # The app reaches the sidecar as "localhost", which its ALLOWED_HOSTS does not name: a 400
    # that blamed the conversation reached the page.
    url = host_bound_sidecar.url.replace("127.0.0.1", "localhost")
    with start_app(url, UPSTREAM_API=api, UPSTREAM_MODEL="tiny") as app:
        refused = httpx.post(app.url + "/chat", json=CHAT, timeout=60)
        assert refused.status_code == 502
        error = refused.json()["error"]
        assert error["type"] == "upstream_error" and "ALLOWED_HOSTS" in error["message"]
