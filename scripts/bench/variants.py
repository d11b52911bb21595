"""Speed, memory and quality of the model variants (docs/benchmarks/variants.md): one
command per table.

    python -m scripts.bench variants speed    # generated phi3-mini shapes (2.3 GB each)
    python -m scripts.bench variants quality  # SmolLM2 variants against its fp32 folder
    python -m scripts.bench variants drafts   # PROMPT_LOOKUP_TOKENS: SmolLM2 and phi3-mini

speed: each variant (scripts/models/make_model.py's options) against the default folder, the two
loaded in two child processes and measured alternately (default, variant, default, ...), so a
busy machine slows both alike: prefill and decode tokens a second, the KV bytes a token costs
(from the model's own KV tensor) and each process's peak RSS. At most two folders exist at a
time; each variant's folder is deleted after its turn (--keep keeps them).

quality: SmolLM2-135M-Instruct (scripts/models/make_real_model.py builds the fp32 reference and the
Hugging Face folder) exported with each of scripts/models/export_model.py's variant options, then
`python -m scripts.bench quality --model VARIANT --reference FP32` (greedy-token agreement,
perplexity). The pruned LM head has no logits for every position, which quality.py reads; it gives
the default int4 model's tokens (tests/models/test_models_variants.py).

drafts: greedy replies with PROMPT_LOOKUP_TOKENS (the sidecar's own model/generator/drafts.py) on
and off, alternately in one process each: a rewrite task and a plain chat on SmolLM2, and a plain
chat on the phi3-mini shapes; decode tokens a second, accepted drafts, tokens a model call, and
whether the replies are the same.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from scripts.bench.common import BadArguments, Failed
from scripts.bench.drivers import cpu_name, words

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / "build" / "variants"
REAL = "smollm2-135m-instruct"
REAL_HF = REPO / "build" / "real-models" / f"{REAL}-hf"  # make_real_model.py's work folder

# make_model.py flags of each generated variant; "default" is the published model's layout.
GENERATED = {
    "default": [],
    "block-64": ["--block-size", "64"],
    "block-128": ["--block-size", "128"],
    "int4-embedding": ["--int4-embedding"],
    "pruned-lm-head": ["--prune-lm-head"],
    "kv-int8": ["--kv-cache", "int8_per_channel"],
    # The builder turns off the shared past/present buffer for a quantized KV cache on the
    # CPU (so does make_model.py); onnxruntime 1.31's CPU attention runs it shared too.
    "kv-int8+shared-buffer": ["--kv-cache", "int8_per_channel"],
    "block-128+int4-embedding+pruned": [
        "--block-size", "128", "--int4-embedding", "--prune-lm-head",
    ],
}  # fmt: skip
# export_model.py flags of each SmolLM2 variant (int4: block 32, accuracy level 4 by default).
EXPORTED = {
    "fp32 kv-int8 per channel": ["--precision", "fp32", "--kv-cache", "int8_per_channel"],
    "fp32 kv-int8 per tensor": ["--precision", "fp32", "--kv-cache", "int8_per_tensor"],
    "int4": [],
    "int4 block-64": ["--block-size", "64"],
    "int4 block-128": ["--block-size", "128"],
    "int4 accuracy-level-1": ["--accuracy-level", "1"],
    "int4 int4-embedding (shared)": ["--int4-embedding", "--shared-embeddings"],
    "int4 kv-int8 per channel": ["--kv-cache", "int8_per_channel"],
    "int4 kv-int8 per tensor": ["--kv-cache", "int8_per_tensor"],
    "int4 block-128 + kv-int8 per channel": [
        "--block-size", "128", "--kv-cache", "int8_per_channel",
    ],
}  # fmt: skip

REWRITE = (
    "Rewrite this paragraph with the spelling mistakes corrected, changing nothing else:\n\n"
    "The sidecar pattern runs a helper container next to the main aplication. The helper "
    "shares the network of the app, so the app calls it on localhost without any extra "
    "configuraton. Each container can be updated on its own, and the helper can be writen in "
    "another language than the app. Logs and metrics from both containers are collected "
    "together, wich makes problems easier to find."
)
CHAT = "What are three good habits for writing maintainable software? Answer briefly."


# -- the child process: one model folder, measured on request --------------------------------


@dataclass
class Measured:
    prefill_tps: float
    decode_tps: float
    kv_bytes_per_token: int
    peak_rss_mb: float
    tokens: list[int]
    drafts_checked: int = 0
    drafts_accepted: int = 0
    model_calls: int = 0


class Child:
    """A model folder loaded in a process of its own (its own threads, its own peak RSS)."""

    def __init__(self, folder: Path, draft_tokens: int = 0) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child, str(folder), draft_tokens), daemon=True
        )
        self._process.start()
        child.close()
        self._conn.recv()

    def run(self, prompt: str | int, new_tokens: int, exact: bool = True) -> Measured:
        """`prompt`: a user message, or a length in tokens (made of words); `exact`: generate
        exactly new_tokens (EOS held off), else stop at EOS."""
        self._conn.send((prompt, new_tokens, exact))
        result = self._conn.recv()
        if isinstance(result, str):
            raise RuntimeError(result)
        measured: Measured = result
        return measured

    def close(self) -> None:
        self._conn.send(None)
        self._process.join(30)


def _serve(conn: Connection, folder: str, draft_tokens: int) -> None:
    from sidecar.model.cpus import cpu_budget, session_options
    from sidecar.model.engine import og
    from sidecar.model.generator.drafts import draft_counts, use_prompt_lookup

    config = og.Config(folder)
    overlay = {"model": {"decoder": {"session_options": session_options(cpu_budget().count, True)}}}
    config.overlay(json.dumps(overlay))
    model = og.Model(config)
    tokenizer = og.Tokenizer(model)

    def ids_of(text: str) -> list[int]:
        messages = json.dumps([{"role": "user", "content": text}])
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return [int(i) for i in tokenizer.encode(rendered)]

    def sized(tokens: int) -> list[int]:
        count = 1
        while len(ids := ids_of(words(count, 7))) < tokens:
            count += max(1, (tokens - len(ids)) // 2)
        return ids

    conn.send("ready")
    while (job := conn.recv()) is not None:
        prompt, new_tokens, exact = job
        try:
            ids = sized(prompt) if isinstance(prompt, int) else ids_of(prompt)
            params = og.GeneratorParams(model)
            length = len(ids) + new_tokens
            options: dict[str, Any] = {"max_length": length, "do_sample": False}
            if exact:
                options["min_length"] = length
            params.set_search_options(**options)
            use_prompt_lookup(params, draft_tokens)
            generator = og.Generator(model, params)
            began = time.perf_counter()
            generator.append_tokens(ids)
            generator.generate_next_token()  # the first token ends the prefill
            first = time.perf_counter()
            while not generator.is_done():
                generator.generate_next_token()
            done = time.perf_counter()
            tokens = [int(t) for t in generator.get_sequence(0)[len(ids) :]]
            key = generator.get_output("present.0.key")
            per_token = (
                2 * layers(folder) * int(key.shape[1]) * int(key.shape[3]) * key.dtype.itemsize
            )
            drafts = draft_counts(generator) if draft_tokens else None
            conn.send(
                Measured(
                    prefill_tps=len(ids) / (first - began),
                    decode_tps=(len(tokens) - 1) / (done - first) if len(tokens) > 1 else 0.0,
                    kv_bytes_per_token=per_token,
                    peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                    tokens=tokens,
                    drafts_checked=drafts.checked if drafts else 0,
                    drafts_accepted=drafts.accepted if drafts else 0,
                    model_calls=drafts.steps if drafts else len(tokens),
                )
            )
        except Exception as exc:  # reported by the parent, which stops
            conn.send(f"{type(exc).__name__}: {exc}")


def layers(folder: str) -> int:
    config = json.loads((Path(folder) / "genai_config.json").read_text())
    return int(config["model"]["decoder"]["num_hidden_layers"])


# -- the tables --------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def build_generated(name: str, preset: str, work: Path) -> Path:
    folder = work / f"{preset}-{name}"
    if not (folder / "genai_config.json").is_file():
        command = ["-m", "scripts.models.make_model", "--preset", preset, "--out", str(folder)]
        subprocess.run(
            [sys.executable, *command, *GENERATED[name]],
            cwd=REPO,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        if name.endswith("+shared-buffer"):
            path = folder / "genai_config.json"
            config = json.loads(path.read_text())
            config["search"]["past_present_share_buffer"] = True
            path.write_text(json.dumps(config, indent=4) + "\n")
    return folder


def alternate(
    children: list[Child], prompt: str | int, new_tokens: int, reps: int, exact: bool = True
) -> Iterator[list[Measured]]:
    """`reps` rounds; in each, every child runs once, in turns (the order flips each round)."""
    for rep in range(reps):
        order = list(range(len(children)))
        if rep % 2:
            order.reverse()
        results: dict[int, Measured] = {}
        for i in order:
            results[i] = children[i].run(prompt, new_tokens, exact)
        yield [results[i] for i in range(len(children))]


def speed(args: argparse.Namespace) -> list[dict[str, Any]]:
    """A row per variant, printed as soon as it is measured (a long run is readable midway)."""
    rows: list[dict[str, Any]] = []
    work = args.work_dir
    names = [n for n in args.variants.split(",") if n and n != "default"]
    default = build_generated("default", args.preset, work)
    print(
        f"{args.preset} shapes on {cpu_name()}, {args.prompt_tokens}-token prompt, "
        f"{args.new_tokens} new tokens, medians of {args.reps} alternated runs against the "
        "default folder; each cell: variant / default, measured side by side:\n"
    )
    print(
        "| variant | files MiB | prefill tok/s | ratio | decode tok/s | ratio | KV bytes/token "
        "| peak RSS MiB |"
    )
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for name in names:
        folder = build_generated(name, args.preset, work)
        pair = [Child(default), Child(folder)]
        try:
            pair[0].run(16, 2)  # warm-up, untimed
            pair[1].run(16, 2)
            samples = list(alternate(pair, args.prompt_tokens, args.new_tokens, args.reps))
        finally:
            for child in pair:
                child.close()
        base, ours = [s[0] for s in samples], [s[1] for s in samples]
        base_mb, our_mb = _folder_mb(default), _folder_mb(folder)
        if not args.keep:
            shutil.rmtree(folder)
        bp, op = median([m.prefill_tps for m in base]), median([m.prefill_tps for m in ours])
        bd, od = median([m.decode_tps for m in base]), median([m.decode_tps for m in ours])
        print(
            f"| {name} | {our_mb:,.0f} / {base_mb:,.0f} | {op:.1f} / {bp:.1f} | "
            f"{op / bp:.2f} | {od:.2f} / {bd:.2f} | {od / bd:.2f} | "
            f"{ours[-1].kv_bytes_per_token:,} / {base[-1].kv_bytes_per_token:,} | "
            f"{max(m.peak_rss_mb for m in ours):,.0f} / {max(m.peak_rss_mb for m in base):,.0f} |",
            flush=True,
        )
        rows.append({"variant": name, "files_mib": [our_mb, base_mb], "prefill_tps": [op, bp]})
        rows[-1]["decode_tps"] = [od, bd]
        rows[-1]["samples"] = {"variant": _dicts(ours), "default": _dicts(base)}
    return rows


def _dicts(samples: list[Measured]) -> list[dict[str, Any]]:
    return [asdict(m) for m in samples]


def _folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def _run(*command: str) -> str:
    done = subprocess.run(
        [sys.executable, *command], cwd=REPO, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise Failed(f"{' '.join(command[:3])} failed:\n{done.stdout[-2000:]}{done.stderr}")
    return done.stdout


def real_reference(work: Path) -> Path:
    """SmolLM2's fp32 folder and its Hugging Face folder (scripts/models/make_real_model.py)."""
    fp32 = work / f"{REAL}-fp32"
    command = ["--model", REAL, "--out", str(fp32), "--precision", "fp32"]
    _run("-m", "scripts.models.make_real_model", *command)
    return fp32


