"""Prompt-lookup drafts on the batched path (PROMPT_LOOKUP_TOKENS, sidecar/model/batch/drafts.py):
what they gain a reply that quotes its passage, what they cost a plain chat, and what they do
to another user decoding at the same time. The sidecar's own engine runs in this process, two
of them on the same folder (drafts off, and on with --draft-tokens), batched decode as the
sidecar runs it by default, cache off, greedy, runs alternated between the two:

1. A grounded-like prompt (a passage, then a question whose answer quotes it), alone: a
   small model quotes some and paraphrases the rest.
2. A reply that copies its passage (asked to repeat it), alone.
3. A plain chat question, alone.
4. Two users at once: the copying prompt (the drafting user, who outlives the other) and the
   plain chat (the other user): each one's decode rate while both decode.
5. The model calls the choice rests on: one row reading 1, 1 + K and 1 + 2K tokens, two rows
   reading one token each, and a drafting row's own call beside another row's.

    python -m scripts.bench prompt-lookup --model smollm2     # SmolLM2-135M-Instruct, built once
    python -m scripts.bench prompt-lookup --model DIR --runs 5 --new-tokens 128

Prints Markdown tables headed with the CPU; the tests run it on the tiny model and check its
shape, never its timings.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from scripts.bench.common import ensure_model
from scripts.bench.drivers import cpu_name
from sidecar.ipc import Generate
from sidecar.model.batch.row import BatchGeneration
from sidecar.model.engine import Engine

PASSAGE = (
    "The Python Software Foundation is the organization behind Python. Its mission is to "
    "promote, protect, and advance the Python programming language, and to support and "
    "facilitate the growth of a diverse and international community of Python programmers. "
    "The foundation holds the intellectual property rights behind Python, runs the annual "
    "PyCon US conference, and funds sprints, meetups and the work of core developers."
)
QUOTE = (
    "Answer the question using the passage. Quote the passage's exact words.\n\n"
    f'Passage: "{PASSAGE}"\n\n'
    "Question: What is the mission of the Python Software Foundation, and what does it do? "
    "Quote the passage."
)
COPY = f"Repeat the following text exactly:\n\n{PASSAGE}"
CHAT = "What should I pack for a weekend hiking trip in the mountains?"
CASES = {"grounded answer, quoting": QUOTE, "copies its passage": COPY, "plain chat": CHAT}


def request(prompt: str, new_tokens: int, *, longer: bool = False) -> Generate:
    """A greedy request; `longer`: it makes at least `new_tokens` (it outlives the other)."""
    floor = new_tokens if longer else 0
    return Generate("bench", (("user", prompt),), new_tokens, min_new_tokens=floor)


def engines(folder: Path, draft_tokens: int) -> dict[str, Engine]:
    made = {}
    for label, tokens in (("off", 0), ("on", draft_tokens)):
        engine = Engine(folder, decode_batch_rows=4, max_concurrency=4, prompt_lookup_tokens=tokens)
        engine.warm_up()
        made[label] = engine
    return made


def sample(generation: BatchGeneration, text: str) -> dict[str, Any]:
    drafts = generation.drafts()
    return {
        "text": text,
        "tokens": generation.generated,
        "decode_tps": generation.tokens_per_s() or 0.0,
        "checked": drafts.checked if drafts else 0,
        "accepted": drafts.accepted if drafts else 0,
        "calls": drafts.steps if drafts else 0,
    }


def run_alone(engine: Engine, prompt: str, new_tokens: int) -> dict[str, Any]:
    assert engine.batch is not None
    generation = engine.start(request(prompt, new_tokens), cached=False)
    assert isinstance(generation, BatchGeneration)
    pieces: list[str] = []
    while generation.finish is None:
        for touched, text in engine.batch.step():
            if touched is generation and text:
                pieces.append(text)
    generation.release(reusable=False)
    return sample(generation, "".join(pieces))


def run_pair(engine: Engine, new_tokens: int) -> dict[str, Any]:
    """The copying prompt and the plain chat at once; the first made to outlive the second.
    Each one's decode rate over the time both decoded."""
    assert engine.batch is not None
    drafting = engine.start(request(COPY, 2 * new_tokens, longer=True), cached=False)
    other = engine.start(request(CHAT, new_tokens), cached=False)
    assert isinstance(drafting, BatchGeneration) and isinstance(other, BatchGeneration)
    made_then, began = 0, None
    while other.finish is None:
        if began is None and other.generated and drafting.generated:
            made_then, began = drafting.generated, time.perf_counter()
        engine.batch.step()
    ended = time.perf_counter()
    both_s = ended - (began or ended)
    result = {
        "other": sample(other, ""),
        "drafting_tps_beside": (drafting.generated - made_then) / both_s if both_s else 0.0,
    }
    for generation in (drafting, other):
        generation.release(reusable=False)
    return result


