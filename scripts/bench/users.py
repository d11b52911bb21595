"""Several users at once: aggregate decode and time to first token, DECODE_BATCH_ROWS 1 vs N.

    python -m scripts.bench users                  # Phi-3-mini shapes (generated once, ~2.7 GB)
    python -m scripts.bench users --preset small   # a quick look (~1 minute)
    python -m scripts.bench users --model DIR      # any onnxruntime-genai folder

One sidecar per DECODE_BATCH_ROWS value (by default 1, each reply its own Generator, and 4, the
sidecar's default), all up at once, with MAX_CONCURRENCY and QUEUE_SIZE at the most users so that
every user's reply runs; runs interleaved (rows 1, rows 4, rows 1, ...) so drift hits all alike. For
each number of users: that many streams released at once, each with a prompt of its own (no cache
reuse between them): tokens per second of all of them together, and of the median user. Then the
time to first token of a request that arrives while the other users' replies are decoding (p50 and
p95 over --joins arrivals). Run it on a quiet machine: the figures are the machine's as much as the
sidecar's.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.common import PRESET_DIRS, ensure_model, machine, peak_rss_bytes
from scripts.bench.drivers import RawEngine, released_at_once, sized_messages, via_sidecar
from scripts.run import services


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model folder (default: generated, see --preset)")
    parser.add_argument("--preset", default="phi3-mini", choices=sorted(PRESET_DIRS))
    parser.add_argument("--users", default="1,2,4,8", help="simultaneous users to try")
    parser.add_argument("--rows", default="1,4", help="DECODE_BATCH_ROWS values to compare")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="prompt length in tokens")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens per reply")
    parser.add_argument("--reps", type=int, default=2, help="timed repetitions per setting")
    parser.add_argument("--joins", type=int, default=10, help="arrivals timed for TTFT")


def settle(args: argparse.Namespace) -> None:
    args.users = [int(n) for n in args.users.split(",")]
    args.rows = [int(n) for n in args.rows.split(",")]


def burst(url: str, chats: list[list[dict[str, str]]], new_tokens: int) -> dict[str, float]:
    """All chats at once: tokens per second together and of the median user."""
    samples, wall = released_at_once(
        len(chats), lambda client, i: via_sidecar(client, url, chats[i], new_tokens, i)
    )
    assert all(s.status == 200 for s in samples), [s.status for s in samples]
    return {
        "aggregate_tps": sum(s.tokens for s in samples) / wall,
        "user_decode_tps": statistics.median(s.decode_tps for s in samples),
    }


def ttft_while_decoding(
    url: str,
    engine: RawEngine,
    others: int,
    args: argparse.Namespace,
    shift: int,
) -> list[float]:
    """`others` long replies decode; requests arrive one after another meanwhile: their TTFTs."""
    stop = threading.Event()
    streaming = threading.Barrier(others + 1) if others else None

    def background(i: int) -> None:
        body = {
            "messages": sized_messages(engine, args.prompt_tokens, shift + i),
            # Long enough to outlast the arrivals (cancelled when they are done), within
            # the context with the prompt.
            "max_new_tokens": 2048,
            "min_new_tokens": 2048,
        }
        try:
            with httpx.stream("POST", url + "/predict", json=body, timeout=1200) as response:
                assert response.status_code == 200, response.read()
                for n, _ in enumerate(response.iter_raw()):
                    if n == 0 and streaming is not None:
                        streaming.wait()
                    if stop.is_set():
                        break  # leaving the block closes the connection: cancelled
        except BaseException:
            if streaming is not None:
                streaming.abort()  # the main thread's wait raises instead of hanging
            raise

    threads = [threading.Thread(target=background, args=(i,)) for i in range(others)]
    for thread in threads:
        thread.start()
    if streaming is not None:
        streaming.wait()
    ttfts = []
    with httpx.Client(timeout=1200) as client:
        for j in range(args.joins):
            chat = sized_messages(engine, args.prompt_tokens, shift + 100 + j)
            ttfts.append(via_sidecar(client, url, chat, 1, j).ttft_s)
    stop.set()
    for thread in threads:
        thread.join()
    return ttfts


def rss_bytes(pid: int) -> int:
    """Resident memory now of a process and its children, summed."""
    import psutil

    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])


class RssWatch:
    """The highest resident memory of each sidecar seen while it serves (sampled every 0.2 s):
    what serving costs, apart from the transient peak of loading that VmHWM also holds."""

    def __init__(self, pids: dict[int, int]) -> None:
        self.pids = pids
        self.loaded = {rows: rss_bytes(pid) for rows, pid in pids.items()}
        self.highest = dict(self.loaded)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            for rows, pid in self.pids.items():
                self.highest[rows] = max(self.highest[rows], rss_bytes(pid))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(args: argparse.Namespace) -> dict[str, Any]:
    settle(args)
    most = max(args.users)
    results: dict[int, dict[int, dict[str, list[float]]]] = {
        rows: {n: {"aggregate_tps": [], "user_decode_tps": [], "ttft_s": []} for n in args.users}
        for rows in args.rows
    }
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp, contextlib.ExitStack() as stack:
        scratch = Path(tmp)
        model_dir = ensure_model(args, scratch)
        engine = RawEngine(str(model_dir), None)
        urls = {}
        pids = {}
        for rows in args.rows:
            service = stack.enter_context(
                services.sidecar(
                    model_dir,
                    scratch / f"sidecar-rows{rows}.log",
                    MAX_CONCURRENCY=str(most),
                    QUEUE_SIZE=str(most),
                    DECODE_BATCH_ROWS=str(rows),
                )
            )
            urls[rows], pids[rows] = service.url, service.process.pid
        watch = RssWatch(pids)
        shift = 1000
        for rep in range(args.reps):
            for n in args.users:
                for rows in args.rows:  # interleaved
                    shift += 1000
                    chats = [
                        sized_messages(engine, args.prompt_tokens, shift + i) for i in range(n)
                    ]
                    measured = burst(urls[rows], chats, args.new_tokens)
                    for key, value in measured.items():
                        results[rows][n][key].append(value)
                    joined = ttft_while_decoding(urls[rows], engine, n - 1, args, shift + 500)
                    results[rows][n]["ttft_s"].extend(joined)
                    print(f"rep {rep} users {n} rows {rows}: {measured}", flush=True)
        watch.stop()
        rss = {rows: peak_rss_bytes(pid) for rows, pid in pids.items()}
    report = {
        "machine": machine(),
        "model": str(model_dir),
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "results": results,
        "peak_rss_bytes": rss,
        "rss_after_loading_bytes": watch.loaded,
        "rss_highest_serving_bytes": watch.highest,
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    print(markdown(report, args))
    return report


def markdown(report: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"Machine: {report['machine']}; {args.prompt_tokens}-token prompts, "
        f"{args.new_tokens} tokens per reply (median of {args.reps})",
        "",
        "| DECODE_BATCH_ROWS | users | aggregate tok/s | vs 1 user | per-user decode tok/s "
        "| TTFT p50 while others decode (s) | TTFT p95 (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rows, by_users in report["results"].items():
        one = statistics.median(by_users[min(by_users)]["aggregate_tps"])
        for n, values in by_users.items():
            aggregate = statistics.median(values["aggregate_tps"])
            ttft = values["ttft_s"]
            lines.append(
                f"| {rows} | {n} | {aggregate:.1f} | {aggregate / one:.2f} "
                f"| {statistics.median(values['user_decode_tps']):.1f} "
                f"| {percentile(ttft, 0.5):.2f} | {percentile(ttft, 0.95):.2f} |"
            )
    lines.append("")
    mib = 2**20
    for rows, peak in report["peak_rss_bytes"].items():
        loaded = report["rss_after_loading_bytes"][rows] / mib
        serving = report["rss_highest_serving_bytes"][rows] / mib
        lines.append(
            f"RSS, DECODE_BATCH_ROWS={rows}: {loaded:.0f} MiB after loading, at most "
            f"{serving:.0f} MiB while serving; peak with loading (VmHWM) {peak / mib:.0f} MiB"
        )
    return "\n".join(lines)
