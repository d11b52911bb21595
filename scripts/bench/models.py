"""Several models behind one sidecar (issue 56, MODELS_FILE): two resident models taking turns
against each alone, a cold load with its stream's loading events, a Phi-3-mini-sized cold load
estimated from the disk's read rate, and a soak of three models in a two-model budget.

    python -m scripts.bench models                             # smollm2 and the small preset
    python -m scripts.bench models --model-a PATH --preset-b tiny --turns 4 --soak 12
    python -m scripts.bench models --cold-model models/generated-phi3-mini   # a 2.7 GB load too

- Taking turns: both models pinned (resident); each one's first token (the first NDJSON text
  line, from the request) over --turns requests alone, then alternating A, B, A, B: the median
  of each, and the ratio (target: at most 1.05x).
- Cold load: model A, not loaded, asked for (its files dropped from the page cache first,
  posix_fadvise DONTNEED, so they are read from the disk as after a reboot): the time to its
  first token, the `loading` events its stream sent first, and its `load_s` (/v1/models). The
  disk's read rate (O_DIRECT) and what a folder of Phi-3-mini's size (int4, about 2.7 GB)
  would take read cold: its bytes at that rate plus what A's load did besides reading.
  `--cold-model models/generated-phi3-mini` loads that folder cold too: the real figure.
- Soak: three generated models (the tiny preset under three names) with a budget of about two
  (2.3x the first one's measured memory); --soak requests in turn to each, on
  /v1/chat/completions: every reply's `model` the one asked for, no 5xx, and the sidecar's
  processes' resident memory, sampled every 0.2 s, never above the budget plus the web process.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.common import Failed, ensure_model
from scripts.run import services

EVENTS = {"accept": "application/x-ndjson"}
PHI3_MINI_BYTES = 2_722_861_056 + 2**20  # generated-phi3-mini's weights file and the rest


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-a", default="smollm2", help="model A: a folder, or smollm2")
    parser.add_argument("--preset-b", default="small", help="model B: a generated preset")
    parser.add_argument("--turns", type=int, default=6, help="requests per model and way")
    parser.add_argument("--soak", type=int, default=12, help="soak requests (three models)")
    parser.add_argument("--tokens", type=int, default=8, help="new tokens per reply")
    parser.add_argument(
        "--cold-model",
        help="also load this folder cold as model A (e.g. models/generated-phi3-mini)",
    )


def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-models-") as scratch_dir:
        scratch = Path(scratch_dir)
        a = ensure_model(argparse.Namespace(model=args.model_a, preset=None), scratch)
        b = ensure_model(argparse.Namespace(model=None, preset=args.preset_b), scratch)
        tiny = ensure_model(argparse.Namespace(model=None, preset="tiny"), scratch)
        result = {"turns": taking_turns(a, b, scratch, args)}
        result["cold"] = cold_load(a, b, scratch, args)
        if args.cold_model:
            result["cold_model"] = cold_load(Path(args.cold_model), b, scratch, args)
        result["soak"] = soak(tiny, scratch, args)
    return result


def models_file(folder: Path, tables: list[dict[str, Any]]) -> Path:
    """A MODELS_FILE of its own in `folder` (each part writes one)."""
    name = f"models-{len(list(folder.glob('models-*.toml')))}.toml"
    return services.models_file(folder, tables, name)


def first_token_s(url: str, model: str, tokens: int, question: str) -> tuple[float, list[Any]]:
    """Seconds from the request to the first text line, and the lines before it."""
    body = {"messages": [{"role": "user", "content": question}], "max_new_tokens": tokens}
    began = time.perf_counter()
    before: list[Any] = []
    first = None
    with httpx.stream(
        "POST", url + "/predict", json=body | {"model": model}, headers=EVENTS, timeout=600
    ) as response:
        if response.status_code != 200:
            raise Failed(f"{model}: {response.status_code} {response.read()!r}")
        for line in response.iter_lines():
            event = json.loads(line)
            if "text" in event and first is None:
                first = time.perf_counter() - began
            elif first is None:
                before.append(event)
    if first is None:
        raise Failed(f"{model} sent no text: {before[-3:]}")
    return first, before


def taking_turns(a: Path, b: Path, scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    common = {"pinned": True, "kv_memory_mb": 256, "passage_kv_mb": 0}
    file = models_file(
        scratch, [{"id": "a", "path": str(a), **common}, {"id": "b", "path": str(b), **common}]
    )
    times: dict[str, list[float]] = {k: [] for k in ("a alone", "b alone", "a turns", "b turns")}
    with services.sidecar(a, scratch / "turns.log", MODELS_FILE=str(file)) as service:
        for model in ("a", "b"):
            first_token_s(service.url, model, args.tokens, "Warm up.")
            for turn in range(args.turns):
                question = f"Say something about the number {turn}."
                times[f"{model} alone"].append(first_token_s(service.url, model, 2, question)[0])
        for turn in range(args.turns):
            for model in ("a", "b"):
                question = f"Tell me about the number {turn}."
                times[f"{model} turns"].append(first_token_s(service.url, model, 2, question)[0])
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"\ntwo resident models taking turns: first token, median of {args.turns}")
    print(f"{'model':<8} | {'alone s':>8} | {'taking turns s':>14} | ratio")
    for model in ("a", "b"):
        alone, turns = median[f"{model} alone"], median[f"{model} turns"]
        print(f"{model:<8} | {alone:>8.3f} | {turns:>14.3f} | {turns / alone:.3f}x")
    return {"median_s": median, "all": times}


def cold_load(a: Path, b: Path, scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    file = models_file(
        scratch,
        [
            {"id": "b", "path": str(b), "pinned": True, "kv_memory_mb": 256},
            {"id": "a", "path": str(a), "kv_memory_mb": 256},
        ],
    )
    weights = sum(p.stat().st_size for p in a.rglob("*") if p.is_file())
    began = time.perf_counter()
    for path in a.rglob("*"):
        if path.is_file():
            with path.open("rb") as file_:
                while file_.read(2**24):
                    pass
    rate = weights / (time.perf_counter() - began)  # now in the page cache: as the load reads it
    largest = max((p for p in a.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    disk_rate = direct_read_rate(largest)
    dropped = drop_from_page_cache(a)  # the load reads them from the disk, as after a reboot
    with services.sidecar(b, scratch / "cold.log", MODELS_FILE=str(file)) as service:
        first_s, before = first_token_s(service.url, "a", args.tokens, "Hello, who are you?")
        listed = httpx.get(service.url + "/v1/models", timeout=10).json()["data"]
        load_s = next(m["load_s"] for m in listed if m["id"] == "a")
        loading = [e["loading"] for e in before if "loading" in e]
    beyond = max(0.0, (load_s or first_s) - weights / rate)  # what the load did besides reading
    estimate = PHI3_MINI_BYTES / (disk_rate or rate) + beyond
    print(f"\ncold load of {a.name} ({weights / 2**20:.0f} MiB", end="")
    print(", its files dropped from the page cache first)" if dropped else ", maybe cached)")
    print(f"first token from the request: {first_s:.2f} s; its load: {load_s} s")
    print(f"loading events before the first token: {len(loading)} (first: {loading[:1]})")
    print(f"its files read at {rate / 2**20:.0f} MiB/s from the page cache", end="")
    if disk_rate:
        print(f", {disk_rate / 2**20:.0f} MiB/s from the disk (O_DIRECT, {largest.name})")
    else:
        print(" (the disk's own rate cannot be read here: O_DIRECT refused)")
    print(f"a Phi-3-mini-sized folder (2.7 GB) read cold: about {estimate:.1f} s")
    return {
        "first_token_s": first_s,
        "load_s": load_s,
        "loading_events": loading,
        "weights_bytes": weights,
        "read_bytes_per_s": rate,
        "disk_bytes_per_s": disk_rate,
        "dropped_from_page_cache": dropped,
        "phi3_mini_estimate_s": estimate,
    }


def drop_from_page_cache(folder: Path) -> bool:
    """Ask the kernel to drop a folder's files from the page cache (posix_fadvise DONTNEED:
    their clean pages go, no privilege needed); False where it cannot be asked."""
    import os

    try:
        for path in folder.rglob("*"):
            if path.is_file():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
    except (OSError, AttributeError):
        return False
    return True


def direct_read_rate(path: Path, limit: int = 512 * 2**20) -> float | None:
    """The disk's read rate past the page cache (O_DIRECT, 16 MiB reads, up to `limit`
    bytes of `path`); None where the file system refuses O_DIRECT (tmpfs, overlay)."""
    import mmap
    import os

    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except (OSError, AttributeError):
        return None
    buffer = mmap.mmap(-1, 2**24)  # page-aligned, as O_DIRECT wants
    read = 0
    try:
        began = time.perf_counter()
        while read < limit:
            got = os.readv(fd, [buffer])
            if got <= 0:
                break
            read += got
        seconds = time.perf_counter() - began
    except OSError:
        return None
    finally:
        os.close(fd)
        buffer.close()
    return read / seconds if read and seconds > 0 else None


def soak(tiny: Path, scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    names = ("one", "two", "three")
    folders = [Path(shutil.copytree(tiny, scratch / f"soak-{name}")) for name in names]
    alone = {"id": "one", "path": str(folders[0]), "pinned": True, "kv_memory_mb": 64}
    first = models_file(scratch, [alone | {"passage_kv_mb": 0}])
    with services.sidecar(folders[0], scratch / "measure.log", MODELS_FILE=str(first)) as service:
        one = 0
        for _ in range(100):
            listed = httpx.get(service.url + "/v1/models", timeout=10).json()["data"]
            one = listed[0]["memory_bytes"] or 0
            if one:
                break
            time.sleep(0.1)
    budget = int(2.3 * one)
    tables = [
        {"id": name, "path": str(folder), "kv_memory_mb": 64, "passage_kv_mb": 0}
        | ({"pinned": True} if name == "one" else {})
        for name, folder in zip(names, folders, strict=True)
    ]
    file = models_file(scratch, tables)
    peak, wrong, failed, statuses = 0, 0, 0, []
    with services.sidecar(
        folders[0], scratch / "soak.log", MODELS_FILE=str(file), MODELS_MEMORY_BYTES=str(budget)
    ) as service:
        from sidecar.limits import resident_bytes
        from sidecar.web.models.pool import tree_resident_bytes

        web_only = resident_bytes(service.process.pid)
        stop = threading.Event()
        samples: list[int] = []

        def sample() -> None:
            while not stop.wait(0.2):
                samples.append(tree_resident_bytes(service.process.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        for turn in range(args.soak):
            model = names[turn % 3]
            body = {
                "model": model,
                "messages": [{"role": "user", "content": f"Turn {turn}"}],
                "max_tokens": 4,
            }
            response = httpx.post(service.url + "/v1/chat/completions", json=body, timeout=600)
            statuses.append(response.status_code)
            if response.status_code >= 500:
                failed += 1
            elif response.json().get("model") != model:
                wrong += 1
        stop.set()
        sampler.join()
        peak = max(samples, default=0)
    print(f"\nsoak: {args.soak} requests over three models, budget {budget / 2**20:.0f} MiB")
    print(f"5xx: {failed}; answered by another model: {wrong}; statuses: {sorted(set(statuses))}")
    print(
        f"peak resident memory of the sidecar's processes: {peak / 2**20:.0f} MiB; budget plus "
        f"the web process: {(budget + web_only) / 2**20:.0f} MiB"
    )
    return {
        "budget_bytes": budget,
        "peak_bytes": peak,
        "web_bytes": web_only,
        "five_hundreds": failed,
        "wrong_model": wrong,
        "within_budget": peak <= budget + web_only,
    }
