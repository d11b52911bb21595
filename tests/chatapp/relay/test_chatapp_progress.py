"""A long prompt's reading, relayed (issue 54): the real sidecar reads slowly (`paced`), the app
turns its progress events (/predict's lines, /v1's `progress` member) into the browser's
`{"progress": ...}` lines, all before the first delta, over real HTTP."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from scripts.run import services
from tests.sidecar.web.generation.test_sidecar_progress import long_text
from tests.support.engines import paced


@pytest.fixture(scope="module")
def slow_reader(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-slow-reader.log"
    with services.sidecar(tiny_model_dir, log, env=paced(pace=0.0, prefill_pace=2.0)) as service:
        yield service


@pytest.mark.parametrize("api", ["predict", "openai"])
def test_progress_is_relayed_before_the_reply(
    api: str,
    slow_reader: services.Service,
    tiny_model_dir: Path,
    make_app: Callable[..., Flask],
) -> None:
    app = make_app(SIDECAR_URL=slow_reader.url, UPSTREAM_API=api, SIDECAR_READ_TIMEOUT=30.0)
    text = long_text(tiny_model_dir, 700)
    body = {"messages": [{"role": "user", "content": text}], "max_new_tokens": 4}
    response = app.test_client().post("/chat", json={**body, "conversation_id": f"p-{api}"})
    assert response.status_code == 200
    lines: list[dict[str, Any]] = [json.loads(x) for x in response.get_data().splitlines()]
    response.close()
    progress = [line["progress"] for line in lines if "progress" in line]
    assert len(progress) >= 3  # at the start, after each of two calls of 2 s, and between
    first_delta = next(i for i, line in enumerate(lines) if "delta" in line)
    assert all("progress" not in line for line in lines[first_delta:])
    reads = [p["read"] for p in progress]
    assert reads == sorted(reads) and reads[-1] == progress[-1]["total"] >= 700
    assert set(progress[0]) == {"read", "total", "seconds_left"}
    assert lines[-1]["done"] is True
