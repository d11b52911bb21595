"""Chunked prefill: a prompt is read PREFILL_CHUNK tokens per worker step, so the worker can
act between chunks (cancel, give other generations their turn), and the reply is the same as
with the whole prompt appended at once. Order of events is asserted, never durations."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import httpx
import pytest

from scripts.run.services import Service
from sidecar import ipc
from sidecar.model.batch.row import BatchGeneration
from sidecar.model.batch.step import ALONE_CHUNK
from sidecar.model.engine import load_engine
from sidecar.settings import Settings
from tests.sidecar import reference
from tests.sidecar.support import predict, request_line

NEW_TOKENS = 80
CONVERSATIONS = [
    [{"role": "user", "content": "Write a long poem about the sea. " * 12}],
    [
        {"role": "system", "content": "You are terse. " * 5},
        {"role": "user", "content": "Bonjour, ça va ? " * 6},
        {"role": "assistant", "content": "Oui, merci. こんにちは " * 6},
        {"role": "user", "content": "Continue the list: apples, pears," * 4},
    ],
]


def as_request(messages: list[dict[str, str]], max_new_tokens: int) -> ipc.Generate:
    pairs = tuple((m["role"], m["content"]) for m in messages)
    return ipc.Generate("prefill-test", pairs, max_new_tokens)  # type: ignore[arg-type]


@pytest.mark.parametrize("chunk", [16, 37, 100_000])  # 100_000: the whole prompt in one call
def test_a_chunked_prefill_gives_the_reference_reply(tiny_model_dir: Path, chunk: int) -> None:
    # Exact: PREFILL_CHUNK even for a prompt read alone (batch.step.chunk_for)
    settings = Settings(model_path=tiny_model_dir, prefill_chunk=chunk, prompt_cache_exact=True)
    engine = load_engine(settings)
    for messages in CONVERSATIONS:
        generation = engine.start(as_request(messages, NEW_TOKENS))
        ids = generation.prompt.ids
        assert ids == reference.prompt_ids(tiny_model_dir, messages)
        assert len(ids) > 5 * 16  # several chunks of the smallest size
        prefill_steps = 0
        while (text := generation.step()) is None:  # one chunk per step, no token yet
            prefill_steps += 1
            assert generation.generated == 0 and generation.finish is None
        assert prefill_steps == math.ceil(len(ids) / chunk)
        pieces = [text]
        while generation.finish is None:
            text = generation.step()
            assert text is not None  # once the prompt is in, every step is a token
            pieces.append(text)
        # The reference appends the whole prompt at once.
        expected = reference.generate(tiny_model_dir, messages, NEW_TOKENS)
        assert "".join(pieces) == expected.text
        assert generation.generated == len(expected.tokens)
        assert generation.finish == ("eos" if expected.eos else "length")


def test_a_prompt_read_alone_takes_fewer_calls_and_replies_the_same(tiny_model_dir: Path) -> None:
    """With nothing else to do the batch reads ALONE_CHUNK tokens a call (each call has a
    fixed cost), PREFILL_CHUNK as soon as another reply is there; the replies are the same."""
    engine = load_engine(Settings(model_path=tiny_model_dir, prefill_chunk=16))
    assert engine.batch is not None
    messages = CONVERSATIONS[0]
    alone = engine.start(as_request(messages, NEW_TOKENS), cached=False)
    steps = 0
    while (text := alone.step()) is None:
        steps += 1
    ids = alone.prompt.ids
    assert steps == math.ceil(len(ids) / max(16, ALONE_CHUNK)) == 1 < math.ceil(len(ids) / 16)
    pieces = [text]
    while alone.finish is None:
        pieces.append(alone.step() or "")
    alone.release(reusable=False)
    assert "".join(pieces) == reference.generate(tiny_model_dir, messages, NEW_TOKENS).text
    # Beside a reply that decodes, the prompt is read in PREFILL_CHUNK chunks again
    other = engine.start(as_request(CONVERSATIONS[1], NEW_TOKENS), cached=False)
    while other.prefilling or other.generated == 0:
        engine.batch.step()
    joining = engine.start(as_request(messages, NEW_TOKENS), cached=False)
    assert isinstance(joining, BatchGeneration) and engine.batch.chunk_for(joining) == 16
    other.release(reusable=False)
    joining.release(reusable=False)


LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 300  # ~3,300 tokens: ~100 chunks


def test_a_short_reply_streams_while_a_long_prompt_is_read(
    chunked_service: Service, small_model_dir: Path
) -> None:
    """MAX_CONCURRENCY=2, PREFILL_CHUNK=32: a short request that comes in during a long prefill
    takes turns with its chunks, so it is answered whole before the long reply's first byte.
    (With the prefill in one step it would wait for all of it.)"""
    url = chunked_service.url
    events: list[str] = []
    lock = threading.Lock()
    prefill_started = threading.Event()
    long_rid: list[str] = []

    def mark(event: str) -> None:
        with lock:
            events.append(event)

    def long_request() -> None:
        body = {"input_text": LONG_PROMPT, "max_new_tokens": 8, "min_new_tokens": 8}
        try:
            with httpx.stream("POST", url + "/predict", json=body, timeout=300) as response:
                assert response.status_code == 200
                long_rid.append(response.headers["x-request-id"])
                mark("long: headers")  # the worker has started the prefill
                prefill_started.set()
                received = b""
                for chunk in response.iter_raw():
                    if chunk and not received:
                        mark("long: first byte")
                    received += chunk
                if not received:  # (no text at all: its end stands for it)
                    mark("long: first byte")
        finally:
            prefill_started.set()

    thread = threading.Thread(target=long_request)
    thread.start()
    assert prefill_started.wait(120)
    short_messages = [{"role": "user", "content": "hello world"}]
    body = {"messages": short_messages, "max_new_tokens": 6, "min_new_tokens": 6}
    short = predict(url, body, timeout=300)
    mark("short: complete")
    thread.join(300)
    assert not thread.is_alive()

    assert short.status_code == 200
    assert events == ["long: headers", "short: complete", "long: first byte"], events
    # Interleaving changes neither reply: the short one is the reference reply, and the long
    # one's prefill steps were not counted as tokens.
    ids = reference.prompt_ids(small_model_dir, short_messages)
    options = {"do_sample": False, "min_length": len(ids) + 6}
    assert short.text == reference.generate(small_model_dir, short_messages, 6, **options).text
    short_line = request_line(chunked_service, short.headers["x-request-id"])
    assert short_line["generated_tokens"] == 6
    long_line = request_line(chunked_service, long_rid[0])
    assert long_line["outcome"] == "length"
    assert long_line["prompt_tokens"] > 3000
    assert long_line["generated_tokens"] == 8
