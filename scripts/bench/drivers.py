"""The ways the benchmarks drive one generation, each timed the same way, and the prompts
they are given.

Every variant asks for exactly `new_tokens` tokens (greedy, EOS held off with a minimum length),
and reports time to first token, decode rate over the remaining tokens and total time, measured
from just before the request to the arrival of the last piece of text.

Prompts: `sized_messages(engine, tokens, shift)` is a one-turn chat of a given length whose text
starts with the number `shift`; two shifts differ from their first token on, so the sidecar's
conversation cache (or llama.cpp's) cannot reuse one for the other. Every timed request gets a
shift of its own unless it is meant to be cached.
"""

from __future__ import annotations

import json
import multiprocessing
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

WORDS = ("the", "model", "streams", "each", "token", "to", "the", "page", "as", "it", "decodes")


def words(count: int, shift: int) -> str:
    """`count` words after the number `shift`."""
    return f"{shift}. " + " ".join(WORDS[(i + shift) % len(WORDS)] for i in range(count))


def cpu_name() -> str:
    """The CPU's model name and how many CPUs this process may use (docs name both)."""
    from sidecar.model.cpus import cpu_budget

    name = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} ({cpu_budget().count} CPUs)"


def sized_messages(engine: ChatTokenizer, prompt_tokens: int, shift: int) -> list[dict[str, str]]:
    """A one-turn chat whose rendered prompt is `prompt_tokens` long (or just over)."""
    count = 1
    while True:
        messages = [{"role": "user", "content": words(count, shift)}]
        if len(engine.prompt_ids(messages)) >= prompt_tokens:
            return messages
        count += max(1, (prompt_tokens - len(engine.prompt_ids(messages))) // 2)


@dataclass
class Sample:
    variant: str
    rep: int
    ttft_s: float
    decode_tps: float
    total_s: float
    tokens: int
    status: int = 200
    cached_tokens: int | None = None  # the sidecar's X-Cached-Tokens
    text: str = ""  # the reply, where a caller needs it (bench_turns.py)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sample(variant: str, rep: int, start: float, first: float, last: float, tokens: int) -> Sample:
    decode_s = last - first
    # Tokens after the first one arrive during the decode phase.
    tps = (tokens - 1) / decode_s if tokens > 1 and decode_s > 0 else 0.0
    return Sample(variant, rep, first - start, tps, last - start, tokens)


class ChatTokenizer:
    """A model's tokenizer and chat template: the prompt ids the sidecar reads for a chat.

    `ChatTokenizer.load(folder)` reads the folder's tokenizer files only, not its weights."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, model_dir: str) -> ChatTokenizer:
        # Through the sidecar's engine module, which turns telemetry off before the import.
        from sidecar.model.engine import og

        return cls(og.Tokenizer(model_dir))

    def prompt_ids(self, messages: list[dict[str, str]]) -> Any:
        text = self.tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True)
        return self.tokenizer.encode(text)


class RawEngine(ChatTokenizer):
    """onnxruntime-genai in this process, no HTTP: the ceiling the services are held to.

    `session_options` None: onnxruntime-genai's defaults (what the sidecar ran with before it
    chose its own thread count); otherwise a genai_config `session_options` overlay, the
    sidecar's own (sidecar.model.cpus.session_options) for the honest ceiling.
    """

    def __init__(
        self, model_dir: str, session_options: dict[str, Any] | None, variant: str = "engine"
    ) -> None:
        # Through the sidecar's engine module, which turns telemetry off before the import.
        from sidecar.model.engine import og

        self._og = og
        self.variant = variant
        config = og.Config(model_dir)
        if session_options:
            overlay = {"model": {"decoder": {"session_options": session_options}}}
            config.overlay(json.dumps(overlay))
        self.model = og.Model(config)
        super().__init__(og.Tokenizer(self.model))

    def run(self, messages: list[dict[str, str]], new_tokens: int, rep: int) -> Sample:
        og = self._og
        start = time.perf_counter()
        ids = self.prompt_ids(messages)
        params = og.GeneratorParams(self.model)
        length = len(ids) + new_tokens
        params.set_search_options(max_length=length, min_length=length, do_sample=False)
        generator = og.Generator(self.model, params)
        stream = self.tokenizer.create_stream()
        generator.append_tokens(ids)
        first = last = 0.0
        count = 0
        while not generator.is_done():
            generator.generate_next_token()
            stream.decode(int(generator.get_next_tokens()[0]))
            count += 1
            last = time.perf_counter()
            if count == 1:
                first = last
        return _sample(self.variant, rep, start, first, last, count)


class EngineProcess:
    """A RawEngine in a child process: a second configuration beside the in-process one,
    without two sets of onnxruntime thread pools in one process or its memory in this one's
    peak RSS."""

    def __init__(self, model_dir: str, session_options: dict[str, Any] | None, variant: str):
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child, model_dir, session_options, variant), daemon=True
        )
        self._process.start()
        child.close()
        self._conn.recv()  # loaded

    def run(self, messages: list[dict[str, str]], new_tokens: int, rep: int) -> Sample:
        self._conn.send((messages, new_tokens, rep))
        sample: Sample = self._conn.recv()
        return sample

    def close(self) -> None:
        self._conn.send(None)
        self._process.join(10)


def _serve(
    conn: Connection, model_dir: str, session_options: dict[str, Any] | None, variant: str
) -> None:
    engine = RawEngine(model_dir, session_options, variant)
    conn.send("ready")
    while (job := conn.recv()) is not None:
        conn.send(engine.run(*job))


def _options(new_tokens: int) -> dict[str, int]:
    return {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens}


def via_sidecar(
    client: httpx.Client,
    url: str,
    messages: list[dict[str, str]],
    new_tokens: int,
    rep: int,
    variant: str = "sidecar",
    *,
    scope: str | None = None,
    request_id: str | None = None,
) -> Sample:
    """POST /predict: a text/plain stream; a 503 (queue full) is recorded, not raised.
    `scope`: the conversation cache's `cache_scope`; `request_id`: its X-Request-Id, which
    finds the request's log line (services.request_line)."""
    start = time.perf_counter()
    body: dict[str, Any] = {"messages": messages, **_options(new_tokens)}
    if scope is not None:
        body["cache_scope"] = scope
    headers = {"x-request-id": request_id} if request_id else None
    chunks: list[bytes] = []
    with client.stream("POST", url + "/predict", json=body, headers=headers) as response:
        if response.status_code != 200:
            response.read()
            return Sample(variant, rep, 0.0, 0.0, 0.0, 0, response.status_code)
        cached = response.headers.get("x-cached-tokens")
        first = last = 0.0
        for chunk in response.iter_raw():
            if not chunk:
                continue
            chunks.append(chunk)
            last = time.perf_counter()
            if not first:
                first = last
    # A text/plain stream carries no count; min_new_tokens == max_new_tokens pins it.
    sample = _sample(variant, rep, start, first, last, new_tokens)
    sample.cached_tokens = int(cached) if cached is not None else None
    sample.text = b"".join(chunks).decode("utf-8")
    return sample


