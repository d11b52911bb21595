"""Per-row isolation of batched decode (issue 38, finding 1): whatever one reply's row does
(a temperature or a penalty at the edge of its range, logits that hold NaN, a sampler, stop
filter or model call that raises, a grammar in error) ends that reply alone, with its own error
event, counted in /metrics and logged by request id and exception type, never with its text;
the three replies decoded beside it in the same model calls all finish.

The real batched path of the real worker on the tiny model; tests/support/engines.py's
PoisonedEngine paces each step (so replies started one after another decode together) and
injects the faults the real model cannot make on demand."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.run import services
from scripts.run.services import Service
from tests.sidecar.support import assert_error, metrics, request_line
from tests.support.engines import (
    CALL_BUG,
    DEAD_GRAMMAR,
    NAN_ROW,
    SAMPLER_BUG,
    SECRET,
    STOPS_BUG,
    poisoned,
)

EVENTS = {"accept": "application/x-ndjson"}
V1 = "/v1/chat/completions"
HEALTHY_TOKENS = 600  # at 20 ms a step, longer than every poisoned request below together
POISONED_QUESTION = "Poisoned question about door code 7431"  # must reach no log line
SCHEMA_SECRET = "vault_combination_5512"  # a schema's property name: no log line either
GUIDED_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {
            "type": "object",
            "properties": {SCHEMA_SECRET: {"type": "string"}},
            "required": [SCHEMA_SECRET],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def poisoned_service(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-poisoned.log"
    with services.sidecar(
        tiny_model_dir, log, MAX_CONCURRENCY="4", DECODE_BATCH_ROWS="4", env=poisoned(0.02)
    ) as service:
        yield service


class Healthy(threading.Thread):
    """One long reply, streamed as NDJSON events."""

    def __init__(self, url: str, number: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.number = number
        self.events: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        body = {
            "input_text": f"Tell me a long story, number {self.number}.",
            "max_new_tokens": HEALTHY_TOKENS,
            "min_new_tokens": HEALTHY_TOKENS,
        }
        try:
            with httpx.stream(
                "POST", self.url + "/predict", json=body, headers=EVENTS, timeout=600
            ) as response:
                for line in response.iter_lines():
                    if line:
                        self.events.append(json.loads(line))
        except BaseException as exc:  # a cut-off stream: the test says so below
            self.error = exc

    @property
    def pieces(self) -> int:
        return sum(1 for event in self.events if "text" in event)

    @property
    def over(self) -> bool:
        return self.error is not None or (bool(self.events) and "text" not in self.events[-1])


def predict_events(url: str, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    response = httpx.post(url + "/predict", json=body, headers=EVENTS, timeout=120)
    assert response.status_code == 200, response.text
    lines = [json.loads(line) for line in response.text.splitlines()]
    return response.headers["x-request-id"], lines


def text_and_end(lines: list[dict[str, Any]]) -> tuple[str, str, int]:
    done = lines[-1]
    text = "".join(line.get("text", "") for line in lines)
    return text, done["finish_reason"], done["generated_tokens"]


def poisoned_body(marker: str) -> dict[str, Any]:
    return {"input_text": f"{marker} {POISONED_QUESTION}", "max_new_tokens": 40}


class Beside:
    """Three long healthy replies decoding while the body of the `with` runs; `check()` after
    each poisoned request records whether all three were still decoding (so the poisoned row
    shared their model calls); at the end all three must have finished, whole."""

    def __init__(self, url: str) -> None:
        self.healthy = [Healthy(url, n) for n in range(3)]
        self.overlapped: list[bool] = []

    def __enter__(self) -> Beside:
        for thread in self.healthy:
            thread.start()
        deadline = time.monotonic() + 120  # only so that a broken service fails, not hangs
        while not all(thread.pieces for thread in self.healthy):
            assert time.monotonic() < deadline, [t.events[-1:] for t in self.healthy]
            assert not any(t.over for t in self.healthy), [t.events[-1:] for t in self.healthy]
            time.sleep(0.05)
        return self

    def check(self) -> None:
        self.overlapped.append(not any(thread.over for thread in self.healthy))

    def __exit__(self, *exc_info: object) -> None:
        for thread in self.healthy:
            thread.join(timeout=300)
        if exc_info[0] is not None:
            return
        for thread in self.healthy:
            assert thread.error is None, thread.error
            done = thread.events[-1]
            assert done.get("done") is True, done
            assert (done["finish_reason"], done["generated_tokens"]) == ("length", HEALTHY_TOKENS)
        assert self.overlapped and all(self.overlapped), (
            "the healthy replies ended before the poisoned ones were decoded beside them"
        )


def test_a_temperature_below_the_floor_is_greedy_beside_other_replies(
    poisoned_service: Service,
) -> None:
    """1.8e-307 made the sampler divide the logits into inf, and NaN ended every reply of the
    decode step; below ipc.MIN_TEMPERATURE a request is greedy, on both APIs."""
    url = poisoned_service.url
    greedy_body = {"input_text": "Say something.", "max_new_tokens": 8, "min_new_tokens": 8}
    _, greedy = predict_events(url, greedy_body)
    greedy_v1 = {"messages": [{"role": "user", "content": "Say more."}], "max_tokens": 8}
    greedy_v1_choice = httpx.post(url + V1, json=greedy_v1, timeout=120).json()["choices"][0]
    with Beside(url) as beside:
        for temperature in (5e-324, 1.8e-307, 9e-6):
            _, lines = predict_events(url, {**greedy_body, "temperature": temperature})
            assert text_and_end(lines) == text_and_end(greedy), temperature
            beside.check()
            body = {**greedy_v1, "temperature": temperature, "seed": 5}
            response = httpx.post(url + V1, json=body, timeout=120)
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0] == greedy_v1_choice
            beside.check()


def test_penalties_are_bounded_where_their_float32_arithmetic_stays_finite(
    poisoned_service: Service,
) -> None:
    """repeat_penalty 7e-39 divided a logit into inf in float32 (NaN once sampled): refused
    below 0.1 (400 naming it); the bounds themselves decode beside other replies, sampled at
    the highest temperature."""
    url = poisoned_service.url
    body = {"messages": [{"role": "user", "content": "Say more."}], "max_tokens": 8}
    with Beside(url) as beside:
        for penalty in (7e-39, 1e-45, 0.05):
            refused = httpx.post(
                url + V1, json={**body, "repeat_penalty": penalty, "temperature": 1.0}, timeout=120
            )
            assert "repeat_penalty" in assert_error(refused, 400, "invalid_request_error")
            beside.check()
        for penalty in (0.1, 10.0):
            bounded = {**body, "repeat_penalty": penalty, "temperature": 2.0, "seed": 3}
            response = httpx.post(url + V1, json=bounded, timeout=120)
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["finish_reason"] == "length"
            beside.check()


def test_a_faulty_row_ends_alone_with_its_error_counted_and_logged_without_text(
    poisoned_service: Service,
) -> None:
    """Logits that hold NaN, a sampler, stop filter or model call that raises, a grammar in
    error: the row's reply ends with an error event (/predict's last line, /v1's 500), its
    request line says outcome error and the fault's type, the worker logs its request id and
    exception type (not the message), sidecar_reply_faults_total counts it, and the three
    replies decoded beside it finish."""
    url = poisoned_service.url
    before = metrics(url)
    faults: dict[str, str] = {}
    with Beside(url) as beside:
        for marker, kind in (
            (NAN_ROW, "NonFiniteLogits"),
            (SAMPLER_BUG, "IndexError"),
            (STOPS_BUG, "ValueError"),
            (CALL_BUG, "RuntimeError"),  # its row alone fails: the others' call is run again
        ):
            rid, lines = predict_events(url, poisoned_body(marker))
            assert [set(line) for line in lines] == [{"text"}] * (len(lines) - 1) + [{"error"}]
            assert lines[-1]["error"]["type"] == "generation_failed", marker
            assert SECRET not in json.dumps(lines)
            faults[rid] = kind
            beside.check()
        guided = {
            "messages": [{"role": "user", "content": f"{DEAD_GRAMMAR} {POISONED_QUESTION}"}],
            "max_tokens": 40,
            "response_format": GUIDED_FORMAT,
        }
        response = httpx.post(url + V1, json=guided, timeout=120)
        assert "generation failed" in assert_error(response, 500, "server_error")
        faults[response.headers["x-request-id"]] = "GrammarDeadEnd"
        beside.check()

    for rid, kind in faults.items():
        line = request_line(poisoned_service, rid)
        assert (line["outcome"], line["fault"]) == ("error", kind), line
    worker_lines = [
        json.loads(text)
        for text in poisoned_service.log_lines()
        if text.startswith("{") and '"generation failed"' in text
    ]
    assert {w["request_id"]: w["error_type"] for w in worker_lines} == faults
    assert all("error" not in w for w in worker_lines)  # the message: LOG_PROMPTS only
    after = metrics(url)
    faulted = after["sidecar_reply_faults_total"] - before["sidecar_reply_faults_total"]
    errors = 'sidecar_requests_total{outcome="error"}'
    assert (faulted, after[errors] - before[errors]) == (len(faults), len(faults))
    assert after["sidecar_ready"] == 1
    log = poisoned_service.log()
    for text in (SECRET, POISONED_QUESTION, SCHEMA_SECRET, "door code"):
        assert text not in log, text


def test_the_generator_path_keeps_the_same_greedy_rule(generator_sidecar_service: Service) -> None:
    """DECODE_BATCH_ROWS=1 (onnxruntime-genai's Generator): below the floor a request is greedy
    there too, for its search options and for the conversation cache's sampling mode (a seeded
    sampling request would start fresh: cache_reason "seeded")."""
    url = generator_sidecar_service.url
    body = {
        # more than a PREFILL_CHUNK: a regenerated reply reuses whole chunks of its prompt
        "input_text": "Tell me about the weather in Paris, and what to wear. " * 10,
        "max_new_tokens": 8,
        "min_new_tokens": 8,
        "cache_scope": "below-the-floor",
    }
    _, greedy = predict_events(url, body)
    rid, tiny = predict_events(url, {**body, "temperature": 5e-324, "seed": 11})
    assert text_and_end(tiny) == text_and_end(greedy)
    assert request_line(generator_sidecar_service, rid)["cache_reason"] == "reused"
