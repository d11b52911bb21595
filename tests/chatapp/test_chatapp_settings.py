"""Settings: defaults, then the environment, then test_config; bad values name their variable."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from chatapp import create_app
from chatapp.settings import DEFAULTS, SettingsError, from_environ, listen_address

APP_DIR = Path(__file__).resolve().parents[2] / "main-app"
ENV_NAMES = [
    "SIDECAR_URL",
    "SIDECAR_CONNECT_TIMEOUT",
    "SIDECAR_READ_TIMEOUT",
    "RELAY_TIME_LIMIT",
    "HEARTBEAT_INTERVAL",
    "MAX_REQUEST_BYTES",
    "MAX_MESSAGES",
    "MAX_IMAGES",
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_CHATS",
    "MAX_NEW_TOKENS",
    "LOG_LEVEL",
    "HOST",
    "PORT",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def test_defaults() -> None:
    config = create_app().config
    assert config["SIDECAR_URL"] == "http://localhost:8000"
    assert config["SIDECAR_CONNECT_TIMEOUT"] == 3.0
    assert config["SIDECAR_READ_TIMEOUT"] == 300.0
    assert config["HEARTBEAT_INTERVAL"] == 1.0
    assert config["MAX_CONTENT_LENGTH"] == 64 * 1024
    assert config["MAX_MESSAGES"] == 200
    assert (config["MAX_IMAGE_BYTES"], config["MAX_IMAGES"]) == (5 * 1024 * 1024, 4)
    assert config["MAX_IMAGE_CHATS"] == 4
    assert config["MAX_NEW_TOKENS"] is None
    assert config["LOG_LEVEL"] == "info"
    assert listen_address({}) == ("0.0.0.0", 8080)


def test_environment_overrides_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_URL", "http://127.0.0.1:9001/")
    monkeypatch.setenv("SIDECAR_READ_TIMEOUT", "12.5")
    monkeypatch.setenv("MAX_REQUEST_BYTES", "1000")
    monkeypatch.setenv("MAX_NEW_TOKENS", "64")
    monkeypatch.setenv("HEARTBEAT_INTERVAL", "")  # empty means unset
    monkeypatch.setenv("LOG_LEVEL", "WARNING")
    app = create_app()
    assert app.config["SIDECAR_URL"] == "http://127.0.0.1:9001"
    assert app.config["SIDECAR_READ_TIMEOUT"] == 12.5
    assert app.config["MAX_CONTENT_LENGTH"] == 1000
    assert app.config["MAX_NEW_TOKENS"] == 64
    assert app.config["HEARTBEAT_INTERVAL"] == 1.0
    assert app.config["LOG_LEVEL"] == "warning"
    assert app.extensions["upstream"].base_url == "http://127.0.0.1:9001"


def test_test_config_overrides_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_URL", "http://from-env:1")
    app = create_app({"SIDECAR_URL": "http://from-test:2", "TESTING": True})
    assert app.config["SIDECAR_URL"] == "http://from-test:2"
    assert app.testing


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SIDECAR_URL", "localhost:8000"),
        ("SIDECAR_CONNECT_TIMEOUT", "soon"),
        ("SIDECAR_READ_TIMEOUT", "0"),
        ("RELAY_TIME_LIMIT", "0"),
        ("HEARTBEAT_INTERVAL", "-1"),
        ("MAX_REQUEST_BYTES", "1.5"),
        ("MAX_MESSAGES", "0"),
        ("MAX_IMAGES", "-1"),
        ("MAX_IMAGES", "many"),
        ("MAX_IMAGE_BYTES", "0"),
        ("MAX_IMAGE_CHATS", "0"),
        ("LOG_LEVEL", "loud"),
        ("DOCUMENT_SEARCH", "bm25"),
        ("DOCUMENT_KEYWORD_WEIGHT", "1.5"),
        ("DOCUMENT_KEYWORD_WEIGHT", "some"),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        from_environ({name: value})


def test_hybrid_search_is_the_default_and_its_weight_is_read() -> None:
    assert DEFAULTS["DOCUMENT_SEARCH"] == "hybrid" and DEFAULTS["DOCUMENT_KEYWORD_WEIGHT"] == 0.3
    assert from_environ({"DOCUMENT_KEYWORD_WEIGHT": "0"})["DOCUMENT_KEYWORD_WEIGHT"] == 0.0


def test_listen_address_from_environment() -> None:
    assert listen_address({"HOST": "127.0.0.1", "PORT": "9000"}) == ("127.0.0.1", 9000)
    with pytest.raises(SettingsError, match="PORT"):
        listen_address({"PORT": "http"})


def test_gunicorn_config(monkeypatch: pytest.MonkeyPatch) -> None:
    config = runpy.run_module("chatapp.gunicorn_conf")
    assert config["bind"] == "0.0.0.0:8080"
    # One greenlet per connection: long streams and slow clients hold no thread, and a
    # request's headers must arrive within keepalive seconds.
    assert config["worker_class"] == "gevent"
    assert config["worker_connections"] >= 1000 and 0 < config["keepalive"] <= 10
    assert config["accesslog"] is None  # the app logs one richer line per chat
    monkeypatch.setenv("HOST", "::")
    monkeypatch.setenv("PORT", "9090")
    assert runpy.run_module("chatapp.gunicorn_conf")["bind"] == "[::]:9090"
    monkeypatch.setenv("GUNICORN_CONNECTIONS", "zero")
    with pytest.raises(SettingsError, match="GUNICORN_CONNECTIONS"):
        runpy.run_module("chatapp.gunicorn_conf")


def test_the_relay_time_limit_stays_below_app_services_230_s_and_bounds_every_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RELAY_TIME_LIMIT ends a chat before App Service's front end does (230 s), so no single
    wait for the model service (SIDECAR_READ_TIMEOUT) may be longer than it."""
    app = create_app()
    assert app.config["RELAY_TIME_LIMIT"] == 220.0 < 230
    assert app.extensions["upstream"]._connection.read_timeout == 220.0
    monkeypatch.setenv("RELAY_TIME_LIMIT", "45")
    monkeypatch.setenv("SIDECAR_READ_TIMEOUT", "60")
    assert create_app().extensions["upstream"]._connection.read_timeout == 45.0
    monkeypatch.setenv("SIDECAR_READ_TIMEOUT", "10")
    assert create_app().extensions["upstream"]._connection.read_timeout == 10.0
