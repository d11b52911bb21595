"""Sidecar fixtures: real sidecar processes with other settings than the shared one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import servers

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def small_service(
    small_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[servers.Service]:
    """The slower `small` model, one generation at a time, two may wait: for cancellation,
    queueing and responsiveness (one token takes milliseconds, a long prefill seconds)."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-small.log"
    with servers.sidecar(small_model_dir, log, MAX_CONCURRENCY="1", QUEUE_SIZE="2") as service:
        yield service


@pytest.fixture(scope="session")
def parallel_service(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[servers.Service]:
    """Four generations at once, taking turns token by token."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-parallel.log"
    with servers.sidecar(tiny_model_dir, log, MAX_CONCURRENCY="4", QUEUE_SIZE="4") as service:
        yield service


@pytest.fixture(scope="module")
def faulty_service(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[servers.Service]:
    """The real engine wrapped by tests/sidecar/faults.py (faults on marker text)."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-faulty.log"
    with servers.sidecar(
        tiny_model_dir,
        log,
        ENGINE_FACTORY="tests.sidecar.faults:load_engine",
        PYTHONPATH=str(REPO),
    ) as service:
        yield service
