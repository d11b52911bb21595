"""chatapp/guards/host.py: the names the app answers. Issue 58: with ALLOWED_HOSTS unset
(`make run`) any name was answered, so a page on a name rebound to 127.0.0.1 passed the
cross-site check and could list, read, upload to and delete from the library."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from flask import Flask

from chatapp import settings

REBOUND = "rebound.attacker.example"


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/api/documents"), ("GET", "/api/me"), ("DELETE", "/api/documents/1"), ("GET", "/")],
)
def test_a_rebound_name_is_refused_before_any_route(
    make_app: Callable[..., Flask], method: str, path: str
) -> None:
    app = make_app()
    response = app.test_client().open(
        path, method=method, headers={"Host": f"{REBOUND}:8080", "Origin": f"http://{REBOUND}:8080"}
    )
    assert response.status_code == 400
    assert response.get_json() == {
        "error": {"message": "This host name is not served here.", "type": "invalid_host"}
    }


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:8080", "LOCALHOST:8080", "127.0.0.1:5000", "[::1]:8080"]
)
def test_by_default_the_loopback_names_are_answered(
    make_app: Callable[..., Flask], host: str
) -> None:
    response = make_app().test_client().get("/api/documents", headers={"Host": host})
    assert response.status_code == 200, response.get_data(as_text=True)


@pytest.mark.parametrize("host", ["", "localhost.attacker.example", "127.0.0.1.nip.io", "[::2]"])
def test_near_misses_are_refused(make_app: Callable[..., Flask], host: str) -> None:
    response = make_app().test_client().get("/api/documents", headers={"Host": host})
    assert response.status_code == 400


def test_app_service_answers_its_own_name_and_allowed_hosts(
    make_app: Callable[..., Flask],
) -> None:
    site = "chat-x1.westeurope-01.azurewebsites.net"
    client = make_app(WEBSITE_HOSTNAME=site).test_client()
    for host in (site, f"{site.upper()}:443", "localhost"):
        assert client.get("/api/documents", headers={"Host": host}).status_code == 200, host
    assert client.get("/api/documents", headers={"Host": REBOUND}).status_code == 400
    listed = make_app(WEBSITE_HOSTNAME=site, ALLOWED_HOSTS=["chat.contoso.com", "*.contoso.net"])
    client = listed.test_client()
    for host in (site, "chat.contoso.com", "a.contoso.net"):
        assert client.get("/api/documents", headers={"Host": host}).status_code == 200, host
    for host in ("localhost", "contoso.net", REBOUND):  # a list is all that is answered
        assert client.get("/api/documents", headers={"Host": host}).status_code == 400, host


def test_a_star_answers_any_name(make_app: Callable[..., Flask]) -> None:
    client = make_app(ALLOWED_HOSTS=["*"]).test_client()
    assert client.get("/api/documents", headers={"Host": REBOUND}).status_code == 200


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_the_probes_answer_any_name(make_app: Callable[..., Flask], path: str) -> None:
    """Kubernetes' probes and a load balancer ask by the pod's address, a scraper by a
    service name: the probes tell nothing of a person's."""
    response = make_app().test_client().get(path, headers={"Host": "10.244.1.7:8080"})
    assert response.status_code != 400


def test_the_environment_is_read_once_into_the_settings() -> None:
    parsed = settings.from_environ(
        {"ALLOWED_HOSTS": " Chat.Example.com, *.example.net ,", "WEBSITE_HOSTNAME": "Site.NET"}
    )
    assert parsed == {
        "ALLOWED_HOSTS": ["chat.example.com", "*.example.net"],
        "WEBSITE_HOSTNAME": "site.net",
    }
    assert settings.access_summary({})["allowed_hosts"] == "localhost,127.0.0.1,[::1]"
    assert settings.access_summary({"ALLOWED_HOSTS": "*"})["allowed_hosts"] == "*"
