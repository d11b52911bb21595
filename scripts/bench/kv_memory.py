"""Peak memory of the sidecar under a container's memory limit, with more KV wanted than fits.

    sudo python -m scripts.bench kv-memory --model models/generated-phi3-mini --memory-gb 8

Starts the sidecar in a fresh cgroup with a memory limit (what `podman run --memory` or an App
Service plan gives it; needs root and the v1 memory controller), so it chooses its KV bound from
that limit (docs/conversation-cache.md), then sends `--prompts` requests at once, each with a
prompt of about `--prompt-tokens` tokens and its own scope. Prints the bound chosen, the
worker's peak resident memory (VmHWM) against the loaded model plus the bound, how many requests
waited for KV memory, the cgroup's own peak and whether the kernel killed anything for memory
(the cgroup's OOM count), and that every reply arrived whole.
Exit status: 0 done, 1 failed.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.common import Failed
from scripts.bench.drivers import ChatTokenizer, cpu_name, sized_messages
from scripts.run import services
from sidecar.limits import GIB, MIB


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "--model-dir", dest="model_dir", type=Path, required=True)
    parser.add_argument("--memory-gb", type=float, default=8.0, help="the cgroup's limit")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=3000)
    parser.add_argument("--max-tokens", type=int, default=64)


def main(args: argparse.Namespace) -> dict[str, Any]:
    limit = int(args.memory_gb * GIB)
    log = Path(tempfile.mkdtemp()) / "sidecar.log"
    with (
        services.memory_cgroup(limit) as group,
        # No reply time limit: four 3,000-token prompts are minutes of prefill on 2 vCPUs
        # whatever the memory (App Service's 230-s cut would end the last ones); this measures
        # memory, so every request runs to its end.
        services.sidecar(
            args.model_dir,
            log,
            cgroup=group,
            MAX_CONCURRENCY=str(args.prompts),
            REPLY_TIME_LIMIT_S="0",
        ) as service,
    ):
        chosen = next(
            json.loads(line) for line in service.log_lines() if '"msg": "kv memory"' in line
        )
        worker = _worker_pid(service.process.pid)
        tokenizer = ChatTokenizer.load(str(args.model_dir))
        prompts = [
            sized_messages(tokenizer, args.prompt_tokens, 900 + i) for i in range(args.prompts)
        ]
        statuses: list[int] = []
        peak = {"rss": 0}
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak["rss"] = max(peak["rss"], _status(worker, "VmRSS"))
                time.sleep(0.1)

        def ask(index: int) -> None:
            body = {
                "messages": prompts[index],
                "max_new_tokens": args.max_tokens,
                "min_new_tokens": args.max_tokens,
                "cache_scope": f"memory-{index}",
            }
            response = httpx.post(service.url + "/predict", json=body, timeout=3600)
            statuses.append(response.status_code)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        began = time.monotonic()
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(args.prompts)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - began
        done.set()
        high_water = _status(worker, "VmHWM")
        waits = sum('"msg": "request waits for KV memory"' in line for line in service.log_lines())
        restarts = [x for x in service.log_lines() if '"msg": "model restarting"' in x]
        cgroup_peak = int((group / "memory.max_usage_in_bytes").read_text())
        oom = (group / "memory.oom_control").read_text()
    kills = int(oom.split("oom_kill ")[1].split()[0]) if "oom_kill " in oom else 0
    loaded, bound = int(chosen["loaded_bytes"]), int(chosen["kv_memory_bytes"])
    ceiling = loaded + bound
    results: dict[str, Any] = {
        "cpu": cpu_name(),
        "memory_limit_bytes": limit,
        "loaded_bytes": loaded,
        "kv_memory_bytes": bound,
        "worker_peak_rss_bytes": max(high_water, peak["rss"]),
        "ceiling_bytes": ceiling,
        "requests": args.prompts,
        "prompt_tokens": args.prompt_tokens,
        "statuses": statuses,
        "waits": waits,
        "cgroup_peak_bytes": cgroup_peak,
        "oom_kills": kills,
        "worker_restarts": len(restarts),
        "seconds": round(elapsed, 1),
    }
    worst = results["worker_peak_rss_bytes"] / ceiling
    print(f"CPU: {results['cpu']}; cgroup limit {limit / GIB:.1f} GiB")
    print("| loaded | KV bound | worker peak RSS | peak / (loaded + bound) | waited | OOM kills |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {loaded / MIB:,.0f} MiB | {bound / MIB:,.0f} MiB | "
        f"{results['worker_peak_rss_bytes'] / MIB:,.0f} MiB | {worst:.3f} | {waits} | {kills} |"
    )
    print(f"{args.prompts} prompts of ~{args.prompt_tokens} tokens: statuses {statuses}, ")
    print(f"cgroup peak {cgroup_peak / MIB:,.0f} MiB, {elapsed:.0f} s, restarts {len(restarts)}")
    if statuses != [200] * args.prompts or kills or restarts:
        raise Failed("not every reply arrived whole, or something was killed or restarted", results)
    return results


def _worker_pid(web: int) -> int:
    """The model worker: the web process's child (the one started by multiprocessing)."""
    children = Path(f"/proc/{web}/task/{web}/children").read_text().split()
    for child in children:
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"spawn_main" in cmdline:
            return int(child)
    raise RuntimeError("no model worker found")


def _status(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
