"""llama.cpp's server fields on /v1/chat/completions
(sidecar/web/chat_completions/llamacpp_fields.py), against a real sidecar on the tiny model: each
mapped field does what llama.cpp says it does, the ignored ones change nothing, and a conflict or
a wrong type is OpenAI's 400 naming the field."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.models.make_model import EOS_PROMPT, LONG_PROMPT
from scripts.run.services import Service
from tests.sidecar import reference
from tests.sidecar.support import assert_error, request_line

PATH = "/v1/chat/completions"


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def complete(url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(url + PATH, json=body, timeout=60)
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    data["request_id"] = response.headers["x-request-id"]
    return data


def content(completion: dict[str, Any]) -> str:
    return str(completion["choices"][0]["message"]["content"])


def cached_tokens(completion: dict[str, Any]) -> int:
    return int(completion["usage"]["prompt_tokens_details"]["cached_tokens"])


def unique_prompt() -> str:
    """A prompt no other test sent, so the shared sidecar's cache holds nothing of it, and
    long enough (several PREFILL_CHUNKs) that asking it again reuses its cached tokens."""
    return f"({uuid.uuid4().hex[:8]}) " + "The quick brown fox jumps over the lazy dog. " * 20


def test_n_predict_is_the_replys_length_limit(
    sidecar_service: Service, tiny_model_dir: Path
) -> None:
    cut = reference.generate(tiny_model_dir, user(LONG_PROMPT), 7)
    assert not cut.eos
    completion = complete(sidecar_service.url, {"messages": user(LONG_PROMPT), "n_predict": 7})
    assert content(completion) == cut.text
    assert completion["usage"]["completion_tokens"] == 7
    assert completion["choices"][0]["finish_reason"] == "length"
    # The same value in OpenAI's field as well is no conflict.
    for name in ("max_tokens", "max_completion_tokens"):
        body = {"messages": user(LONG_PROMPT), "n_predict": 7, name: 7}
        assert content(complete(sidecar_service.url, body)) == cut.text


def test_n_predict_minus_one_is_the_default_length(
    sidecar_service: Service, tiny_model_dir: Path
) -> None:
    ended = reference.generate(tiny_model_dir, user(EOS_PROMPT), 64)
    assert ended.eos
    body = {"messages": user(EOS_PROMPT), "n_predict": -1}
    completion = complete(sidecar_service.url, body)
    assert content(completion) == ended.text
    assert completion["choices"][0]["finish_reason"] == "stop"
    # -1 beside max_tokens: max_tokens decides.
    limited = complete(sidecar_service.url, {**body, "max_tokens": 2})
    assert limited["usage"]["completion_tokens"] == 2


def test_cache_prompt_false_neither_reads_nor_leaves_the_conversation_cache(
    sidecar_service: Service,
) -> None:
    prompt = unique_prompt()
    body = {"messages": user(prompt), "max_tokens": 5}
    # Left nothing: the same prompt right after it finds nothing cached.
    uncached = complete(sidecar_service.url, {**body, "cache_prompt": False})
    assert cached_tokens(uncached) == 0
    first = complete(sidecar_service.url, body)
    assert cached_tokens(first) == 0
    # Reads nothing: the prompt is cached now, and cache_prompt false still reads it in full.
    assert cached_tokens(complete(sidecar_service.url, body)) > 0
    again = complete(sidecar_service.url, {**body, "cache_prompt": False})
    assert cached_tokens(again) == 0
    assert content(again) == content(uncached) == content(first)
    line = request_line(sidecar_service, again["request_id"])
    assert line["cached_tokens"] == 0 and line["outcome"] == "length"
    # true is llama.cpp's default: the cache as usual.
    assert cached_tokens(complete(sidecar_service.url, {**body, "cache_prompt": True})) > 0


def test_repeat_penalty_is_onnxruntime_genais_repetition_penalty(
    sidecar_service: Service, tiny_model_dir: Path
) -> None:
    # A prompt whose greedy reply repeats itself within 40 tokens, so that the penalty shows:
    # the tiny model does for most prompts, not all (one in a fresh clone's run did not)
    for _ in range(5):
        messages = user(unique_prompt())
        greedy = reference.generate(tiny_model_dir, messages, 40)
        penalised = reference.generate(
            tiny_model_dir, messages, 40, do_sample=False, repetition_penalty=3.0
        )
        if penalised.text != greedy.text:
            break
    assert penalised.text != greedy.text
    body = {"messages": messages, "max_tokens": 40}
    assert content(complete(sidecar_service.url, {**body, "repeat_penalty": 3.0})) == (
        penalised.text
    )
    # The penalised reply left its generator in the cache; the next request continues it
    # without the penalty (each turn sets its own), and 1.0 is off.
    plain = complete(sidecar_service.url, body)
    assert cached_tokens(plain) > 0
    assert content(plain) == greedy.text
    assert content(complete(sidecar_service.url, {**body, "repeat_penalty": 1.0})) == greedy.text


def test_llamacpps_off_values_are_as_absent(sidecar_service: Service) -> None:
    body = {"messages": user("Tell me a story."), "max_tokens": 20}
    greedy = content(complete(sidecar_service.url, body))
    assert content(complete(sidecar_service.url, {**body, "top_k": 0, "seed": -1})) == greedy
    sampled = {**body, "temperature": 1.5, "seed": 11}
    assert content(complete(sidecar_service.url, {**sampled, "top_k": 0})) == content(
        complete(sidecar_service.url, sampled)
    )


IGNORED = {
    "min_p": 0.05,
    "typical_p": 1.0,
    "repeat_last_n": 64,
    "mirostat": 2,
    "mirostat_tau": 5.0,
    "dry_multiplier": 0.5,
    "dry_sequence_breakers": ["\n", ":"],
    "xtc_probability": 0.1,
    "samplers": ["top_k", "temperature"],
    "n_keep": -1,
    "n_cache_reuse": 256,
    "id_slot": -1,
    "n_probs": 5,
    "return_tokens": True,
    "timings_per_token": False,
    "t_max_predict_ms": 1000,
}


def test_the_ignored_fields_change_nothing(sidecar_service: Service) -> None:
    body = {"messages": user("Hello there"), "max_tokens": 12}
    plain = complete(sidecar_service.url, body)
    with_all = complete(sidecar_service.url, {**body, **IGNORED})
    assert content(with_all) == content(plain)
    assert set(with_all) == set(plain)  # no llama.cpp extras (timings, tokens, probs)


INVALID: dict[str, tuple[dict[str, Any], str]] = {
    "n-predict-vs-max-tokens": ({"n_predict": 150, "max_tokens": 100}, "n_predict"),
    "n-predict-vs-max-completion-tokens": (
        {"n_predict": 150, "max_completion_tokens": 100},
        "n_predict",
    ),
    "n-predict-zero": ({"n_predict": 0}, "n_predict"),
    "n-predict-below-minus-one": ({"n_predict": -2}, "n_predict"),
    "n-predict-a-string": ({"n_predict": "150"}, "n_predict"),
    "n-predict-too-large": ({"n_predict": 10**9}, "n_predict"),
    "cache-prompt-a-string": ({"cache_prompt": "false"}, "cache_prompt"),
    "repeat-penalty-zero": ({"repeat_penalty": 0}, "repeat_penalty"),
    "repeat-penalty-too-large": ({"repeat_penalty": 11}, "repeat_penalty"),
    # float32 arithmetic: 7e-39 divided a logit into inf (issue 38); bounded at 0.1 to 10
    "repeat-penalty-tiny": ({"repeat_penalty": 7e-39}, "repeat_penalty"),
    "repeat-penalty-below-a-tenth": ({"repeat_penalty": 0.05}, "repeat_penalty"),
    "ignored-with-a-wrong-type": ({"min_p": "0.05"}, "min_p"),
    "ignored-flag-not-a-bool": ({"return_tokens": 1}, "return_tokens"),
    "unknown-llamacpp-field": ({"grammar": "root ::= [a-z]+"}, "grammar"),
    "ignore-eos-is-not-ignored": ({"ignore_eos": True}, "ignore_eos"),
}


@pytest.mark.parametrize(("fields", "param"), INVALID.values(), ids=INVALID.keys())
def test_conflicts_and_wrong_values_are_openais_400_naming_the_field(
    sidecar_service: Service, fields: dict[str, Any], param: str
) -> None:
    response = httpx.post(
        sidecar_service.url + PATH, json={"messages": user("Hi"), **fields}, timeout=30
    )
    message = assert_error(response, 400, "invalid_request_error")
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_value", param), error
    assert param in message
    if "max_tokens" in fields or "max_completion_tokens" in fields:
        other = "max_tokens" if "max_tokens" in fields else "max_completion_tokens"
        assert other in message and "150" in message and "100" in message
