"""Prompt-lookup drafts (PROMPT_LOOKUP_TOKENS) on the Generator path (DECODE_BATCH_ROWS=1: the
batched path's drafts are tests/sidecar/model/batch/test_sidecar_batch_drafts.py's) through the
real sidecar on `tiny`: greedy replies are the same with drafts on and off, over both APIs and
across the turns of a cached conversation; the drafts are really checked and accepted, and say
so in the log line, /metrics and the OpenAI usage; a sampled request is decoded without them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.models import make_model
from scripts.run import services
from scripts.run.services import Service
from tests.sidecar.support import request_line

MAX_NEW = 64
# Replies that repeat themselves (the tiny model falls into loops) and one that copies its
# prompt: both give n-gram hits; the EOS prompt ends early.
PROMPTS = (
    make_model.LONG_PROMPT,
    "Hi",
    make_model.EOS_PROMPT,
    "Repeat after me: one two three four, one two three four, one two three four.",
)


@pytest.fixture(scope="module")
def pair(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Service, Service]]:
    logs = tmp_path_factory.mktemp("logs")
    generator = {"DECODE_BATCH_ROWS": "1", "MAX_CONCURRENCY": "1"}  # the Generator path
    with (
        services.sidecar(
            tiny_model_dir, logs / "on.log", env={**generator, "PROMPT_LOOKUP_TOKENS": "4"}
        ) as on,
        services.sidecar(
            tiny_model_dir, logs / "off.log", env={**generator, "PROMPT_LOOKUP_TOKENS": "0"}
        ) as off,
    ):
        yield on, off


def ask(service: Service, messages: list[dict[str, str]], **options: Any) -> httpx.Response:
    body = {"messages": messages, "max_new_tokens": MAX_NEW, **options}
    response = httpx.post(service.url + "/predict", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response


def predict(service: Service, messages: list[dict[str, str]], **options: Any) -> str:
    return ask(service, messages, **options).text


def line_of(service: Service, response: httpx.Response) -> dict[str, Any]:
    """The request's log line (written just after its last byte: waited for)."""
    return request_line(service, response.headers["x-request-id"])


def metric(service: Service, name: str) -> float:
    text = httpx.get(service.url + "/metrics", timeout=10).text
    match = re.search(rf"^sidecar_{name} (\S+)$", text, re.M)
    assert match, name
    return float(match.group(1))


def test_greedy_replies_are_the_same_with_drafts_on_and_off(pair: tuple[Service, Service]) -> None:
    on, off = pair
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        assert predict(on, messages) == predict(off, messages), prompt
    assert metric(on, "draft_tokens_accepted_total") > 0  # drafts really happened
    assert metric(off, "draft_tokens_total") == 0
    checked, accepted = metric(on, "draft_tokens_total"), metric(on, "draft_tokens_accepted_total")
    assert accepted <= checked
    tokens, steps = metric(on, "draft_reply_tokens_total"), metric(on, "draft_reply_steps_total")
    assert steps > 0 and tokens > 0


def test_a_cached_conversation_is_the_same_with_drafts(pair: tuple[Service, Service]) -> None:
    """Turns continue a cached generator (rewound, its draft history resynced)."""
    histories: list[list[dict[str, str]]] = [[], []]
    for turn in ("Hello", "Tell me more.", "And then?"):
        replies = []
        for service, history in zip(pair, histories, strict=True):
            history.append({"role": "user", "content": turn})
            reply = predict(service, history)
            history.append({"role": "assistant", "content": reply})
            replies.append(reply)
        assert replies[0] == replies[1], turn


def test_the_log_line_says_what_the_drafts_did(pair: tuple[Service, Service]) -> None:
    on, off = pair
    line = line_of(on, ask(on, [{"role": "user", "content": make_model.LONG_PROMPT}]))
    assert line["draft_tokens"] >= line["accepted_draft_tokens"] >= 0
    # Below 1 when rejected drafts cost calls of their own; at most 1 + the draft length.
    assert 0 < line["tokens_per_step"] <= 5
    off_line = line_of(off, ask(off, [{"role": "user", "content": make_model.LONG_PROMPT}]))
    assert "draft_tokens" not in off_line


def test_sampled_requests_are_decoded_without_drafts(pair: tuple[Service, Service]) -> None:
    on, _ = pair
    line = line_of(on, ask(on, [{"role": "user", "content": "Hi"}], temperature=0.8, seed=7))
    assert line["outcome"] in ("eos", "length") and "draft_tokens" not in line


def test_openai_usage_reports_accepted_and_rejected_drafts(pair: tuple[Service, Service]) -> None:
    on, off = pair
    body = {"messages": [{"role": "user", "content": make_model.LONG_PROMPT}], "max_tokens": 48}
    responses = []
    for service in (on, off):
        response = httpx.post(service.url + "/v1/chat/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        responses.append(response)
    usages = [response.json()["usage"] for response in responses]
    details = usages[0]["completion_tokens_details"]
    line = line_of(on, responses[0])
    assert details == {
        "accepted_prediction_tokens": line["accepted_draft_tokens"],
        "rejected_prediction_tokens": line["draft_tokens"] - line["accepted_draft_tokens"],
    }
    assert "completion_tokens_details" not in usages[1]
    assert usages[0]["completion_tokens"] == usages[1]["completion_tokens"]
