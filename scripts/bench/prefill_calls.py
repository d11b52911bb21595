"""What reading a prompt costs in one model call against several (issue 45: the sidecar read a
130-token prompt at 0.82x the bare engine): onnxruntime-genai's Generator appending the prompt
at once (the hops table's `engine`), and the batched path's decoder (model/batch/decoder.py)
reading it in chunks of each `--chunks` size, in this process, interleaved.

Besides wall time it reports each reading's CPU time (user and system, every thread of this
process) with onnxruntime's threads not spinning (a spinning thread's CPU time is not work) and
the minor page faults (a slot's pages are written for the first time), which a busy machine
disturbs far less than wall time.

    python -m scripts.bench prefill-calls                          # phi3-mini shapes, 130 tokens
    python -m scripts.bench prefill-calls --tokens 1000 --chunks 64,512,1000
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from scripts.bench.common import ensure_model, machine
from sidecar.model.batch.decoder import BatchDecoder, read_spec
from sidecar.model.cpus import cpu_budget, session_options
from sidecar.model.engine import og
from sidecar.model.folder import read_genai_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="a model folder (default: generated, see --preset)")
    parser.add_argument("--preset", default="phi3-mini", help="generated model preset")
    parser.add_argument("--tokens", type=int, default=130, help="prompt tokens")
    parser.add_argument("--chunks", default="64,512", help="the decoder's chunk sizes")
    parser.add_argument("--reps", type=int, default=3)


def usage() -> np.ndarray:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return np.array([time.perf_counter(), own.ru_utime, own.ru_stime, own.ru_minflt], float)


def main(args: argparse.Namespace) -> dict[str, Any]:
    chunks = [int(c) for c in args.chunks.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-prefill-") as tmp:
        model = ensure_model(args, Path(tmp))
        threads = cpu_budget().count
        options = session_options(threads, False)  # not spinning: CPU time is work
        config = og.Config(str(model))
        config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
        generator_model = og.Model(config)
        spec = read_spec(read_genai_config(model))
        entries = {k: str(v) for k, v in options.items() if k.startswith("session.")}
        length = args.tokens + 8
        decoder = BatchDecoder(model, spec, entries, threads, 1, length)
        rng = np.random.default_rng(0)
        vocab = int(read_genai_config(model)["model"]["vocab_size"])

        def generator(ids: np.ndarray) -> np.ndarray:
            params = og.GeneratorParams(generator_model)
            params.set_search_options(max_length=length)
            made = og.Generator(generator_model, params)
            began = usage()
            made.append_tokens(ids.astype(np.int32))
            made.generate_next_token()
            return usage() - began

        def chunked(size: int, ids: np.ndarray) -> np.ndarray:
            began = usage()
            for start in range(0, len(ids), size):
                decoder.run(0, ids[None, start : start + size].astype(np.int64), [start])
            spent = usage() - began
            decoder.pool.free(0)
            return spent

        runs: dict[str, Callable[[np.ndarray], np.ndarray]] = {"engine (one append)": generator}
        for size in chunks:
            runs[f"decoder, chunks of {size}"] = functools.partial(chunked, size)
        samples: dict[str, list[list[float]]] = {name: [] for name in runs}
        for rep in range(args.reps + 1):  # the first is a warm-up
            ids = rng.integers(100, vocab, size=args.tokens)
            for name, run in runs.items():
                spent = run(ids)
                if rep:
                    samples[name].append(spent.tolist())
                    print(f"  {name} rep {rep}: cpu {spent[1] + spent[2]:.2f} s", flush=True)
    rows = []
    base = statistics.median(s[1] + s[2] for s in samples["engine (one append)"])
    print(f"\n{machine()}; model {model.name}; {args.tokens} prompt tokens; {threads} threads\n")
    print("| reading | calls | wall (s) | CPU (s) | CPU vs engine | minor faults |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, taken in samples.items():
        size = int(name.rsplit(" ", 1)[1]) if "chunks" in name else args.tokens
        row = {
            "reading": name,
            "calls": -(-args.tokens // size),
            "wall_s": statistics.median(s[0] for s in taken),
            "cpu_s": statistics.median(s[1] + s[2] for s in taken),
            "minor_faults": statistics.median(s[3] for s in taken),
        }
        rows.append(row)
        print(
            f"| {name} | {row['calls']} | {row['wall_s']:.2f} | {row['cpu_s']:.2f} "
            f"| {row['cpu_s'] / base:.3f} | {row['minor_faults']:.0f} |"
        )
    return {"machine": machine(), "model": str(model), "tokens": args.tokens, "rows": rows}