def via_app(
    client: httpx.Client, url: str, messages: list[dict[str, str]], new_tokens: int, rep: int
) -> Sample:
    """POST /chat on main-app: NDJSON deltas relayed from the sidecar, then a done line."""
    start = time.perf_counter()
    body = {"messages": messages, **_options(new_tokens)}
    first = last = 0.0
    done = False
    with client.stream("POST", url + "/chat", json=body) as response:
        if response.status_code != 200:
            response.read()
            return Sample("app", rep, 0.0, 0.0, 0.0, 0, response.status_code)
        for line in response.iter_lines():
            if not line:
                continue
            event = json.loads(line)
            if "delta" in event:
                last = time.perf_counter()
                if not first:
                    first = last
            elif "done" in event:
                done = True
            elif "error" in event:
                raise RuntimeError(f"the app reported an error: {event['error']}")
    if not done:
        raise RuntimeError("the app's stream ended without a done line")
    # The done line counts text pieces, which can be fewer than tokens; the count is pinned.
    return _sample("app", rep, start, first, last, new_tokens)


def released_at_once(
    count: int, run: Callable[[httpx.Client, int], Sample], timeout: float = 1200
) -> tuple[list[Sample], float]:
    """`count` requests released together, each on a connection of its own (`run(client, i)`
    makes request i): their samples, in the order they ended, and the wall time of all."""
    samples: list[Sample] = []
    lock = threading.Lock()
    barrier = threading.Barrier(count)

    def one(i: int) -> None:
        with httpx.Client(timeout=timeout) as client:
            barrier.wait()
            sample = run(client, i)
        with lock:
            samples.append(sample)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return samples, time.perf_counter() - start
