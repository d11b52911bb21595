"""Log probabilities and /v1/completions, as the pinned `openai` SDK sees them, on both decode
paths (batched, the default, and the Generator path): the values are a log-softmax of the
model's own logits (the reference is computed here, with onnxruntime-genai on the same tiny
model, greedy), a guided reply's values are the same on both paths (the Generator path's mask
comes from a matcher of its own), and what may not be combined is refused."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og
import openai
import pytest
from openai import OpenAI

from scripts.run.services import Service

# Token ids of the tiny model's vocabulary: a plain prompt, read as it is (no template).
PROMPT_IDS = [1, 433, 347, 918, 81, 985, 12, 100, 200, 57, 640]
MESSAGES: list[Any] = [{"role": "user", "content": "Tell me about the weather in Paris."}]
END_IDS = (1013, 1014, 1020)  # the tiny model's genai_config.json eos_token_id


@pytest.fixture(params=["batched", "generator"])
def service(request: pytest.FixtureRequest) -> Service:
    name = "sidecar_service" if request.param == "batched" else "generator_sidecar_service"
    found: Service = request.getfixturevalue(name)
    return found


def sdk(service: Service) -> OpenAI:
    return OpenAI(base_url=service.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
def client(service: Service) -> Iterator[OpenAI]:
    with sdk(service) as client:
        yield client


def reference(model_dir: Path, ids: list[int], steps: int) -> list[tuple[int, np.ndarray]]:
    """Greedy decoding of `ids` by onnxruntime-genai itself: each token and the log-softmax of
    the logits it was chosen from (up to, not including, the end token)."""
    model = og.Model(str(model_dir))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + steps + 1, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    out = []
    for _ in range(steps):
        logits = np.asarray(generator.get_logits(), dtype=np.float64).reshape(-1)
        shifted = logits - logits.max()
        logprobs = shifted - np.log(np.exp(shifted).sum())
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        if token in END_IDS:
            break
        out.append((token, logprobs))
    return out


def test_completion_logprobs_are_the_softmax_of_the_logits(
    client: OpenAI, tiny_model_dir: Path
) -> None:
    completion = client.completions.create(
        model="any", prompt=PROMPT_IDS, max_tokens=10, logprobs=5
    )
    choice = completion.choices[0]
    assert choice.logprobs is not None
    got = choice.logprobs
    expected = reference(tiny_model_dir, PROMPT_IDS, 10)
    assert got.token_logprobs is not None and got.top_logprobs is not None
    assert len(got.token_logprobs) == len(expected) > 3
    for value, top, (token, logprobs) in zip(
        got.token_logprobs, got.top_logprobs, expected, strict=True
    ):
        assert value == pytest.approx(logprobs[token], abs=1e-5)
        assert value == pytest.approx(logprobs.max(), abs=1e-5)  # greedy: the most likely
        best = np.sort(logprobs)[::-1][:5]
        assert sorted(top.values(), reverse=True) == pytest.approx(best[: len(top)], abs=1e-5)
    assert "".join(got.tokens or []) == choice.text
    assert got.text_offset is not None and got.text_offset[0] == 0
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens == len(PROMPT_IDS)


def test_a_temperature_divides_the_logits(client: OpenAI, tiny_model_dir: Path) -> None:
    """A sampled token's values: the log-softmax of the logits divided by the temperature."""
    completion = client.completions.create(
        model="any", prompt=PROMPT_IDS, max_tokens=1, logprobs=5, temperature=0.5, seed=7
    )
    got = completion.choices[0].logprobs
    assert got is not None and got.top_logprobs is not None
    model = og.Model(str(tiny_model_dir))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT_IDS) + 2, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(PROMPT_IDS)
    scaled = np.asarray(generator.get_logits(), dtype=np.float64).reshape(-1) / 0.5
    scaled -= scaled.max()
    expected = np.sort(scaled - np.log(np.exp(scaled).sum()))[::-1][:5]
    assert sorted(got.top_logprobs[0].values(), reverse=True) == pytest.approx(expected, abs=1e-5)


def test_penalised_logprobs_are_the_same_on_both_paths(
    sidecar_service: Service, generator_sidecar_service: Service
) -> None:
    """llama.cpp's repeat_penalty is applied before the values are taken, as the Generator
    applies it (and it changes them)."""
    services = (sidecar_service, generator_sidecar_service)
    penalised = on_both_paths(
        services, max_tokens=16, top_logprobs=3, extra_body={"repeat_penalty": 1.5}
    )
    batched, generator = ([(i.token, round(i.logprob, 5)) for i in c] for c in penalised)
    assert batched == generator
    (plain,) = on_both_paths(services[:1], max_tokens=16)
    assert [(i.token, round(i.logprob, 5)) for i in plain] != batched


