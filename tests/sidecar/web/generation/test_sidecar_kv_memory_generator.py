"""KV_MEMORY_MB on the Generator path through a real sidecar (model/generator/memory.py): a
generator made for one reply reserves its KV before it is made, so a reply that does not fit
beside a running one waits in the worker and starts when it ends, on a text model with
DECODE_BATCH_ROWS=1 and on the tiny vision model (whose generators the cache never keeps), and
the context is capped to what the bound holds. Before, four such replies at once allocated what
they wanted whatever the container held."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scripts.run import services
from scripts.run.services import Service
from sidecar.model.vision import image_tokens
from tests.sidecar.support import metrics, one_after_another, predict, request_line, words
from tests.sidecar.web.images.image_files import data_url, photo
from tests.support.engines import paced

SIZE = (467, 311)  # 1,921 image tokens


@pytest.fixture(scope="module")
def generator_bounded(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """The Generator path with 1 MiB of KV (1,024 of the tiny model's fp32 tokens) and no
    conversation cache: every generator is made for its reply and reserves it."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-kv-generator.log"
    with services.sidecar(
        tiny_model_dir,
        log,
        env=paced(0.01),
        DECODE_BATCH_ROWS="1",
        KV_MEMORY_MB="1",
        PROMPT_CACHE_MB="0",
        MAX_CONCURRENCY="4",
    ) as service:
        yield service


@pytest.fixture(scope="module")
def vision_bounded(
    tiny_vision_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """The tiny vision model with 3 MiB of KV: one photo chat (about 2,200 tokens with its
    reply) fits, two do not."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-kv-vision.log"
    with services.sidecar(
        tiny_vision_model_dir, log, env=paced(0.01), KV_MEMORY_MB="3", MAX_CONCURRENCY="4"
    ) as service:
        yield service


def kv_memory_line(service: Service) -> dict[str, Any]:
    (line,) = [json.loads(x) for x in service.log_lines() if '"msg": "kv memory"' in x]
    return line


def test_the_generator_path_is_bounded_and_its_context_capped(generator_bounded: Service) -> None:
    line = kv_memory_line(generator_bounded)
    assert line["path"] == "generator" and line["chosen"] == "KV_MEMORY_MB"
    assert line["kv_memory_bytes"] == 2**20 and line["context_tokens"] == 1024
    assert metrics(generator_bounded.url)["sidecar_kv_memory_bytes"] == 2**20
    too_long = {"messages": [{"role": "user", "content": "a " * 1200}], "max_new_tokens": 8}
    response = predict(generator_bounded.url, too_long)
    assert response.status_code == 413, response.text
    assert response.json()["error"]["limit_tokens"] == 1024


def test_a_reply_that_does_not_fit_waits_for_the_running_one(generator_bounded: Service) -> None:
    waits = metrics(generator_bounded.url).get("sidecar_kv_memory_waits_total", 0)
    bodies = {
        f"gen-wait-{seed}": {
            "messages": [{"role": "user", "content": words(60, seed)}],
            "max_new_tokens": 300,
            "min_new_tokens": 300,
        }
        for seed in (1, 2)
    }
    results = one_after_another(generator_bounded.url, bodies, delay=1.0)
    for request_id in bodies:
        assert results[request_id].status_code == 200
        assert request_line(generator_bounded, request_id)["generated_tokens"] == 300
    after = metrics(generator_bounded.url)
    assert after["sidecar_kv_memory_waits_total"] >= waits + 1
    assert after["sidecar_kv_reserved_bytes"] == 0
    assert any('"msg": "request waits for KV memory"' in x for x in generator_bounded.log_lines())


def test_a_second_photo_chat_waits_for_the_first(vision_bounded: Service) -> None:
    line = kv_memory_line(vision_bounded)
    assert line["path"] == "generator" and line["kv_memory_bytes"] == 3 * 2**20
    waits = metrics(vision_bounded.url).get("sidecar_kv_memory_waits_total", 0)
    bodies = {
        f"photo-{name}": {
            "input_text": "What is in this picture?",
            "images": [data_url(photo(*SIZE, color))],
            "max_new_tokens": 200,
            "min_new_tokens": 200,
        }
        for name, color in (("red", (200, 30, 30)), ("blue", (30, 30, 200)))
    }
    results = one_after_another(vision_bounded.url, bodies, delay=1.0)
    for request_id in bodies:
        assert results[request_id].status_code == 200, results[request_id].text
        line = request_line(vision_bounded, request_id)
        assert line["generated_tokens"] == 200
        assert line["image_tokens"] == image_tokens(*SIZE)
    after = metrics(vision_bounded.url)
    assert after["sidecar_kv_memory_waits_total"] >= waits + 1
    assert after["sidecar_kv_reserved_bytes"] == 0
