"""Measure GET /healthz latency while the sidecar runs a long prefill and then decodes.

Starts `python -m sidecar` on a generated model (the `small` preset unless --model is given),
sends one long prompt, and probes /healthz back to back the whole time, sorting each probe
into the phase it fell in: idle (before the request), prefill (response headers to first
token), decode (first token to end). Prints count, p50, p99 and max per phase.

    python -m scripts.bench health-latency [--model DIR] [--prompt-repeats 300]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from scripts.run import services  # one home for starting the services

REPO = services.REPO

PHRASE = "The quick brown fox jumps over the lazy dog. "  # about 11 tokens


def percentile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


def measure(url: str, repeats: int, max_new_tokens: int, idle_s: float) -> dict[str, list[float]]:
    marks: dict[str, float] = {}
    done = threading.Event()
    go = threading.Event()

    def long_request() -> None:
        go.wait()
        body = {"input_text": PHRASE * repeats, "max_new_tokens": max_new_tokens}
        marks["sent"] = time.monotonic()
        try:
            with httpx.stream("POST", url + "/predict", json=body, timeout=600) as response:
                marks["started"] = time.monotonic()
                for _ in response.iter_raw():
                    marks.setdefault("first_token", time.monotonic())
                marks["end"] = time.monotonic()
        finally:
            done.set()

    threading.Thread(target=long_request, daemon=True).start()
    probes: list[tuple[float, float]] = []
    begin = time.monotonic()
    with httpx.Client(timeout=30) as client:
        while not done.is_set():
            if not go.is_set() and time.monotonic() - begin > idle_s:
                go.set()
            sent = time.monotonic()
            client.get(url + "/healthz").raise_for_status()
            probes.append((sent, time.monotonic() - sent))
    phases: dict[str, list[float]] = {"idle": [], "prefill": [], "decode": []}
    for sent, latency in probes:
        if sent + latency <= marks.get("sent", 0.0):
            phases["idle"].append(latency)
        elif marks["started"] <= sent and sent + latency <= marks["first_token"]:
            phases["prefill"].append(latency)
        elif marks["first_token"] <= sent and sent + latency <= marks["end"]:
            phases["decode"].append(latency)
    print(
        f"prefill {marks['first_token'] - marks['started']:.2f} s, "
        f"decode {marks['end'] - marks['first_token']:.2f} s"
    )
    return phases


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, help="model folder (default: generate `small`)")
    parser.add_argument("--prompt-repeats", type=int, default=300, help="times the phrase")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--idle-seconds", type=float, default=1.0)


def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = Path(tmp) / "small"
            subprocess.run(
                [sys.executable, "-m", "scripts.models.make_model", "--preset", "small",
                 "--out", str(model)],
                check=True,
                capture_output=True,
            )  # fmt: skip
        with services.sidecar(model, Path(tmp) / "sidecar.log") as sidecar:
            phases = measure(
                sidecar.url, args.prompt_repeats, args.max_new_tokens, args.idle_seconds
            )
    summary: dict[str, dict[str, float]] = {}
    print("| phase | probes | p50 (ms) | p99 (ms) | max (ms) |")
    print("|---|---:|---:|---:|---:|")
    for name, latencies in phases.items():
        if latencies:
            ms = [x * 1000 for x in latencies]
            row = {"probes": len(ms), "p50_ms": statistics.median(ms)}
            row |= {"p99_ms": percentile(ms, 0.99), "max_ms": max(ms)}
            summary[name] = row
            print(
                f"| {name} | {len(ms)} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} "
                f"| {row['max_ms']:.2f} |"
            )
    return {"model": str(model), "phases": summary, "latencies_s": phases}
