"""What a new chat waits for its first word, beside what the sidecar already holds (issue 45):

1. a new chat (`--new-tokens` of prompt) in an empty cache;
2. a chat of a `--question-tokens` question alone, and the same question after a declared shared
   prefix (`SHARED_PREFIXES`, a system message of `--prefix-tokens`): read once at start, so the
   chat reads only its question;
3. the cache full of idle conversations (`--fill` chats of `--fill-tokens`, `KV_MEMORY_MB` set
   so that a new chat needs one compacted): a new chat that arrives at once (the room made on
   its path, as before, unless the worker was quick) and one that arrives after `--idle-s`
   seconds (the room made while the worker was idle, model/kv/idle.py).

One sidecar, its own settings; each chat a scope of its own; greedy, `--reply-tokens` each.
The log line of each timed request gives its `cache_reason` (`shared`: it started from the
prefix). Times are the machine's: compare the rows of one run.

    python -m scripts.bench first-word                      # phi3-mini shapes
    python -m scripts.bench first-word --preset tiny --fill-tokens 600   # shape only
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.common import ensure_model, machine
from scripts.bench.drivers import ChatTokenizer, Sample, via_sidecar, words
from scripts.run import services
from sidecar.model.folder import read_genai_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="a model folder (default: generated, see --preset)")
    parser.add_argument("--preset", default="phi3-mini", help="generated model preset")
    parser.add_argument("--new-tokens", type=int, default=110, help="the new chat's prompt")
    parser.add_argument("--question-tokens", type=int, default=30, help="the question's prompt")
    parser.add_argument("--prefix-tokens", type=int, default=400, help="the shared prefix")
    parser.add_argument("--fill", type=int, default=2, help="idle conversations in the cache")
    parser.add_argument("--fill-tokens", type=int, default=1200, help="each one's prompt")
    parser.add_argument("--reply-tokens", type=int, default=16, help="tokens of every reply")
    parser.add_argument("--idle-s", type=float, default=20.0, help="idle time before the last")


def sized(tokenizer: ChatTokenizer, tokens: int, shift: int, system: str | None = None) -> Any:
    """A one-question chat whose prompt is about `tokens` long (after `system`, if any)."""
    head = [{"role": "system", "content": system}] if system else []
    count = 1
    while True:
        messages = [*head, {"role": "user", "content": words(count, shift)}]
        have = len(tokenizer.prompt_ids(messages)) - (
            len(tokenizer.prompt_ids(head)) if head else 0
        )
        if have >= tokens:
            return messages
        count += max(1, (tokens - have) // 2)


def system_prompt(tokenizer: ChatTokenizer, tokens: int) -> str:
    count = tokens // 2
    while len(tokenizer.prompt_ids([{"role": "system", "content": words(count, 7)}])) < tokens:
        count += max(1, tokens // 20)
    return words(count, 7)


def kv_bytes_per_token(model: Path) -> int:
    decoder = read_genai_config(model)["model"]["decoder"]
    layers, heads = decoder["num_hidden_layers"], decoder["num_key_value_heads"]
    return 2 * layers * heads * decoder["head_size"] * 4  # K and V, fp32


def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-first-word-") as tmp:
        scratch = Path(tmp)
        model = ensure_model(args, scratch)
        tokenizer = ChatTokenizer.load(str(model))
        system = system_prompt(tokenizer, args.prefix_tokens)
        per_token = kv_bytes_per_token(model)
        # The idle conversations and half of what a new chat reserves: it needs room made
        held = args.fill * (args.fill_tokens + args.reply_tokens + 16) + args.prefix_tokens
        new_chat = args.new_tokens + args.reply_tokens
        bound_mb = math.ceil((held + new_chat // 2) * per_token / 2**20)
        settings = {
            "SHARED_PREFIXES": json.dumps([system]),
            "KV_MEMORY_MB": str(bound_mb),
            "MAX_NEW_TOKENS": str(args.reply_tokens),
        }
        rows: list[dict[str, Any]] = []
        with (
            services.sidecar(model, scratch / "sidecar.log", env=settings) as sidecar,
            httpx.Client(timeout=1200) as client,
        ):

            def timed(label: str, messages: Any, scope: str) -> Sample:
                sample = via_sidecar(
                    client, sidecar.url, messages, args.reply_tokens, len(rows),
                    scope=scope, request_id=scope,
                )  # fmt: skip
                line = services.request_line(sidecar, scope)
                rows.append(
                    {
                        "row": label,
                        "prompt_tokens": line.get("prompt_tokens"),
                        "ttft_s": sample.ttft_s,
                        "cached_tokens": sample.cached_tokens,
                        "cache_reason": line.get("cache_reason"),
                    }
                )
                print(f"  {label}: {sample.ttft_s:.2f} s", flush=True)
                return sample

            timed("new chat, empty cache", sized(tokenizer, args.new_tokens, 1), "empty")
            question = sized(tokenizer, args.question_tokens, 2)
            timed("question alone", question, "question")
            with_prefix = sized(tokenizer, args.question_tokens, 3, system)
            timed("shared prefix + question", with_prefix, "prefixed")
            for i in range(args.fill):
                via_sidecar(
                    client, sidecar.url, sized(tokenizer, args.fill_tokens, 10 + i),
                    args.reply_tokens, i, scope=f"fill-{i}",
                )  # fmt: skip
            timed("new chat, cache full, at once", sized(tokenizer, args.new_tokens, 4), "at-once")
            via_sidecar(
                client, sidecar.url, sized(tokenizer, args.fill_tokens, 20),
                args.reply_tokens, 0, scope="fill-again",
            )  # fmt: skip
            time.sleep(args.idle_s)
            label = f"new chat, cache full, after {args.idle_s:g} s idle"
            timed(label, sized(tokenizer, args.new_tokens, 5), "after-idle")
    print(f"\n{machine()}; model {model.name}; KV_MEMORY_MB={bound_mb}\n")
    print("| new chat | prompt tokens | TTFT (s) | vs empty cache | cache_reason |")
    print("|---|---:|---:|---:|---|")
    base = rows[0]["ttft_s"]
    for row in rows:
        print(
            f"| {row['row']} | {row['prompt_tokens']} | {row['ttft_s']:.2f} "
            f"| {row['ttft_s'] / base:.2f} | {row['cache_reason']} |"
        )
    return {"machine": machine(), "model": str(model), "kv_memory_mb": bound_mb, "rows": rows}
