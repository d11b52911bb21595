"""End-to-end fixtures: the real sidecar (tiny model) and the real app (gunicorn) as processes.

`paced_*` sidecars run the real engine slowed down (tests/e2e/paced_engine.py), so that a test
can stop, kill or crowd a reply while it is being written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import servers

REPO = Path(__file__).resolve().parents[2]

AppFactory = Callable[..., contextlib.AbstractContextManager[servers.Service]]


def paced(pace: float = 0.05, load_delay: float = 0.0) -> dict[str, str]:
    """Sidecar settings for the paced engine."""
    return {
        "ENGINE_FACTORY": "tests.e2e.paced_engine:load_engine",
        "PYTHONPATH": str(REPO),
        "PACE_S": str(pace),
        "LOAD_DELAY_S": str(load_delay),
    }


@pytest.fixture(scope="session")
def start_app(tmp_path_factory: pytest.TempPathFactory) -> AppFactory:
    """Start the chat app (gunicorn) against a sidecar URL; use as a context manager."""

    def start(
        sidecar_url: str, **settings: str
    ) -> contextlib.AbstractContextManager[servers.Service]:
        log = tmp_path_factory.mktemp("logs") / "chatapp.log"
        return servers.chatapp(sidecar_url, log, **{"HEARTBEAT_INTERVAL": "0.2", **settings})

    return start


@pytest.fixture(scope="session")
def live_app(sidecar_service: servers.Service, start_app: AppFactory) -> Iterator[servers.Service]:
    """The app in front of the shared real sidecar on the tiny model."""
    with start_app(sidecar_service.url) as app:
        yield app


@pytest.fixture(scope="module")
def paced_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[servers.Service]:
    """One generation at a time, none may wait: a second request while one runs is refused."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-paced.log"
    with servers.sidecar(
        tiny_model_dir, log, MAX_CONCURRENCY="1", QUEUE_SIZE="0", **paced()
    ) as service:
        yield service


@pytest.fixture(scope="module")
def paced_app(paced_sidecar: servers.Service, start_app: AppFactory) -> Iterator[servers.Service]:
    with start_app(paced_sidecar.url) as app:
        yield app
