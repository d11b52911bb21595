"""Writes only the page can make: a state-changing request that a browser says comes from
another site is refused 403 `cross_site`; the page's own requests and scripts without the
headers go through."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from flask import Flask

from chatapp.accounts.cross_site import is_cross_site

WRITES = [("POST", "/api/chats"), ("PATCH", "/api/chats/x"), ("DELETE", "/api/chats/x")]


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example"},
        {"Origin": "http://localhost:9999"},  # another port is another origin
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "cross-site", "Origin": "http://localhost"},
    ],
)
def test_writes_from_another_site_are_refused(
    make_app: Callable[..., Flask], database_url: str, headers: dict[str, str]
) -> None:
    client = make_app(DATABASE_URL=database_url).test_client()
    for method, path in [*WRITES, ("POST", "/chat")]:
        response = client.open(path, method=method, json={"title": "x"}, headers=headers)
        assert response.status_code == 403, (method, path)
        assert response.get_json()["error"]["type"] == "cross_site"
    assert client.get("/api/chats").get_json() == {"chats": []}  # nothing was made
    # Reading is not a write: another site's page cannot read the answer anyway (no CORS).
    assert client.get("/api/chats", headers=headers).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {},  # a script: neither header
        {"Origin": "http://localhost"},
        {"Origin": "http://LOCALHOST"},
        {"Sec-Fetch-Site": "same-origin", "Origin": "http://localhost"},
        {"Sec-Fetch-Site": "none"},
    ],
)
def test_the_page_and_scripts_may_write(
    make_app: Callable[..., Flask], database_url: str, headers: dict[str, str]
) -> None:
    client = make_app(DATABASE_URL=database_url).test_client()
    made = client.post("/api/chats", json={"title": "x"}, headers=headers)
    assert made.status_code == 201
    chat = made.get_json()["id"]
    assert (
        client.patch(f"/api/chats/{chat}", json={"title": "y"}, headers=headers).status_code == 200
    )
    assert client.delete(f"/api/chats/{chat}", headers=headers).status_code == 204


def test_the_origin_is_compared_with_the_host_the_browser_asked() -> None:
    assert not is_cross_site("POST", "chat.example.com", "https://chat.example.com", None)
    assert not is_cross_site("POST", "localhost:8080", "http://localhost:8080", "same-origin")
    assert is_cross_site("POST", "chat.example.com", "https://chat.example.com.evil.net", None)
    assert is_cross_site("PUT", "chat.example.com", "https://other.example.com", None)
    assert not is_cross_site("GET", "chat.example.com", "https://evil.example", "cross-site")
    assert not is_cross_site("OPTIONS", "chat.example.com", "https://evil.example", None)
