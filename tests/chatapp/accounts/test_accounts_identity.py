"""Who is asking, per AUTH_MODE: `none` ignores identity headers, `appservice` needs Easy
Auth's, `header` believes its header only from TRUSTED_PROXIES."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from flask import Flask
from sqlalchemy import func, select

from chatapp.settings import SettingsError, from_environ
from chatapp.store.models import User

ALICE = {"X-MS-CLIENT-PRINCIPAL-ID": "alice-oid", "X-MS-CLIENT-PRINCIPAL-NAME": "alice@example.com"}


def test_under_none_a_forged_principal_header_changes_nothing(
    make_app: Callable[..., Flask], database_url: str
) -> None:
    client = make_app(DATABASE_URL=database_url).test_client()
    made = client.post("/api/chats", json={"title": "mine"}, headers=ALICE)
    assert made.status_code == 201
    # Another "user" by header is the same local user: the header is ignored.
    listed = client.get("/api/chats", headers={"X-MS-CLIENT-PRINCIPAL-ID": "mallory"}).get_json()
    assert [c["id"] for c in listed["chats"]] == [made.get_json()["id"]]
    assert client.get("/api/chats").get_json() == listed
    me = client.get("/api/me", headers=ALICE).get_json()
    assert me == {"auth_mode": "none", "server_chats": False, "user": None}


def test_under_appservice_no_principal_header_is_a_401(
    make_app: Callable[..., Flask], database_url: str
) -> None:
    client = make_app(DATABASE_URL=database_url, AUTH_MODE="appservice").test_client()
    for method, path in [
        ("GET", "/api/chats"),
        ("POST", "/api/chats"),
        ("GET", "/api/chats/abc"),
        ("PATCH", "/api/chats/abc"),
        ("DELETE", "/api/chats/abc"),
        ("POST", "/chat"),
    ]:
        response = client.open(path, method=method, json={})
        assert response.status_code == 401, (method, path)
        assert response.get_json()["error"]["type"] == "unauthenticated"
    blank = client.get("/api/chats", headers={"X-MS-CLIENT-PRINCIPAL-ID": "  "})
    assert blank.status_code == 401
    assert client.get("/api/me").get_json() == {
        "auth_mode": "appservice",
        "server_chats": True,
        "user": None,
    }
    assert client.get("/api/me", headers=ALICE).get_json()["user"] == {"name": "alice@example.com"}
    assert client.get("/api/chats", headers=ALICE).get_json() == {"chats": []}
    # The page and the probes need nobody.
    assert client.get("/").status_code == 200
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"X-MS-CLIENT-PRINCIPAL-ID": "alice\toid"},
        {"X-MS-CLIENT-PRINCIPAL-ID": "alice\x85oid"},
        [("X-MS-CLIENT-PRINCIPAL-ID", "alice-oid"), ("X-MS-CLIENT-PRINCIPAL-ID", "bob-oid")],
        {"X-MS-CLIENT-PRINCIPAL-ID": "alice-oid,bob-oid"},
    ],
)
def test_a_malformed_or_repeated_principal_id_names_nobody(
    make_app: Callable[..., Flask], database_url: str, headers: object
) -> None:
    """Issue 58: a tab in the id was a user, and two id headers (joined by the server into
    "alice-oid, bob-oid") were a new user."""
    app = make_app(DATABASE_URL=database_url, AUTH_MODE="appservice")
    response = app.test_client().get("/api/chats", headers=headers)
    assert response.status_code == 401
    assert response.get_json()["error"]["type"] == "unauthenticated"
    proxied = make_app(DATABASE_URL=database_url, AUTH_MODE="header", TRUSTED_PROXIES=["10.0.0.7"])
    proxy = proxied.test_client()
    proxy.environ_base["REMOTE_ADDR"] = "10.0.0.7"
    forwarded = [("X-Forwarded-User", "alice"), ("X-Forwarded-User", "bob")]
    for user in (forwarded, {"X-Forwarded-User": "alice\tbob"}):
        assert proxy.get("/api/chats", headers=user).status_code == 401
    with app.extensions["store"].session() as session:
        assert session.scalar(select(func.count()).select_from(User)) == 0  # nobody was made


def test_under_header_the_header_counts_only_from_a_trusted_proxy(
    make_app: Callable[..., Flask], database_url: str
) -> None:
    app = make_app(
        DATABASE_URL=database_url,
        AUTH_MODE="header",
        TRUSTED_PROXIES=["10.0.0.0/24"],
        AUTH_NAME_HEADER="X-Forwarded-Email",
    )
    proxy = app.test_client()
    proxy.environ_base["REMOTE_ADDR"] = "10.0.0.7"
    direct = app.test_client()
    direct.environ_base["REMOTE_ADDR"] = "192.0.2.1"
    alice = {"X-Forwarded-User": "alice", "X-Forwarded-Email": "alice@example.com"}
    made = proxy.post("/api/chats", json={"title": "through the proxy"}, headers=alice)
    assert made.status_code == 201
    # The same header sent straight to the app names nobody.
    refused = direct.get("/api/chats", headers=alice)
    assert refused.status_code == 401 and refused.get_json()["error"]["type"] == "unauthenticated"
    assert proxy.get("/api/chats").status_code == 401  # from the proxy, but no user
    assert len(proxy.get("/api/chats", headers=alice).get_json()["chats"]) == 1
    assert proxy.get("/api/me", headers=alice).get_json()["user"] == {"name": "alice@example.com"}
    # The app's Easy Auth headers mean nothing in this mode.
    assert proxy.get("/api/chats", headers=ALICE).status_code == 401


def test_modes_keep_their_users_apart(make_app: Callable[..., Flask], database_url: str) -> None:
    """A proxy user named "local", or Easy Auth's id "local", is not the AUTH_MODE=none user."""
    local = make_app(DATABASE_URL=database_url).test_client()
    local.post("/api/chats", json={"title": "local's"})
    appservice = make_app(DATABASE_URL=database_url, AUTH_MODE="appservice").test_client()
    headers = {"X-MS-CLIENT-PRINCIPAL-ID": "local"}
    assert appservice.get("/api/chats", headers=headers).get_json() == {"chats": []}


def test_header_mode_without_trusted_proxies_does_not_start(
    make_app: Callable[..., Flask], database_url: str
) -> None:
    with pytest.raises(SettingsError, match="TRUSTED_PROXIES"):
        make_app(DATABASE_URL=database_url, AUTH_MODE="header")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("AUTH_MODE", "easyauth", "none, appservice or header"),
        ("TRUSTED_PROXIES", "10.0.0.1, proxy.local", "not an IP address"),
        ("AUTH_HEADER", "X User", "HTTP header name"),
        ("DATABASE_URL", "mysql://x/y", "sqlite:///"),
        ("CHAT_RETENTION_DAYS", "0", "at least 1"),
    ],
)
def test_bad_account_settings_name_their_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        from_environ({name: value})
