"""What abusive requests cost the other users (issue 46), on a real sidecar.

- flood: CLIENTS clients loop over-long chats (about 58 KB of text each, far over the context,
  under the body limit) to /v1/chat/completions for SECONDS, each answered 400, while a
  bystander streams /predict replies back to back: the bystander's longest gap between two
  pieces, against the same bystander alone; the refusals' count and the model side's time on
  each (the log line's refusal_ms).
- hog: one client asks for the longest reply the context allows (max_tokens 4096 where the
  context holds it) under a small KV bound (KV_MEMORY_MB, default 5: about the 5,128 fp32
  Phi-3-mini tokens of an 8 GB plan's bound, in the tiny model's 1 KiB tokens; SmolLM2's fp32
  tokens are 45 KiB: 225); once it streams, three users send a short chat at once, each asking
  the chat app's 1,024 tokens: their times to first token, against the same three alone.

    python -m scripts.bench abuse [--model DIR] [--seconds 30] [--clients 3]
    python -m scripts.bench abuse --model build/real-models/smollm2-135m-instruct-fp32

Without --model it generates the tiny model. The targets (issue 46): the bystander's longest
gap under 2 s on SmolLM2; the three users' first tokens within 1.5x of their wait without the
hog. Figures depend on the machine: measure on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from scripts.run import services

ATTACK_BYTES = 58_000


def noise(size: int, seed: int) -> str:
    rnd = random.Random(seed)
    return "".join(rnd.choice(string.ascii_letters + string.digits + " .,;!?") for _ in range(size))


def stream_gaps(url: str, stop: threading.Event, gaps: list[float]) -> int:
    """Stream /predict replies back to back until `stop`; the gaps between pieces within each
    reply go into `gaps`. Returns the replies streamed."""
    replies = 0
    body = {"input_text": "Tell me about rivers.", "max_new_tokens": 200, "min_new_tokens": 200}
    with httpx.Client(timeout=300) as client:
        while not stop.is_set():
            last = None
            with client.stream("POST", url + "/predict", json=body) as response:
                for _ in response.iter_raw():
                    now = time.monotonic()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
            replies += 1
    return replies


def flood(url: str, seconds: float, clients: int, log: Path) -> dict[str, Any]:
    def bystander_alone() -> list[float]:
        stop, gaps = threading.Event(), list[float]()
        timer = threading.Timer(min(seconds, 5.0), stop.set)
        timer.start()
        stream_gaps(url, stop, gaps)
        return gaps

    alone = bystander_alone()
    stop, gaps = threading.Event(), list[float]()
    refused: list[float] = []
    bystander = threading.Thread(target=stream_gaps, args=(url, stop, gaps))
    bystander.start()
    time.sleep(1.0)
    deadline = time.monotonic() + seconds

    def attack(seed: int) -> None:
        with httpx.Client(timeout=120) as client:
            count = 0
            while time.monotonic() < deadline:
                # New text each time: text sent before has its ids kept (prompt/memo.py)
                content = noise(ATTACK_BYTES, seed * 1_000_000 + count)
                body = {"messages": [{"role": "user", "content": content}], "max_tokens": 16}
                sent = time.monotonic()
                headers = {"X-Request-Id": f"flood-{seed}-{count}"}
                response = client.post(url + "/v1/chat/completions", json=body, headers=headers)
                if response.status_code == 400:
                    refused.append(time.monotonic() - sent)
                count += 1

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(attack, range(clients)))
    stop.set()
    bystander.join()
    lines = [json.loads(x) for x in log.read_text().splitlines() if '"flood-' in x]
    work = [line["refusal_ms"] for line in lines if "refusal_ms" in line]
    result = {
        "alone_longest_gap_s": max(alone, default=0.0),
        "alone_median_gap_s": statistics.median(alone) if alone else 0.0,
        "flood_longest_gap_s": max(gaps, default=0.0),
        "flood_median_gap_s": statistics.median(gaps) if gaps else 0.0,
        "refusals": len(refused),
        "refusal_latency_median_s": statistics.median(refused) if refused else 0.0,
        "refusal_work_median_ms": statistics.median(work) if work else 0.0,
        "refusal_work_max_ms": max(work, default=0.0),
    }
    print(f"\nflood: {clients} clients, {seconds:.0f} s, {ATTACK_BYTES:,}-byte chats")
    print("| bystander | longest gap (s) | median gap (s) |")
    print("|---|---:|---:|")
    print(f"| alone | {result['alone_longest_gap_s']:.3f} | {result['alone_median_gap_s']:.4f} |")
    print(f"| flood | {result['flood_longest_gap_s']:.3f} | {result['flood_median_gap_s']:.4f} |")
    print(
        f"refusals: {len(refused)}, each answered in {result['refusal_latency_median_s']:.3f} s "
        f"(median); the model side's time on each: {result['refusal_work_median_ms']:.1f} ms "
        f"median, {result['refusal_work_max_ms']:.1f} ms at most"
    )
    return result


def ttfts(url: str, users: int) -> list[float]:
    def one(seed: int) -> float:
        # The chat app's MAX_NEW_TOKENS: what a user's reply may take beside the hog's; the
        # user leaves at the first token (its reply is cancelled)
        body = {"input_text": f"Hello number {seed}, how are you?", "max_new_tokens": 1024}
        sent = time.monotonic()
        with httpx.stream("POST", url + "/predict", json=body, timeout=300) as response:
            for _ in response.iter_raw():
                return time.monotonic() - sent
        return time.monotonic() - sent

    with ThreadPoolExecutor(users) as pool:
        return list(pool.map(one, range(users)))


def hog(url: str, hog_tokens: int, users: int) -> dict[str, Any]:
    ttfts(url, users)  # warm: the first requests after the start pay for more than their turn
    alone = ttfts(url, users)
    # Past the context, the sidecar shrinks the reply to what is left (and so the minimum)
    new = hog_tokens
    body = {"input_text": "Write a long story.", "max_new_tokens": new, "min_new_tokens": new}
    streaming, stop = threading.Event(), threading.Event()

    def hold() -> None:
        with httpx.stream("POST", url + "/predict", json=body, timeout=600) as response:
            for _ in response.iter_raw():
                streaming.set()
                if stop.is_set():
                    return  # the client leaves: its reply is cancelled

    holder = threading.Thread(target=hold)
    holder.start()
    streaming.wait(300)
    beside = ttfts(url, users)
    stop.set()
    holder.join()
    ratio = statistics.mean(beside) / statistics.mean(alone)
    print(f"\nhog: one client asks max_tokens {new}; {users} users send a short chat at once")
    print("| users' TTFT | mean (s) | max (s) |")
    print("|---|---:|---:|")
    print(f"| alone | {statistics.mean(alone):.3f} | {max(alone):.3f} |")
    print(f"| beside the hog | {statistics.mean(beside):.3f} | {max(beside):.3f} |")
    print(f"ratio of the means: {ratio:.2f} (target: at most 1.5)")
    return {"hog_tokens": new, "alone_s": alone, "beside_s": beside, "ratio": ratio}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, help="model folder (default: generate `tiny`)")
    parser.add_argument("--seconds", type=float, default=30.0, help="the flood's length")
    parser.add_argument("--clients", type=int, default=3, help="clients that flood")
    parser.add_argument("--hog-tokens", type=int, default=4096)
    parser.add_argument("--kv-memory-mb", type=int, default=5, help="KV_MEMORY_MB for the hog")


def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = Path(tmp) / "tiny"
            subprocess.run(
                [sys.executable, "-m", "scripts.models.make_model", "--preset", "tiny",
                 "--out", str(model)],
                check=True,
                capture_output=True,
            )  # fmt: skip
        log = Path(tmp) / "flood.log"
        with services.sidecar(model, log, MAX_CONCURRENCY="4") as sidecar:
            flooded = flood(sidecar.url, args.seconds, args.clients, log)
        log = Path(tmp) / "hog.log"
        with services.sidecar(
            model, log, MAX_CONCURRENCY="4", KV_MEMORY_MB=str(args.kv_memory_mb)
        ) as sidecar:
            hogged = hog(sidecar.url, args.hog_tokens, 3)
    return {"model": str(model), "flood": flooded, "hog": hogged}