def export_real(name: str, work: Path) -> Path:
    folder = work / f"{REAL}-{name.replace(' ', '_').replace('+', '')}"
    if not (folder / "genai_config.json").is_file():
        shutil.rmtree(folder, ignore_errors=True)
        _run(
            "-m",
            "scripts.models.export_model",
            "--model",
            str(REAL_HF),
            "--out",
            str(folder),
            "--cache-dir",
            str(work / "export-cache"),
            *EXPORTED[name],
        )
    return folder


def quality(args: argparse.Namespace) -> list[dict[str, Any]]:
    reference = real_reference(args.work_dir)
    print(f"SmolLM2-135M-Instruct on {cpu_name()}; reference: fp32 ({reference})\n")
    rows: list[dict[str, Any]] = []
    for name in [n for n in args.variants.split(",") if n] or list(EXPORTED):
        folder = export_real(name, args.work_dir)
        scores = args.work_dir / f"quality-{folder.name}.json"
        command = ["--model", str(folder), "--reference", str(reference), "--json", str(scores)]
        table = _run("-m", "scripts.bench", "quality", *command)
        print(f"### {name} ({_folder_mb(folder):,.0f} MiB)\n\n{table}", flush=True)
        rows.append({"variant": name, "files_mib": _folder_mb(folder)})
        rows[-1]["quality"] = json.loads(scores.read_text())
    return rows