def test_a_text_prompt_is_read_without_a_template(client: OpenAI) -> None:
    """A string prompt and its own token ids give the same completion; echo puts the prompt
    in front of it, streamed too."""
    text = "The weather in Paris is"
    whole = client.completions.create(model="any", prompt=text, max_tokens=8)
    prompt_tokens = whole.usage.prompt_tokens if whole.usage else 0
    assert 0 < prompt_tokens < len(text)  # the text's own tokens: no chat template around them
    echoed = client.completions.create(model="any", prompt=[text], max_tokens=8, echo=True)
    assert echoed.choices[0].text == text + whole.choices[0].text
    chunks = list(
        client.completions.create(
            model="any",
            prompt=text,
            max_tokens=8,
            echo=True,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == echoed.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) == {None}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_completions_default_to_sixteen_tokens(client: OpenAI) -> None:
    """OpenAI's default max_tokens for this API."""
    completion = client.completions.create(model="any", prompt=PROMPT_IDS, stop=None)
    usage = completion.usage
    assert usage is not None and usage.completion_tokens <= 16


def test_chat_logprobs_stream_and_not(client: OpenAI) -> None:
    """Each content token's log probability and its alternatives, best first; greedy picks
    the first; streamed, the same entries arrive with the text they make."""
    whole = client.chat.completions.create(
        model="any", messages=MESSAGES, max_tokens=12, logprobs=True, top_logprobs=3
    )
    choice = whole.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    content = choice.logprobs.content
    for item in content:
        values = [alternative.logprob for alternative in item.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert item.logprob == pytest.approx(values[0]) and item.logprob < 0
        assert bytes(item.bytes or []).decode("utf-8", "backslashreplace") == item.token
    text = b"".join(bytes(item.bytes or []) for item in content).decode()
    assert text == choice.message.content
    chunks = list(
        client.chat.completions.create(
            model="any",
            messages=MESSAGES,
            max_tokens=12,
            logprobs=True,
            top_logprobs=3,
            stream=True,
        )
    )
    streamed = [
        item
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for item in c.choices[0].logprobs.content or ()
    ]
    assert [(i.token, i.logprob) for i in streamed] == [(i.token, i.logprob) for i in content]
    plain = client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=12)
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == choice.message.content


def test_a_stop_sequence_keeps_its_tokens_out(client: OpenAI) -> None:
    """Nothing of a stop string is shown, not even as a token of the log probabilities."""
    whole = client.chat.completions.create(
        model="any", messages=MESSAGES, max_tokens=24, logprobs=True
    )
    reply_text = whole.choices[0].message.content or ""
    assert len(reply_text) > 12
    stop = reply_text[8:12]
    stopped = client.chat.completions.create(
        model="any", messages=MESSAGES, max_tokens=24, logprobs=True, stop=stop
    ).choices[0]
    shown = stopped.message.content or ""
    assert stopped.finish_reason == "stop" and shown == reply_text[: reply_text.find(stop)]
    assert stopped.logprobs is not None
    tokens = b"".join(bytes(i.bytes or []) for i in stopped.logprobs.content or ())
    assert shown.encode().startswith(tokens) and stop.encode() not in tokens


def on_both_paths(services: tuple[Service, ...], **extra: Any) -> list[Any]:
    """The chat reply's log probabilities on each decode path (batched, Generator)."""
    contents = []
    for service in services:
        with sdk(service) as client:
            completion = client.chat.completions.create(
                model="any", messages=MESSAGES, logprobs=True, **extra
            )
        logprobs = completion.choices[0].logprobs
        assert logprobs is not None and logprobs.content
        contents.append(logprobs.content)
    return contents


def test_guided_logprobs_are_the_same_on_both_paths(
    sidecar_service: Service, generator_sidecar_service: Service
) -> None:
    """With a grammar, the values describe the masked distribution: tokens it forces have
    log probability 0, the alternatives are only tokens it allows; the Generator path (its
    mask from a matcher of its own) gives what the batched path gives."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    contents = on_both_paths(
        (sidecar_service, generator_sidecar_service),
        max_tokens=30,
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
        top_logprobs=4,
    )
    for content in contents:
        forced = [i for i in content if i.token in ('{"', "{", '"', "a", '":', ":")]
        assert forced and all(i.logprob == 0 for i in forced)
        for item in content:
            assert sum(math.exp(a.logprob) for a in item.top_logprobs) <= 1 + 1e-9
    batched, generator = ([(i.token, round(i.logprob, 6)) for i in c] for c in contents)
    assert batched == generator


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        (
            {
                "logprobs": True,
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            "logprobs",
        ),
    ],
    ids=["too-many", "without-logprobs", "with-tools"],
)
def test_logprobs_refusals(sidecar_service: Service, extra: dict[str, Any], param: str) -> None:
    with sdk(sidecar_service) as client, pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="any", messages=MESSAGES, **extra)
    assert raised.value.param == param and raised.value.code == "invalid_value"


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"prompt": ["one", "two"]}, "prompt", "invalid_value"),
        ({"prompt": []}, "prompt", "invalid_value"),
        ({"prompt": [1, 5000]}, None, "invalid_prompt"),
        ({"prompt": "x", "echo": True, "logprobs": 1}, "echo", "invalid_value"),
        ({"prompt": [1, 2], "echo": True}, "echo", "invalid_value"),
        ({"prompt": "x", "logprobs": 21}, "logprobs", "invalid_value"),
        ({"prompt": "x", "n": 2}, "n", "invalid_value"),
        ({"prompt": "x", "suffix": "y"}, "suffix", "invalid_value"),
        ({"prompt": "x " * 5000}, None, "context_length_exceeded"),
    ],
    ids=["two", "empty", "id-past-vocab", "echo-logprobs", "echo-ids", "top", "n", "suffix", "ctx"],
)
def test_completions_refusals(
    sidecar_service: Service, extra: dict[str, Any], param: str | None, code: str
) -> None:
    with sdk(sidecar_service) as client, pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model="any", **extra)
    assert raised.value.param == param and raised.value.code == code
