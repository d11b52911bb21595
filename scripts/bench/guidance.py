"""What structured output costs and saves, on one model folder (default: Phi-3-mini's shapes,
written by scripts/models/make_model.py --preset phi3-mini; random weights decode at the real
model's speed). The sidecar's own engine runs in this process, cache off, greedy, one request at a
time, on the decode path the sidecar takes by default (batched decode, DECODE_BATCH_ROWS: its own
llguidance matcher per row) or, with --rows 1, on onnxruntime-genai's Generator (its built-in
llguidance):

1. Forced tokens: a typical JSON Schema reply (the docs' weather report) with
   `enable_ff_tokens` on and off: tokens generated against decode steps taken, and the time to
   the complete object. The replies must be the same text (checked).
2. Beside three chats (batched decode only): the JSON reply, and an unguided reply of as many
   tokens, each while three other chats decode: the others' decode rate meanwhile, and the
   model calls taken (a forced run is a call of its own).
3. The cost guidance adds to a step: the same number of tokens of free text without a grammar
   and under a grammar that allows any text (tool_choice "none"'s), time per decode step.

    python -m scripts.bench guidance                      # builds phi3-mini shapes once
    python -m scripts.bench guidance --model /models/phi3 --runs 5 --json out.json

Prints a Markdown table headed with the CPU; the tests run it on the tiny model and check what
it counts, never its timings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from scripts.bench.drivers import cpu_name
from sidecar.ipc import Generate, Guidance
from sidecar.model.batch.row import BatchGeneration
from sidecar.model.engine import Engine
from sidecar.model.generator.generation import Generation
from sidecar.settings import Settings
from sidecar.web.structured.guidance import TEXT_RULE, prepared

REPO = Path(__file__).resolve().parents[2]
REPORT_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "country": {"enum": ["France", "United Kingdom", "Japan", "Germany", "Spain"]},
        "temperature_celsius": {"type": "integer", "minimum": -50, "maximum": 60},
        "conditions": {"enum": ["sunny", "cloudy", "rain", "snow", "storm"]},
        "wind_kmh": {"type": "integer", "minimum": 0, "maximum": 250},
        "advice": {"type": "string", "maxLength": 80},
    },
    "required": ["city", "country", "temperature_celsius", "conditions", "wind_kmh", "advice"],
    "additionalProperties": False,
}
QUESTION = "What is the weather in Paris today? Answer as a JSON weather report."


def timed(generation: Generation | BatchGeneration) -> dict[str, Any]:
    """Run one generation to its end: its text, tokens, decode steps and times."""
    text: list[str] = []
    steps = 0
    began = time.perf_counter()
    decode_began = None
    while generation.finish is None:
        prefilling = generation.prefilling
        if not prefilling and decode_began is None:
            decode_began = time.perf_counter()
        text.append(generation.step() or "")
        steps += not prefilling
    ended = time.perf_counter()
    generation.release(reusable=False)
    decode_s = ended - (decode_began or ended)
    return {
        "text": "".join(text),
        "tokens": generation.generated,
        "steps": steps,
        "total_s": ended - began,
        "per_step_ms": 1000 * decode_s / max(steps, 1),
    }


def forced_tokens(engine: Engine, runs: int, max_new: int) -> dict[str, Any]:
    guidance = Guidance("json_schema", json.dumps(prepared(REPORT_SCHEMA)))
    requests = {
        label: Generate(
            "bench", (("user", QUESTION),), max_new, guidance=replace(guidance, ff_tokens=ff)
        )
        for label, ff in (("ff on", True), ("ff off", False))
    }
    results = interleaved(engine, requests, runs)
    texts = {s["text"] for samples in results.values() for s in samples}
    if len(texts) != 1:
        print("warning: the replies differ with forced tokens on and off", file=sys.stderr)
    return results


def step_cost(engine: Engine, runs: int, tokens: int) -> dict[str, Any]:
    any_text = Guidance("lark_grammar", "start: TEXT\n" + TEXT_RULE)
    requests = {
        label: Generate(
            "bench", (("user", QUESTION),), tokens, min_new_tokens=tokens, guidance=guidance
        )
        for label, guidance in (("no grammar", None), ("any-text grammar", any_text))
    }
    return interleaved(engine, requests, runs)


class CountedCalls:
    """A model call that counts its calls."""

    def __init__(self, run: Any) -> None:
        self.run, self.count = run, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.count += 1
        return self.run(*args, **kwargs)


def beside_others(engine: Engine, forced: dict[str, Any], max_new: int) -> dict[str, Any]:
    """The JSON reply (forced tokens on) and an unguided reply of exactly as many tokens, each
    while three other chats decode: the others' tokens and decode rate meanwhile, and the model
    calls the batch made (batched decode only)."""
    batch = engine.batch
    assert batch is not None
    tokens = int(median(forced["ff on"], "tokens"))
    guidance = Guidance("json_schema", json.dumps(prepared(REPORT_SCHEMA)))
    replies = {
        "guided JSON": Generate("bench", (("user", QUESTION),), max_new, guidance=guidance),
        "unguided text": Generate("bench", (("user", QUESTION),), tokens, min_new_tokens=tokens),
    }
    out: dict[str, Any] = {}
    long = engine.max_length - 64  # the others outlive the reply
    for label, request in replies.items():
        others = [
            engine.start(Generate("bench", (("user", f"Story {i}."),), long, min_new_tokens=long),
                         cached=False)
            for i in range(3)
        ]  # fmt: skip
        while any(o.prefilling or o.generated == 0 for o in others):
            batch.step()
        reply = engine.start(request, cached=False)
        made = [o.generated for o in others]
        calls = CountedCalls(batch.decoder.run)
        batch.decoder.run = calls  # type: ignore[method-assign]
        began = time.perf_counter()
        while reply.finish is None:
            batch.step()
        elapsed = time.perf_counter() - began
        del batch.decoder.run
        reply.release(reusable=False)
        others_tokens = sum(o.generated for o in others) - sum(made)
        for other in others:
            other.release(reusable=False)
        out[label] = {
            "reply_tokens": reply.generated,
            "others_tokens": others_tokens,
            "others_tok_s_each": others_tokens / 3 / elapsed if elapsed else 0.0,
            "model_calls": calls.count,
            "seconds": elapsed,
        }
    return out


def interleaved(engine: Engine, requests: dict[str, Generate], runs: int) -> dict[str, Any]:
    """Each request `runs` times, taking turns (a machine that warms up or slows down as it
    goes weighs on every label alike), after one untimed run of each."""
    for request in requests.values():
        timed(engine.start(request, cached=False))
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in requests}
    for _ in range(runs):
        for label, request in requests.items():
            results[label].append(timed(engine.start(request, cached=False)))
    return results


def median(samples: list[dict[str, Any]], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, help="a model folder (default: phi3-mini shapes)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-new", type=int, default=256, help="budget of the JSON reply")
    parser.add_argument("--text-tokens", type=int, default=64, help="tokens of free text")
    rows = int(Settings.model_fields["decode_batch_rows"].default)
    parser.add_argument(
        "--rows",
        type=int,
        default=rows,
        help=f"DECODE_BATCH_ROWS (default {rows}, the sidecar's; 1: the Generator path)",
    )


def main(args: argparse.Namespace) -> dict[str, Any]:
    model = args.model
    if model is None:
        model = Path(tempfile.gettempdir()) / "bench-guidance-phi3-mini"
        if not (model / "genai_config.json").exists():
            subprocess.run(
                [sys.executable, "-m", "scripts.models.make_model", "--preset", "phi3-mini",
                 "--out", str(model)],
                check=True,
            )  # fmt: skip
    engine = Engine(model, decode_batch_rows=args.rows, max_concurrency=max(args.rows, 4))
    engine.warm_up()
    path = "the Generator" if engine.batch is None else f"batched decode ({args.rows} rows)"
    forced = forced_tokens(engine, args.runs, args.max_new)
    beside = beside_others(engine, forced, args.max_new) if engine.batch is not None else {}
    cost = step_cost(engine, args.runs, args.text_tokens)
    print(f"## Structured output on {model.name}, {path}, {cpu_name()}, median of {args.runs}\n")
    print("| reply | tokens | decode steps | time to the complete object (s) |")
    print("|---|---|---|---|")
    for label, samples in forced.items():
        print(
            f"| JSON Schema, {label} | {median(samples, 'tokens'):.0f} | "
            f"{median(samples, 'steps'):.0f} | {median(samples, 'total_s'):.2f} |"
        )
    if beside:
        print("\n| reply | tokens | model calls | others' decode tok/s each | others' tokens |")
        print("|---|---|---|---|---|")
        for label, row in beside.items():
            print(
                f"| beside three chats, {label} | {row['reply_tokens']} | {row['model_calls']} "
                f"| {row['others_tok_s_each']:.2f} | {row['others_tokens']} |"
            )
    print("\n| free text | tokens | ms per decode step |")
    print("|---|---|---|")
    for label, samples in cost.items():
        print(
            f"| {label} | {median(samples, 'tokens'):.0f} | {median(samples, 'per_step_ms'):.1f} |"
        )
    return {
        "model": str(model),
        "path": path,
        "runs": args.runs,
        "forced": forced,
        "beside": beside,
        "step_cost": cost,
    }
