"""Sidecar fixtures: real sidecar processes with other settings than the shared one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.run import services
from tests.support.engines import faulty, paced

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def small_service(
    small_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """The slower `small` model, one generation at a time, two may wait: for cancellation,
    queueing and responsiveness (one token takes milliseconds, a long prefill seconds)."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-small.log"
    with services.sidecar(small_model_dir, log, MAX_CONCURRENCY="1", QUEUE_SIZE="2") as service:
        yield service


@pytest.fixture(scope="module")
def chunked_service(
    small_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """The `small` model, two generations at once, prompts read 32 tokens per worker step: a
    long prompt's prefill is a hundred steps, which other generations' steps interleave with."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-chunked.log"
    with services.sidecar(
        small_model_dir, log, MAX_CONCURRENCY="2", QUEUE_SIZE="2", PREFILL_CHUNK="32"
    ) as service:
        yield service


@pytest.fixture(scope="session")
def paced_small_service(
    small_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """The small model at 50 ms a token, as slow as Phi-3-mini on a CPU, for "stops within one
    token" tests: at the small model's own ~2 ms a token, a few ms of scheduling delay on a busy
    machine would already be several tokens, and the test would measure the machine."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-paced-small.log"
    with services.sidecar(small_model_dir, log, MAX_CONCURRENCY="1", env=paced(0.05)) as service:
        yield service


@pytest.fixture(scope="session")
def parallel_service(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """Four generations at once, taking turns token by token."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-parallel.log"
    with services.sidecar(tiny_model_dir, log, MAX_CONCURRENCY="4", QUEUE_SIZE="4") as service:
        yield service


@pytest.fixture(scope="module")
def faulty_service(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """The real engine wrapped by tests/support/engines.py (faults on marker text)."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-faulty.log"
    with services.sidecar(
        tiny_model_dir,
        log,
        env=faulty(),
    ) as service:
        yield service
