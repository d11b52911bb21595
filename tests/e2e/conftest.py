"""End-to-end fixtures: the real sidecar (tiny model) and the real app (gunicorn) as processes.

`paced_*` sidecars run the real engine slowed down (tests/support/engines.py), so that a test
can stop, kill or crowd a reply while it is being written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scripts.run import services
from tests.support.engines import paced

REPO = Path(__file__).resolve().parents[2]

AppFactory = Callable[..., contextlib.AbstractContextManager[services.Service]]


@pytest.fixture(scope="session")
def start_app(tmp_path_factory: pytest.TempPathFactory) -> AppFactory:
    """Start the chat app (gunicorn) against a sidecar URL; use as a context manager."""

    def start(
        sidecar_url: str, **settings: str
    ) -> contextlib.AbstractContextManager[services.Service]:
        log = tmp_path_factory.mktemp("logs") / "chatapp.log"
        return services.chatapp(sidecar_url, log, env={"HEARTBEAT_INTERVAL": "0.2", **settings})

    return start


@pytest.fixture(scope="session")
def live_app(
    sidecar_service: services.Service, start_app: AppFactory
) -> Iterator[services.Service]:
    """The app in front of the shared real sidecar on the tiny model."""
    with start_app(sidecar_service.url) as app:
        yield app


@pytest.fixture(scope="module")
def paced_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """One generation at a time, none may wait: a second request while one runs is refused."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-paced.log"
    with services.sidecar(
        tiny_model_dir, log, MAX_CONCURRENCY="1", QUEUE_SIZE="0", env=paced()
    ) as service:
        yield service


@pytest.fixture(scope="module")
def paced_app(paced_sidecar: services.Service, start_app: AppFactory) -> Iterator[services.Service]:
    with start_app(paced_sidecar.url) as app:
        yield app
