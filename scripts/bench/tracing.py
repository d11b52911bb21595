"""Measure what tracing costs a chat: the pair (app + sidecar) with tracing off, on, and off
again, measured in turns, so that the off-against-off difference shows the noise.

Starts three pairs on one generated model (the `small` preset unless --model is given): `off`
and `off-again` as they run by default, `on` with both services exporting every span
(TRACES_FILE: the SDK, FastAPI's and the WSGI/requests instrumentations, the phase spans and
the batch exporter all run; only the network hop of OTLP is left out). Requests go one at a
time, a round visiting the three pairs in a rotating order, each `POST /chat` with a fresh
prompt (no conversation cache can serve one from another). Prints the median and p90 of the
time to the first delta and of the whole reply per pair, each pair's median against `off`'s,
and the CPU time the app and the sidecar's web process spent per chat (the model worker left
out): on a shared machine the CPU time shows the cost much more steadily than latencies do.

    python -m scripts.bench tracing [--model DIR] [--rounds 60] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from scripts.run import services  # one home for starting the services

REPO = services.REPO
PAIRS = ("off", "on", "off-again")


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def cpu_by_process(pids: list[int], leave_out: set[int]) -> dict[int, float]:
    """User + system CPU seconds of these processes and their children (gunicorn's workers),
    by pid, but for those of `leave_out` (the sidecar's model worker and prompt process)."""
    seconds: dict[int, float] = {}
    for pid in pids:
        process = psutil.Process(pid)
        for p in (process, *process.children(recursive=True)):
            if p.pid in leave_out:
                continue
            try:
                times = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            seconds[p.pid] = times.user + times.system
    return seconds


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two snapshots by the processes alive at the second: one that
    ended meanwhile (an indexer's reader, a recycled worker) takes its time with it, and must
    not make the sum go down."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def one_chat(url: str, text: str, new_tokens: int) -> tuple[float, float]:
    """(seconds to the first delta line, seconds to the end of the reply)."""
    body = {
        "messages": [{"role": "user", "content": text}],
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
    }
    sent = time.perf_counter()
    first = None
    with httpx.stream("POST", url + "/chat", json=body, timeout=120) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is None and line.startswith('{"delta"'):
                first = time.perf_counter()
    end = time.perf_counter()
    assert first is not None, "no delta"
    return first - sent, end - sent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model folder (default: the generated `small` model)")
    parser.add_argument("--rounds", type=int, default=60, help="chats per pair")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens per reply")


def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch_name, contextlib.ExitStack() as stack:
        scratch = Path(scratch_name)
        model = Path(args.model) if args.model else scratch / "small"
        if not args.model:
            make_model = [sys.executable, "-m", "scripts.models.make_model"]
            subprocess.run(
                [*make_model, "--preset", "small", "--out", str(model)],
                check=True,
                capture_output=True,
            )
        urls = {}
        pids: dict[str, list[int]] = {}
        for name in PAIRS:
            env = {"PROMPT_CACHE_MB": "0"}
            if name == "on":
                env["TRACES_FILE"] = str(scratch / "sidecar-traces.jsonl")
            sidecar = stack.enter_context(
                services.sidecar(model, scratch / f"{name}-sidecar.log", env=env)
            )
            app_env = {"TRACES_FILE": str(scratch / "app-traces.jsonl")} if name == "on" else {}
            app = stack.enter_context(
                services.chatapp(sidecar.url, scratch / f"{name}-app.log", env=app_env)
            )
            urls[name] = app.url
            # The sidecar's web process (its model worker is a child: counted apart) and the
            # app's gunicorn master with its workers.
            pids[name] = [sidecar.process.pid, app.process.pid]
        for name in PAIRS:  # warm up: first requests pay for imports and allocations
            for i in range(3):
                one_chat(urls[name], f"Warm-up {i} for {name}.", args.new_tokens)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in PAIRS}
        workers = {
            n: {w.pid for w in psutil.Process(pids[n][0]).children(recursive=True)} for n in PAIRS
        }
        before = {n: cpu_by_process(pids[n], workers[n]) for n in PAIRS}
        for i in range(args.rounds):
            # Rotated: each pair goes first, second and third in turn, and never follows
            # itself (a pair asked twice in a row answers faster, warm).
            order = PAIRS[i % 3 :] + PAIRS[: i % 3]
            for name in order:
                samples[name].append(one_chat(urls[name], f"Tell me about {i}.", args.new_tokens))
        cpu = {n: cpu_spent(before[n], cpu_by_process(pids[n], workers[n])) for n in PAIRS}
    report: dict[str, dict[str, float]] = {}
    for name in PAIRS:
        ttft = [s[0] * 1000 for s in samples[name]]
        total = [s[1] * 1000 for s in samples[name]]
        report[name] = {
            "ttft_p50_ms": round(statistics.median(ttft), 2),
            "ttft_p90_ms": round(percentile(ttft, 0.9), 2),
            "reply_p50_ms": round(statistics.median(total), 2),
            "reply_p90_ms": round(percentile(total, 0.9), 2),
            "web_cpu_ms_per_chat": round(cpu[name] / args.rounds * 1000, 2),
        }
    base = report["off"]
    print(f"{args.rounds} chats per pair, {args.new_tokens} tokens each")
    print(
        "| pair | TTFT p50 (ms) | TTFT p90 | reply p50 (ms) | reply p90 | reply p50 vs off "
        "| CPU of app + sidecar web process per chat (ms) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, row in report.items():
        change = (row["reply_p50_ms"] / base["reply_p50_ms"] - 1) * 100
        print(
            f"| {name} | {row['ttft_p50_ms']} | {row['ttft_p90_ms']} | {row['reply_p50_ms']} "
            f"| {row['reply_p90_ms']} | {change:+.1f}% | {row['web_cpu_ms_per_chat']} |"
        )
    return {"rounds": args.rounds, "new_tokens": args.new_tokens, "pairs": report}
