"""Fixtures for the chat app: a fresh app per test, its test client, and a fake sidecar."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from chatapp import create_app
from scripts.run.services import free_port
from tests.chatapp.fake_sidecar import FakeSidecar


@pytest.fixture
def fake() -> Iterator[FakeSidecar]:
    with FakeSidecar() as fake:
        yield fake


@pytest.fixture
def make_app(fake: FakeSidecar) -> Iterator[Callable[..., Flask]]:
    """create_app against the fake sidecar, with fast timeouts; keyword args override config.
    Each app's database connections are closed when the test ends."""
    made: list[Flask] = []

    def make(**config: Any) -> Flask:
        defaults = {
            "TESTING": True,
            "SIDECAR_URL": fake.url,
            "SIDECAR_CONNECT_TIMEOUT": 1.0,
            "SIDECAR_READ_TIMEOUT": 5.0,
            "HEARTBEAT_INTERVAL": 0.2,
        }
        app = create_app({**defaults, **config})
        made.append(app)
        return app

    yield make
    for app in made:
        app.extensions["store"].close()


@pytest.fixture
def app(make_app: Callable[..., Flask]) -> Flask:
    return make_app()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def down_url() -> str:
    """A URL where nothing listens."""
    return f"http://127.0.0.1:{free_port()}"
