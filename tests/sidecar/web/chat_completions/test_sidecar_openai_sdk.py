"""OpenAI compatibility, as a client sees it: the official `openai` package (pinned) against the
real sidecar on the tiny model. Sync and async, streamed and not, usage, stop sequences, the
fields clients send that change nothing, errors raised as the SDK's exception classes, retries
on 503 with Retry-After, models.list()."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from scripts.run import services
from scripts.run.services import Service
from tests.support.engines import paced

PROMPT = "Tell me about the weather in Paris today, and what I should wear outside."
MESSAGES: list[Any] = [{"role": "user", "content": PROMPT}]


@pytest.fixture
def client(sidecar_service: Service) -> Iterator[OpenAI]:
    with OpenAI(base_url=sidecar_service.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def reply(client: OpenAI, **extra: Any) -> Any:
    return client.chat.completions.create(
        model="any", messages=extra.pop("messages", MESSAGES), max_tokens=40, **extra
    )


def test_models_list_and_retrieve(client: OpenAI, tiny_model_dir: Path) -> None:
    (model,) = list(client.models.list())
    assert model.id == tiny_model_dir.name and model.object == "model"
    assert client.models.retrieve(model.id).id == model.id
    with pytest.raises(openai.NotFoundError) as raised:
        client.models.retrieve("gpt-4o")
    assert raised.value.code == "model_not_found"


def test_a_completion_with_usage(client: OpenAI) -> None:
    completion = reply(client)
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens is not None


def test_a_stream_has_the_same_text_and_usage(client: OpenAI) -> None:
    whole = reply(client).choices[0].message.content
    stream = reply(client, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and set(finishes[:-1]) == {None}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_async_clients_stream_at_once(sidecar_service: Service) -> None:
    async def run() -> list[str]:
        async with AsyncOpenAI(
            base_url=sidecar_service.url + "/v1", api_key="unused", max_retries=0
        ) as client:

            async def one(question: str) -> str:
                stream = await client.chat.completions.create(
                    model="any",
                    messages=[{"role": "user", "content": question}],
                    max_tokens=24,
                    stream=True,
                )
                return "".join([c.choices[0].delta.content or "" async for c in stream])

            whole = await client.chat.completions.create(
                model="any", messages=[{"role": "user", "content": "one"}], max_tokens=24
            )
            texts = await asyncio.gather(one("one"), one("two"), one("three"))
            assert texts[0] == whole.choices[0].message.content
            return list(texts)

    assert all(asyncio.run(run()))


def test_stop_sequences_end_the_reply_where_they_begin(client: OpenAI) -> None:
    """A stop string (here four characters of the reply, which spans tokens) ends the reply
    before it; no part of it is ever shown, streamed or not."""
    whole = reply(client).choices[0].message.content
    assert whole and len(whole) > 20
    stop = whole[10:14]
    expected = whole[: whole.find(stop)]
    stopped = reply(client, stop=stop)
    assert stopped.choices[0].message.content == expected
    assert stopped.choices[0].finish_reason == "stop"
    chunks = list(reply(client, stop=[stop, "never-in-this-reply"], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    unmatched = reply(client, stop=["never-in-this-reply"]).choices[0]
    assert unmatched.message.content == whole  # held-back text is shown after all


def test_fields_that_change_nothing_are_accepted(client: OpenAI) -> None:
    system = [{"role": "system", "content": "Be brief."}, *MESSAGES]
    developer = [{"role": "developer", "content": "Be brief.", "name": "ops"}]
    developer += [{"role": "user", "content": PROMPT, "name": "alice"}]
    expected = reply(client, messages=system).choices[0].message.content
    answer = reply(
        client,
        messages=developer,
        metadata={"ticket": "42"},
        store=True,
        parallel_tool_calls=False,
        user="alice",
        n=1,
        logprobs=False,
        stream=False,
    )
    assert answer.choices[0].message.content == expected


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"temperature": 5}, "temperature", "invalid_value"),
        ({"presence_penalty": 0.5}, "presence_penalty", "invalid_value"),
        ({"messages": [{"role": "user", "content": "x " * 5000}]}, None, "context_length_exceeded"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    ],
    ids=["temperature", "penalty", "context", "stops"],
)
def test_errors_are_the_sdks_bad_request(
    client: OpenAI, extra: dict[str, Any], param: str | None, code: str
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        reply(client, **extra)
    error = raised.value
    assert error.status_code == 400 and error.code == code and error.param == param
    assert error.type == "invalid_request_error"


def test_a_cache_key_shows_as_cached_tokens(client: OpenAI) -> None:
    """The same long prompt again: its whole prefill chunks (64 tokens) come from the cache."""
    long = [{"role": "user", "content": PROMPT * 4}]
    first = reply(client, messages=long, prompt_cache_key="sdk-key").usage
    again = reply(client, messages=long, prompt_cache_key="sdk-key").usage
    assert first is not None and again is not None
    assert again.prompt_tokens_details is not None
    assert (again.prompt_tokens_details.cached_tokens or 0) > 0


def test_the_sdk_retries_a_loading_model_after_retry_after(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """503 + Retry-After while the model loads: the SDK waits as asked and tries again."""
    env = paced(pace=0.0, load_delay=4.0)
    with services.sidecar(tiny_model_dir, tmp_path / "sidecar.log", env=env, wait=False) as sc:
        time.sleep(0.5)  # the port is open, the model is not
        with OpenAI(base_url=sc.url + "/v1", api_key="unused", max_retries=4) as client:
            began = time.monotonic()
            completion = reply(client)
            assert completion.choices[0].message.content
            assert time.monotonic() - began >= 3  # it waited for the model, not failed
        refused = [line for line in sc.log_lines() if '"status": 503' in line]
        assert refused and all('"path": "/v1/chat/completions"' in line for line in refused)


def test_a_wrong_key_is_the_sdks_authentication_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    with services.sidecar(tiny_model_dir, tmp_path / "sidecar.log", API_KEY="right") as sc:
        with OpenAI(base_url=sc.url + "/v1", api_key="wrong", max_retries=0) as client:
            with pytest.raises(openai.AuthenticationError) as raised:
                client.models.list()
            assert raised.value.code == "invalid_api_key"
        with OpenAI(base_url=sc.url + "/v1", api_key="right", max_retries=0) as client:
            assert reply(client).choices[0].message.content
