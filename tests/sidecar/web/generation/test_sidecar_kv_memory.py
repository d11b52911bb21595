"""The one bound on all KV memory (KV_MEMORY_MB) through a real sidecar: the context is capped
to what the bound holds, a request whose KV does not fit beside the running replies waits in the
worker (and starts when one ends) instead of exceeding it, a client that leaves while waiting
takes its request with it, and the log line and /metrics say where each turn's tokens came
from."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scripts.run import services
from scripts.run.services import Service
from tests.sidecar.support import metrics, one_after_another, predict, request_line, words
from tests.support.engines import paced


def long_message(seed: int) -> str:
    return words(60, seed)


@pytest.fixture(scope="module")
def bounded(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """1 MiB of KV (1,024 tokens of the tiny model's fp32 KV), tokens paced so that a reply
    is still running when the next request arrives."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-kv-memory.log"
    with services.sidecar(
        tiny_model_dir, log, env=paced(0.01), KV_MEMORY_MB="1", MAX_CONCURRENCY="4"
    ) as service:
        yield service


def body(seed: int, request_new: int = 300, count: int = 60) -> dict[str, object]:
    return {
        "messages": [{"role": "user", "content": words(count, seed)}],
        "max_new_tokens": request_new,
        "min_new_tokens": request_new,
        "cache_scope": f"memory-{seed}",
    }


def test_the_context_is_capped_to_what_the_bound_holds(bounded: Service) -> None:
    (line,) = [json.loads(x) for x in bounded.log_lines() if '"msg": "kv memory"' in x]
    assert line["kv_memory_bytes"] == 2**20 and line["chosen"] == "KV_MEMORY_MB"
    assert line["context_tokens"] == 2**20 // line["kv_memory_bytes"] * 1024
    assert metrics(bounded.url)["sidecar_kv_memory_bytes"] == 2**20
    too_long = {"messages": [{"role": "user", "content": "a " * 1200}], "max_new_tokens": 8}
    response = predict(bounded.url, too_long)
    assert response.status_code == 413, response.text
    assert response.json()["error"]["limit_tokens"] == 1024


def test_a_request_that_does_not_fit_waits_for_a_running_reply(bounded: Service) -> None:
    waits = metrics(bounded.url).get("sidecar_kv_memory_waits_total", 0)
    bodies = {f"kv-wait-{seed}": body(seed) for seed in (1, 2)}
    # The second comes while the first reply decodes: its ~560 tokens are reserved
    results = one_after_another(bounded.url, bodies, delay=0.5)
    for request_id in bodies:
        assert results[request_id].status_code == 200
        assert request_line(bounded, request_id)["generated_tokens"] == 300
    assert metrics(bounded.url)["sidecar_kv_memory_waits_total"] == waits + 1
    assert any('"msg": "request waits for KV memory"' in x for x in bounded.log_lines())
    assert metrics(bounded.url)["sidecar_kv_reserved_bytes"] == 0


def test_a_client_that_leaves_while_waiting_takes_its_request_along(bounded: Service) -> None:
    def send_long() -> None:
        httpx.post(
            bounded.url + "/predict",
            json=body(3),
            headers={"X-Request-Id": "kv-holder"},
            timeout=120,
        )

    holder = threading.Thread(target=send_long)
    holder.start()
    time.sleep(0.5)
    with pytest.raises(httpx.ReadTimeout):  # it waits for memory: nothing comes back in time
        httpx.post(
            bounded.url + "/predict",
            json=body(4),
            headers={"X-Request-Id": "kv-leaver"},
            timeout=0.5,
        )
    holder.join()
    line = request_line(bounded, "kv-leaver")
    assert line["outcome"] == "cancelled" and "generated_tokens" not in line
    assert request_line(bounded, "kv-holder")["generated_tokens"] == 300


def test_the_log_line_and_metrics_say_where_the_tokens_came_from(bounded: Service) -> None:
    before = metrics(bounded.url)
    first = {"messages": [{"role": "user", "content": long_message(5)}], "max_new_tokens": 4}

    def send(body: dict[str, object], request_id: str) -> httpx.Response:
        headers = {"X-Request-Id": request_id}
        response = httpx.post(bounded.url + "/predict", json=body, headers=headers, timeout=60)
        assert response.status_code == 200
        return response

    response = send({**first, "cache_scope": "sources"}, "sources-1")
    history = [
        *first["messages"],  # type: ignore[misc]
        {"role": "assistant", "content": response.text},
        {"role": "user", "content": "and then?"},
    ]
    second = send({"messages": history, "max_new_tokens": 4, "cache_scope": "sources"}, "sources-2")
    cached = int(second.headers["x-cached-tokens"])
    assert cached > 0
    one, two = request_line(bounded, "sources-1"), request_line(bounded, "sources-2")
    assert two["cache_tier"] == "ram" and two["cached_tokens"] == cached
    assert one.get("cache_tier") is None
    after = metrics(bounded.url)
    ram = 'sidecar_prompt_tokens_by_source_total{source="ram"}'
    recomputed = 'sidecar_prompt_tokens_by_source_total{source="recomputed"}'
    assert after[ram] - before[ram] == cached
    prompts = one["prompt_tokens"] + two["prompt_tokens"]
    assert after[recomputed] - before[recomputed] == prompts - cached


def test_the_default_bound_comes_from_the_containers_memory_limit(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Started inside a cgroup with a memory limit (as a container with --memory is), the
    sidecar chooses its KV bound from that limit, not the machine's memory."""
    if services.own_memory_cgroup() is None:
        pytest.skip("no writable cgroup v1 memory controller here")
    limit = 3 * 2**30
    log = tmp_path / "sidecar.log"
    with (
        services.memory_cgroup(limit) as group,
        services.sidecar(tiny_model_dir, log, cgroup=group) as service,
    ):
        (line,) = [json.loads(x) for x in service.log_lines() if '"msg": "kv memory"' in x]
        assert line["memory_limit_bytes"] == limit
        assert line["limit_source"] == "cgroup v1 memory.limit_in_bytes"
        expected = limit - line["loaded_bytes"] - 2**30  # the margin: 1 GiB at 3 GiB
        assert line["kv_memory_bytes"] == expected
        assert predict(service.url, body(7, 16)).status_code == 200


SHORT = 20  # words: a prompt of about a hundred tokens


def prompt_tokens(service: Service, seed: int) -> int:
    """The prompt tokens of body(seed, count=SHORT) (from a one-token request's log line)."""
    probe = {**body(seed, 1, SHORT), "min_new_tokens": 0, "cache_scope": f"probe-{seed}"}
    response = httpx.post(
        service.url + "/predict", json=probe, headers={"X-Request-Id": f"probe-{seed}"}, timeout=60
    )
    assert response.status_code == 200
    return int(request_line(service, f"probe-{seed}")["prompt_tokens"])


def test_a_huge_max_tokens_does_not_hold_the_bound_up_front(bounded: Service) -> None:
    """The first asks for all the context leaves (its whole length is the bound, about): it
    reserves its prompt and 256 tokens, so a short request started after it runs beside it at
    once instead of waiting for it to end; both replies are whole."""
    length = prompt_tokens(bounded, 11)
    assert length < 300  # the numbers below assume a prompt of a few hundred tokens at most
    waits = metrics(bounded.url)["sidecar_kv_memory_waits_total"]
    bodies = {"kv-huge": body(11, 1024 - length - 1, SHORT), "kv-short": body(12, 16, SHORT)}
    results = one_after_another(bounded.url, bodies, delay=0.5)
    assert results["kv-huge"].status_code == results["kv-short"].status_code == 200
    huge, short = request_line(bounded, "kv-huge"), request_line(bounded, "kv-short")
    assert huge["generated_tokens"] == 1024 - length - 1 and short["generated_tokens"] == 16
    assert short["kv_wait_ms"] == 0  # it started at once
    assert isinstance(short["room_ms"], float) and short["room_ms"] >= 0
    assert isinstance(short["room_compacted"], int) and isinstance(short["room_spilled"], int)
    assert metrics(bounded.url)["sidecar_kv_memory_waits_total"] == waits
    assert metrics(bounded.url)["sidecar_kv_reserved_bytes"] == 0


def test_a_reply_that_cannot_grow_waits_and_then_finishes_whole(bounded: Service) -> None:
    """Both start (each reserves its prompt and 256 tokens); the first grows to its whole
    length, which leaves the bound full, so the second waits to grow until the first ends, and
    then writes the rest: no reply stops halfway. Its log line says how long it waited."""
    lengths = prompt_tokens(bounded, 13) + prompt_tokens(bounded, 14)
    assert lengths <= 300
    before = metrics(bounded.url)
    # The first's whole length and the second's first reservation fill the bound exactly
    first_new = 1024 - 256 - lengths
    bodies = {"kv-grows": body(13, first_new, SHORT), "kv-pauses": body(14, 400, SHORT)}
    results = one_after_another(bounded.url, bodies, delay=0.5)
    assert results["kv-grows"].status_code == results["kv-pauses"].status_code == 200
    grows, pauses = request_line(bounded, "kv-grows"), request_line(bounded, "kv-pauses")
    assert grows["generated_tokens"] == first_new and pauses["generated_tokens"] == 400
    assert pauses["kv_paused_ms"] > 0 and "kv_paused_ms" not in grows
    after = metrics(bounded.url)
    assert after["sidecar_kv_growth_pauses_total"] == before["sidecar_kv_growth_pauses_total"] + 1
    assert after["sidecar_kv_memory_waits_total"] == before["sidecar_kv_memory_waits_total"]
    assert after["sidecar_kv_paused_seconds_total"] > before["sidecar_kv_paused_seconds_total"]
