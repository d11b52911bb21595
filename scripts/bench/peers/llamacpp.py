"""llama.cpp's own server (llama-server) as a benchmark variant, timed like ours.

The server is the binary scripts/bench/peers/build_llamacpp.sh installs next to this venv's Python
(`make peers`). Each generation goes through `POST /completion`, streamed, with the prompt as
token ids (the ids our tokenizer gives for the rendered chat, so both engines read exactly the
same prompt), greedy (`temperature` 0, `top_k` 1), exactly `n_predict` tokens with the end of
the reply held off (`ignore_eos`, as our variants use `min_new_tokens`). Time to first token,
decode rate and total are measured from just before the request to the arrival of each event,
as scripts/bench/drivers.py does for ours; the server's own timings are kept beside them.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.drivers import Sample, _sample
from scripts.run import services

VARIANT = "llamacpp"


def server_binary() -> Path:
    """Where `make peers` installs llama-server: beside this venv's Python."""
    return Path(sys.executable).parent / "llama-server"


def version(binary: Path | None = None) -> str:
    """llama-server's own version line, e.g. 'version: 0.5.0-dev (build 1, commit 0c1e570)'."""
    binary = binary or server_binary()
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("version")]
    return lines[0] if lines else "unknown"


def server_args(gguf: Path, *, threads: int, slots: int, context: int, port: int) -> list[str]:
    """llama-server's command line: its defaults, except what must match ours.

    `-t`/`-tb`: our sidecar's thread count for decode and for prompt processing; `-np`: as
    many slots as the most simultaneous users measured; `-c`: the KV cache shared by the slots
    (unified), sized to the longest request; no GPU layers, no web UI."""
    return [
        str(server_binary()),
        "--model",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--threads",
        str(threads),
        "--threads-batch",
        str(threads),
        "--parallel",
        str(slots),
        "--kv-unified",
        "--ctx-size",
        str(context),
        "--n-gpu-layers",
        "0",
        "--no-webui",
    ]


@contextlib.contextmanager
def server(
    gguf: Path, log_path: Path, *, threads: int, slots: int, context: int
) -> Iterator[services.Service]:
    """llama-server on a free loopback port; waits for GET /health (200 once loaded)."""
    gguf = gguf.resolve()  # it runs in the GGUF's folder, where a relative path means another
    port = services.free_port()
    cmd = server_args(gguf, threads=threads, slots=slots, context=context, port=port)
    with services.run_service(
        cmd,
        cwd=gguf.parent,
        env={},
        ready_path="/health",
        port=port,
        log_path=log_path,
        timeout=600,
    ) as service:
        yield service


def complete(
    client: httpx.Client,
    url: str,
    prompt_ids: Sequence[int],
    new_tokens: int,
    rep: int,
    *,
    cache_prompt: bool = False,
) -> tuple[Sample, dict[str, Any]]:
    """One streamed generation; returns the sample (its `text`: the reply) and the server's
    final `timings` (`cache_n`: prompt tokens reused from the slot's cache, `prompt_n`: tokens
    processed)."""
    body = {
        "prompt": [int(i) for i in prompt_ids],
        "n_predict": new_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "top_k": 1,
        "cache_prompt": cache_prompt,
        "stream": True,
    }
    start = time.perf_counter()
    first = last = 0.0
    final: dict[str, Any] = {}
    pieces: list[str] = []
    with client.stream("POST", url + "/completion", json=body) as response:
        if response.status_code != 200:
            response.read()
            return Sample(VARIANT, rep, 0.0, 0.0, 0.0, 0, response.status_code), {}
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[len("data: ") :])
            now = time.perf_counter()
            pieces.append(event.get("content") or "")
            if event.get("stop"):
                final = event
                if event.get("content"):  # a last piece held back for a whole character
                    last = now
                break
            last = now
            if not first:
                first = last
    timings: dict[str, Any] = final.get("timings", {})
    tokens = int(timings.get("predicted_n", 0))
    if tokens != new_tokens:
        raise RuntimeError(f"llama-server generated {tokens} tokens, {new_tokens} were asked")
    sample = _sample(VARIANT, rep, start, first, last, tokens)
    sample.text = "".join(pieces)
    return sample, timings
