"""Turns 1-5 of one chat, conversation cache on and off: `python -m scripts.bench turns`, and a
table of `hops` too.

    python -m scripts.bench turns                  # Phi-3-mini shapes (generated once, ~2.7 GB)
    python -m scripts.bench turns --preset small   # a quick look

Each turn sends the whole conversation so far, as a chat page does: a new user message of about
`turn_words` words, and the replies the server itself wrote before (so the cache meets its own
tokens). Every reply is exactly `reply_tokens` tokens (greedy, EOS held off). Two sidecars on the
same model take the same script turn by turn, interleaved: one as configured (cache on), one
with PROMPT_CACHE_MB=0. `reps` conversations, each starting with words of its own, so nothing
carries over from one to the next.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.common import PRESET_DIRS, ensure_model, prompt_cache_mb
from scripts.bench.drivers import ChatTokenizer, Sample, via_sidecar, words
from scripts.run import services

TURNS = 5


def run_turns(
    on_url: str,
    off_url: str,
    engine: ChatTokenizer,
    *,
    turn_words: int,
    reply_tokens: int,
    reps: int,
    pause: float,
) -> list[dict[str, Any]]:
    """Per turn: prompt tokens, cached tokens, and each sidecar's samples."""
    rows: list[dict[str, Any]] = [
        {"turn": t + 1, "prompt_tokens": [], "on": [], "off": []} for t in range(TURNS)
    ]
    with httpx.Client(timeout=1800) as client:
        for rep in range(reps):
            history: dict[str, list[dict[str, str]]] = {"on": [], "off": []}
            for t in range(TURNS):
                user = {"role": "user", "content": words(turn_words, 700 + 10 * rep + t)}
                row = rows[t]
                for name, url in (("on", on_url), ("off", off_url)):
                    messages = [*history[name], user]
                    sample = via_sidecar(client, url, messages, reply_tokens, rep, name)
                    if sample.status != 200:
                        raise RuntimeError(f"turn {t + 1} ({name}): HTTP {sample.status}")
                    history[name] = [*messages, {"role": "assistant", "content": sample.text}]
                    row[name].append(sample)
                    if name == "on":
                        row["prompt_tokens"].append(len(engine.prompt_ids(messages)))
                    time.sleep(pause)
                on, off = row["on"][-1], row["off"][-1]
                print(
                    f"  turn {t + 1} ({row['prompt_tokens'][-1]} tokens, {on.cached_tokens} "
                    f"cached) rep {rep}: ttft cache on {on.ttft_s:6.2f} s, off {off.ttft_s:6.2f} s",
                    flush=True,
                )
    return [_summary(row) for row in rows]


def _summary(row: dict[str, Any]) -> dict[str, Any]:
    def median(samples: list[Sample], key: str) -> float:
        return statistics.median(float(getattr(s, key) or 0) for s in samples)

    return {
        "turn": row["turn"],
        "prompt_tokens": statistics.median(row["prompt_tokens"]),
        "cached_tokens": median(row["on"], "cached_tokens"),
        "ttft_on_s": median(row["on"], "ttft_s"),
        "ttft_off_s": median(row["off"], "ttft_s"),
        "decode_on_tps": median(row["on"], "decode_tps"),
        "decode_off_tps": median(row["off"], "decode_tps"),
        "samples": {k: [s.as_dict() | {"text": ""} for s in row[k]] for k in ("on", "off")},
    }


def markdown(rows: list[dict[str, Any]], budget_mb: int) -> list[str]:
    first = rows[0]["ttft_on_s"]
    lines = [
        "",
        f"Conversation cache: turns of one chat, each with the server's own earlier replies "
        f"(PROMPT_CACHE_MB={budget_mb} against 0, interleaved).",
        "",
        "| turn | prompt tokens | cached | TTFT cache on (s) | TTFT cache off (s) | on / off "
        "| on / turn 1 | decode on / off |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        on, off = row["ttft_on_s"], row["ttft_off_s"]
        decode = row["decode_on_tps"] / row["decode_off_tps"] if row["decode_off_tps"] else 0.0
        lines.append(
            f"| {row['turn']} | {row['prompt_tokens']:.0f} | {row['cached_tokens']:.0f} "
            f"| {on:.2f} | {off:.2f} | {on / off:.2f} | {on / first:.2f} | {decode:.3f} |"
        )
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model folder (default: generated, see --preset)")
    parser.add_argument("--preset", default="phi3-mini", choices=sorted(PRESET_DIRS))
    parser.add_argument("--turn-words", type=int, default=40, help="words of each user message")
    parser.add_argument("--reply-tokens", type=int, default=48, help="tokens of each reply")
    parser.add_argument("--reps", type=int, default=3, help="conversations, each of 5 turns")
    parser.add_argument("--pause", type=float, default=1.0, help="idle seconds between requests")


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Two sidecars on one model, one as configured and one with PROMPT_CACHE_MB=0."""
    with tempfile.TemporaryDirectory(prefix="bench-turns-") as tmp:
        scratch = Path(tmp)
        model_dir = ensure_model(args, scratch)
        tokenizer = ChatTokenizer.load(str(model_dir))
        with (
            services.sidecar(model_dir, scratch / "sidecar.log") as cached,
            services.sidecar(
                model_dir, scratch / "sidecar-nocache.log", PROMPT_CACHE_MB="0"
            ) as off,
        ):
            rows = run_turns(
                cached.url,
                off.url,
                tokenizer,
                turn_words=args.turn_words,
                reply_tokens=args.reply_tokens,
                reps=args.reps,
                pause=args.pause,
            )
    budget = prompt_cache_mb()
    print("\n".join(markdown(rows, budget)))
    return {"model": str(model_dir), "prompt_cache_mb": budget, "turns": rows}