def median(samples: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(s[key] for s in samples))


def calls(engine: Engine, draft_tokens: int, repeats: int) -> dict[str, float]:
    """Milliseconds of model calls of each shape (median), at a 300-token context."""
    batch = engine.batch
    assert batch is not None
    decoder, rng, context = batch.decoder, np.random.default_rng(0), 300
    for slot in (0, 1):  # two rows' contexts, written once (no request holds these slots)
        decoder.run(slot, rng.integers(10, 100, size=(1, context)), [0])

    def ms(*shapes: tuple[int, int]) -> float:
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            for rows, width in shapes:
                ids = rng.integers(10, 100, size=(rows, width))
                decoder.run(0, ids, [context] * rows, every=width > 1)
            times.append(time.perf_counter() - began)
        return 1000 * float(statistics.median(times))

    k = draft_tokens
    shapes = {
        "1 row, 1 token (a plain decode step)": [(1, 1)],
        f"1 row, {1 + k} tokens (a draft of {k})": [(1, 1 + k)],
        f"1 row, {1 + 2 * k} tokens (a draft of {2 * k})": [(1, 1 + 2 * k)],
        "2 rows, 1 token each (two users' step)": [(2, 1)],
        f"2 calls: 1 row of {1 + k} and 1 row of 1 (a draft in a call of its own)": [
            (1, 1 + k),
            (1, 1),
        ],
    }
    out = {label: ms(*shape) for label, shape in shapes.items()}
    for slot in (0, 1):
        batch.pool.free(slot)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="a folder, or smollm2 (built once)")
    parser.add_argument("--preset", default="tiny", help="a generated preset, without --model")
    parser.add_argument("--draft-tokens", type=int, default=4, help="PROMPT_LOOKUP_TOKENS")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--runs", type=int, default=3, help="alternated runs per case")
    parser.add_argument("--call-repeats", type=int, default=15)


def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        folder = ensure_model(args, Path(scratch))
        pair = engines(folder, args.draft_tokens)
        result: dict[str, Any] = {
            "model": str(folder),
            "draft_tokens": args.draft_tokens,
            "alone": {},
        }
        print(
            f"PROMPT_LOOKUP_TOKENS={args.draft_tokens} against 0, batched decode, greedy, "
            f"{folder.name} on {cpu_name()}, up to {args.new_tokens} new tokens, medians of "
            f"{args.runs} alternated runs:\n"
        )
        print("| case | decode tok/s off | on | ratio | drafts accepted / checked "
              "| tokens per model call | same reply |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---|")
        for label, prompt in CASES.items():
            runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
            for _ in range(args.runs):
                for side, engine in pair.items():
                    runs[side].append(run_alone(engine, prompt, args.new_tokens))
            result["alone"][label] = runs
            off, on = median(runs["off"], "decode_tps"), median(runs["on"], "decode_tps")
            last = runs["on"][-1]
            per_call = last["tokens"] / last["calls"] if last["calls"] else 0.0
            same = all(a["text"] == b["text"] for a, b in zip(runs["off"], runs["on"], strict=True))
            print(
                f"| {label} | {off:.1f} | {on:.1f} | {on / off if off else 0:.2f} | "
                f"{last['accepted']} / {last['checked']} | {per_call:.2f} | "
                f"{'yes' if same else 'no'} |",
                flush=True,
            )
        pairs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        for _ in range(args.runs):
            for side, engine in pair.items():
                pairs[side].append(run_pair(engine, args.new_tokens))
        result["two_users"] = pairs
        print(
            f"\nTwo users at once (the copying one outlives the plain chat), decode tok/s, "
            f"{cpu_name()}:\n"
        )
        print("| user | drafts off | on | ratio |")
        print("|---|---:|---:|---:|")
        for label, values in (
            ("the other user (plain chat)", [[p["other"]["decode_tps"] for p in pairs[s]]
                                             for s in ("off", "on")]),
            ("the drafting user, beside it", [[p["drafting_tps_beside"] for p in pairs[s]]
                                              for s in ("off", "on")]),
        ):  # fmt: skip
            off, on = statistics.median(values[0]), statistics.median(values[1])
            print(f"| {label} | {off:.1f} | {on:.1f} | {on / off if off else 0:.2f} |")
        result["calls"] = calls(pair["on"], args.draft_tokens, args.call_repeats)
        print(f"\nModel calls at a 300-token context (median ms), {cpu_name()}:\n")
        print("| call | ms |")
        print("|---|---:|")
        for label, value in result["calls"].items():
            print(f"| {label} | {value:.2f} |")
        return result
