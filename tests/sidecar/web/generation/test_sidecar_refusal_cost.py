"""What an over-long prompt costs the others (issue 46), through a real sidecar: a prompt the
byte bound rules out is refused before any tokenizer reads it; the others are built in the prompt
process (model/prompt/process.py), off the worker's step loop, so a running stream keeps getting
tokens while refusals are built; each refusal's cost is in its log line and /metrics.

Counting, not timing: which check refused, how many tokens a stream got while refusals were
built."""

from __future__ import annotations

import json
import os
import random
import signal
import string
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scripts.run import services
from scripts.run.services import Service
from sidecar.model.prompt.token_bound import max_token_bytes
from tests.sidecar.support import assert_error, metrics, request_line
from tests.support.engines import paced

CONTEXT = 256


@pytest.fixture(scope="module")
def sidecar(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A short context (so that a few KB do not fit), tokens paced so that a stream runs
    while refusals are built."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-refusal-cost.log"
    with services.sidecar(
        tiny_model_dir,
        log,
        env=paced(0.01),
        MAX_LENGTH=str(CONTEXT),
        MAX_CONCURRENCY="4",
        MAX_BODY_BYTES=str(4 * 2**20),
    ) as service:
        yield service


def noise(size: int, seed: int) -> str:
    """Text that takes about a token per byte or two (letters, digits, punctuation)."""
    rnd = random.Random(seed)
    return "".join(rnd.choice(string.ascii_letters + string.digits + " .,;!?") for _ in range(size))


def chat(request_id: str, url: str, content: str) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8}
    headers = {"X-Request-Id": request_id}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=120)


def test_a_prompt_the_byte_bound_rules_out_is_never_tokenized(
    sidecar: Service, tiny_model_dir: Path
) -> None:
    bound = max_token_bytes(tiny_model_dir / "tokenizer.json")
    assert bound is not None  # a byte-level BPE: the bound is known
    check = 'sidecar_refusal_work_seconds_count{check="byte_bound"}'
    before = metrics(sidecar.url)
    response = chat("byte-bound", sidecar.url, noise(bound * CONTEXT + 100, 1))
    message = assert_error(response, 400)
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert "takes at least" in message and f"limit is {CONTEXT} tokens" in message
    line = request_line(sidecar, "byte-bound")
    assert line["byte_bound"] is True and line["refusal_ms"] >= 0
    after = metrics(sidecar.url)
    assert after[check] == before[check] + 1


def test_a_prompt_refused_once_built_says_what_it_cost(sidecar: Service) -> None:
    check = 'sidecar_refusal_work_seconds_count{check="built"}'
    before = metrics(sidecar.url)
    response = chat("built", sidecar.url, noise(4000, 2))  # thousands of tokens, few KB
    message = assert_error(response, 400)
    assert "takes at least" not in message and "even with all older turns left out" in message
    line = request_line(sidecar, "built")
    assert "byte_bound" not in line and line["refusal_ms"] > 0
    assert metrics(sidecar.url)[check] == before[check] + 1


def test_a_stream_keeps_getting_tokens_while_refusals_are_built(sidecar: Service) -> None:
    """Three clients loop over-long prompts (that the byte bound cannot rule out: the
    prompt process builds them) while another reply streams: refusals and tokens interleave,
    and the stream gets every token."""
    counted: list[int] = []  # the stream's pieces so far, read when each refusal came back
    pieces = 0
    started = threading.Event()

    def stream() -> None:
        nonlocal pieces
        body = {"input_text": "count", "max_new_tokens": 200, "min_new_tokens": 200}
        headers = {"X-Request-Id": "bystander"}
        url = sidecar.url + "/predict"
        with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as response:
            for _ in response.iter_text():
                pieces += 1
                started.set()

    def attack(seed: int) -> None:
        for round_ in range(3):
            content = noise(6 * CONTEXT, seed * 10 + round_)
            assert chat(f"attack-{seed}-{round_}", sidecar.url, content).status_code == 400
            counted.append(pieces)

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(60)
    first = pieces
    attackers = [threading.Thread(target=attack, args=(seed,)) for seed in range(3)]
    for thread in attackers:
        thread.start()
    for thread in attackers:
        thread.join()
    reader.join()
    lines = [request_line(sidecar, f"attack-{s}-{r}") for s in range(3) for r in range(3)]
    assert all(line["refusal_ms"] > 0 and "byte_bound" not in line for line in lines)
    assert all(line["outcome"] == "rejected" for line in lines)
    assert request_line(sidecar, "bystander")["generated_tokens"] == 200
    # The stream went on between the refusals: its count grew while they came back
    assert len(counted) == 9 and counted[-1] > first, (first, counted)


def test_the_reservation_gauge_follows_a_running_reply(sidecar: Service) -> None:
    body = {"input_text": "count", "max_new_tokens": 100, "min_new_tokens": 100}
    seen: list[float] = []
    with httpx.stream("POST", sidecar.url + "/predict", json=body, timeout=60) as response:
        for _ in response.iter_text():
            if not seen:
                seen.append(metrics(sidecar.url)["sidecar_kv_reserved_bytes"])
    assert seen[0] > 0  # reported when it started, not only when it ended
    assert metrics(sidecar.url)["sidecar_kv_reserved_bytes"] == 0


def test_a_prompt_process_that_dies_is_replaced(sidecar: Service) -> None:
    """The prompt process killed: the next chat starts a new one and is answered; the worker
    goes on (its pid, and the stream's own replies, are the same)."""
    started = [json.loads(x) for x in sidecar.log_lines() if "prompt process started" in x]
    os.kill(started[-1]["pid"], signal.SIGKILL)
    response = chat("after-kill", sidecar.url, "Hello again")
    assert response.status_code == 200, response.text
    again = [json.loads(x) for x in sidecar.log_lines() if "prompt process started" in x]
    assert len(again) == len(started) + 1
    assert metrics(sidecar.url)["sidecar_worker_restarts_total"] == 0