def drafts(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cases: list[tuple[str, Path, str | int, bool]] = []
    if not args.skip_real:
        real = args.real or args.work_dir / f"{REAL}-int4"
        if args.real is None:
            command = ["--model", REAL, "--out", str(real), "--precision", "int4"]
            _run("-m", "scripts.models.make_real_model", *command)
        cases += [("SmolLM2 int4, rewrite", real, REWRITE, False)]
        cases += [("SmolLM2 int4, plain chat", real, CHAT, False)]
    if not args.skip_generated:
        folder = build_generated("default", args.preset, args.work_dir)
        cases += [(f"{args.preset} shapes, plain chat", folder, CHAT, True)]
    print(
        f"PROMPT_LOOKUP_TOKENS={args.draft_tokens} against 0 on {cpu_name()}, greedy, up to "
        f"{args.new_tokens} new tokens, medians of {args.reps} alternated runs:\n"
    )
    print(
        "| case | decode tok/s off | on | ratio | drafts accepted | tokens per model call "
        "| same reply |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, folder, prompt, exact in cases:
        pair = [Child(folder, 0), Child(folder, args.draft_tokens)]
        try:
            for child in pair:
                child.run(16, 2)
            samples = list(alternate(pair, prompt, args.new_tokens, args.reps, exact))
        finally:
            for child in pair:
                child.close()
        off, on = [s[0] for s in samples], [s[1] for s in samples]
        d_off, d_on = median([m.decode_tps for m in off]), median([m.decode_tps for m in on])
        last = on[-1]
        accepted = f"{last.drafts_accepted}/{last.drafts_checked}"
        per_call = len(last.tokens) / last.model_calls if last.model_calls else 0.0
        same = all(a.tokens == b.tokens for a, b in zip(off, on, strict=True))
        print(
            f"| {label} | {d_off:.1f} | {d_on:.1f} | {d_on / d_off:.2f} | {accepted} | "
            f"{per_call:.2f} | {'yes' if same else 'no'} |",
            flush=True,
        )
        rows.append({"case": label, "decode_tps": [d_off, d_on], "drafts_accepted": accepted})
        rows[-1] |= {"tokens_per_call": per_call, "same_reply": same}
        rows[-1]["samples"] = {"off": _dicts(off), "on": _dicts(on)}
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("table", choices=("speed", "quality", "drafts"))
    p.add_argument("--preset", default="phi3-mini", help="generated shapes (speed, drafts)")
    p.add_argument("--variants", default="", help="comma-separated names (default: all)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--draft-tokens", type=int, default=4, help="PROMPT_LOOKUP_TOKENS for drafts")
    p.add_argument("--skip-real", action="store_true", help="drafts: not on SmolLM2")
    p.add_argument("--real", type=Path, help="drafts: this SmolLM2 folder (default: built)")
    p.add_argument("--skip-generated", action="store_true", help="drafts: not on phi3-mini")
    p.add_argument("--keep", action="store_true", help="speed: keep the variants' folders")
    p.add_argument("--work-dir", type=Path, default=WORK)


def main(args: argparse.Namespace) -> dict[str, Any]:
    if args.table == "speed" and not args.variants:
        args.variants = ",".join(GENERATED)
    unknown = set(filter(None, args.variants.split(","))) - set(
        GENERATED if args.table == "speed" else EXPORTED
    )
    if unknown and args.table != "drafts":
        raise BadArguments(f"unknown variants: {', '.join(sorted(unknown))}")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    rows = {"speed": speed, "quality": quality, "drafts": drafts}[args.table](args)
    return {"table": args.table, "rows": rows}
