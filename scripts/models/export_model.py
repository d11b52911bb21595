"""Convert a Hugging Face model into a folder the sidecar loads, with onnxruntime-genai's own
model builder, then check that the folder loads and answers one token.

    python -m scripts.models.export_model --model Qwen/Qwen2.5-0.5B-Instruct
    python -m scripts.models.export_model --model ./my-hf-model --out models/mine --precision int4

--model is a Hugging Face Hub id (owner/name: downloaded by the builder; HF_TOKEN for gated
models) or a local folder with config.json, the weights and the tokenizer. The default is int4
for the CPU, the sidecar's configuration; --precision and --execution-provider take the
builder's other combinations (fp16/bf16 for cuda, fp32 for cpu, ...). The check loads the
folder with the sidecar's own engine, renders a chat through the model's template and generates
one token; it then prints what the sidecar will take from the folder and the MODEL_PATH to use.

Variants (the builder's --extra_options of the same names; docs/benchmarks/variants.md has their
speed, memory and quality):

    --block-size 128          int4 block of every MatMulNBits (block_size; default 32)
    --accuracy-level 4        MatMulNBits' activations: 4 int8 (CPU default), 1 fp32
    --int4-embedding          int4 embedding table (op_types_to_quantize=MatMul/Gather)
    --shared-embeddings       one int4 matrix for the embedding and the LM head (a model with
                              tie_word_embeddings only; with --int4-embedding)
    --prune-lm-head           logits of the last prompt position only (prune_lm_head)
    --kv-cache int8_per_channel
                              int8 KV cache (kv_cache_quant_scheme): the model is built once
                              with an fp32 KV cache, its K and V are calibrated on text with
                              onnxruntime_genai.models.quantization.kv_cache_calibration, then
                              it is built again with the scales (kept as kv_cache_scales.json)

Needs the builder's dependencies: `pip install -r requirements-export.txt` (torch CPU,
transformers; `make export HF_MODEL=...` installs them). Exit status: 0 done, 1 failed (one
sentence on stderr), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BUILDER = "onnxruntime_genai.models.builder"
PRECISIONS = ("int4", "int8", "fp16", "bf16", "fp32")
PROVIDERS = ("cpu", "cuda", "dml", "webgpu", "NvTensorRtRtx")
# What the builder imports besides onnxruntime-genai (requirements-export.txt).
BUILDER_NEEDS = ("torch", "transformers", "onnx_ir", "safetensors")
BLOCK_SIZES = (16, 32, 64, 128, 256)
KV_CACHE_TYPES = ("int8_per_tensor", "int8_per_channel")
CALIBRATION = "onnxruntime_genai.models.quantization.kv_cache_calibration"
KV_SCALES = "kv_cache_scales.json"  # the calibrated scales, kept in the exported folder
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# onnxruntime's quantizer logs one INFO line per node; counted instead of shown.
QUANTIZER_LINE = re.compile(r"matmul_nbits_quantizer \[INFO\] - (start to|complete|skip to) quant")


class ExportError(Exception):
    """The export failed; str() is one sentence for the user."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True, help="Hugging Face Hub id (owner/name) or folder")
    p.add_argument("--out", type=Path, help="folder to write (default: models/<name>-<p>-<ep>)")
    p.add_argument("--precision", choices=PRECISIONS, default="int4")
    p.add_argument("--execution-provider", choices=PROVIDERS, default="cpu")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=REPO / "build" / "export-cache",
        help="the builder's download and scratch folder (default: build/export-cache)",
    )
    p.add_argument(
        "--extra-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to the builder's --extra_options (repeatable), e.g. accuracy_level=4",
    )
    p.add_argument("--block-size", type=int, choices=BLOCK_SIZES, help="int4 block size")
    p.add_argument("--accuracy-level", type=int, choices=(1, 2, 3, 4), help="MatMulNBits' math")
    p.add_argument("--int4-embedding", action="store_true", help="int4 embedding table")
    p.add_argument(
        "--shared-embeddings", action="store_true", help="embedding and LM head share weights"
    )
    p.add_argument("--prune-lm-head", action="store_true", help="last position's logits only")
    p.add_argument("--kv-cache", choices=KV_CACHE_TYPES, help="quantized KV cache, calibrated")
    p.add_argument("--no-check", action="store_true", help="skip loading the result")
    p.add_argument("--verbose", action="store_true", help="show every line the builder prints")
    args = p.parse_args(argv)
    local = Path(args.model).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            p.error(f"{args.model} is a folder without config.json: not a Hugging Face model")
        args.local = local.resolve()
    elif HUB_ID.match(args.model):
        args.local = None
    else:
        p.error(f"--model {args.model!r} is neither a folder nor a Hub id like owner/name")
    for option in args.extra_option:
        if not re.match(r"^\w+=\S+$", option):
            p.error(f"--extra-option wants KEY=VALUE, not {option!r}")
    given = {option.split("=", 1)[0] for option in args.extra_option}
    for option in variant_options(args):
        key = option.split("=", 1)[0]
        if key in given:
            p.error(f"--extra-option {key}=... repeats a variant option: give it once")
    if args.out is None:
        name = (args.local.name if args.local else args.model.split("/")[1]).lower()
        args.out = Path("models") / f"{name}-{args.precision}-{args.execution_provider.lower()}"
    if args.out.exists() and any(args.out.iterdir()):
        p.error(f"--out {args.out} exists and is not empty: choose another folder or delete it")
    return args


def check_builder_installed() -> None:
    missing = [name for name in BUILDER_NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(
            f"The model builder needs {', '.join(missing)}: install them with "
            "`pip install -r requirements-export.txt` (or run `make export HF_MODEL=...`)."
        )


def variant_options(args: argparse.Namespace, scales: Path | None = None) -> list[str]:
    """The builder's --extra_options for the variant flags; the KV cache's only with the
    calibrated `scales` (the first build, which calibration reads, has an fp32 KV cache)."""
    options = []
    if args.block_size:
        options.append(f"block_size={args.block_size}")
    if args.accuracy_level:
        options.append(f"accuracy_level={args.accuracy_level}")
    if args.int4_embedding:
        options.append("op_types_to_quantize=MatMul/Gather")
    if args.shared_embeddings:
        options.append("shared_embeddings=true")
    if args.prune_lm_head:
        options.append("prune_lm_head=true")
    if args.kv_cache and scales is not None:
        options += [f"kv_cache_quant_scheme={args.kv_cache}", f"kv_cache_scale_file={scales}"]
    return options


def builder_command(
    args: argparse.Namespace, out: Path | None = None, scales: Path | None = None
) -> list[str]:
    source = ["-i", str(args.local)] if args.local else ["-m", args.model]
    command = [
        sys.executable,
        "-m",
        BUILDER,
        *source,
        "-o",
        str((out or args.out).resolve()),
        "-p",
        args.precision,
        "-e",
        args.execution_provider,
        "-c",
        str(args.cache_dir.resolve()),
    ]
    options = [*args.extra_option, *variant_options(args, scales)]
    if options:
        command += ["--extra_options", *options]
    return command


def run_builder(
    args: argparse.Namespace, out: Path | None = None, scales: Path | None = None
) -> None:
    """Run the builder, showing its progress; ExportError with its last words if it fails."""
    env = dict(os.environ)
    if args.local:  # nothing to download: never wait for a Hub that cannot be reached
        env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        builder_command(args, out, scales),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
        errors="replace",
    )
    assert process.stdout is not None
    tail: list[str] = []
    for line in progress(process.stdout, args.verbose, tail):
        print(line, flush=True)
    process.wait()
    if process.returncode != 0:
        reason = next((line for line in reversed(tail) if line.strip()), "no output")
        where = args.model
        if not args.local and re.search(r"(?i)connect|resolve|offline|timed out", reason):
            reason = f"the Hugging Face Hub could not be reached to download {where} ({reason})"
        raise ExportError(f"The builder failed (exit {process.returncode}): {reason.strip()}")


def progress(lines: Iterable[str], verbose: bool, tail: list[str]) -> Iterator[str]:
    """The builder's output, less the quantizer's line per node (counted) and the progress
    bars' intermediate states; its last 20 lines are kept in `tail` for an error message."""
    quantized = 0
    for raw in lines:
        for line in raw.replace("\r", "\n").splitlines():
            tail[:] = [*tail[-19:], line]
            if verbose:
                yield line
            elif QUANTIZER_LINE.search(line):
                if "complete" in line:
                    quantized += 1
                    if quantized % 50 == 0:
                        yield f"  quantized {quantized} weight matrices..."
            elif re.search(r"\d+/\d+ \[", line) and "100%" not in line:
                continue  # a progress bar on its way
            elif line.strip():
                yield line
    if quantized:
        yield f"  quantized {quantized} weight matrices"


def export_with_kv_cache(args: argparse.Namespace) -> None:
    """--kv-cache: build with an fp32 KV cache (in the cache folder), calibrate its K and V on
    the calibration tool's own text, build again with the scales."""
    baseline = args.cache_dir.resolve() / f"kv-baseline-{args.out.resolve().name}"
    if baseline.exists():
        shutil.rmtree(baseline)
    print(f"  building the fp32-KV model to calibrate on ({baseline})")
    run_builder(args, out=baseline)
    scales = args.cache_dir.resolve() / f"{args.out.resolve().name}-{KV_SCALES}"
    quant = args.kv_cache
    print(f"  calibrating the KV cache scales ({quant}) on the calibration tool's text")
    tokenizer = str(args.local) if args.local else args.model
    decoder = json.loads((baseline / "genai_config.json").read_text())["model"]["decoder"]
    graph = baseline / decoder["filename"]
    command = [sys.executable, "-m", CALIBRATION, "--model", str(graph)]
    command += ["--tokenizer", tokenizer, "--out", str(scales), "--quant-type", quant]
    done = subprocess.run(command, capture_output=True, text=True, errors="replace")
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise ExportError(f"The KV cache calibration failed: {lines[-1]}")
    shutil.rmtree(baseline)
    run_builder(args, scales=scales)
    shutil.copyfile(scales, args.out / KV_SCALES)


def add_generation_eos(args: argparse.Namespace) -> list[int]:
    """generation_config.json's end-of-turn ids that genai_config.json lacks (the builder reads
    only config.json and the tokenizer): added, so that onnxruntime-genai stops there too."""
    if args.local is None:
        return []
    generation = args.local / "generation_config.json"
    if not generation.is_file():
        return []
    wanted = json.loads(generation.read_text(encoding="utf-8")).get("eos_token_id")
    wanted = [wanted] if isinstance(wanted, int) else list(wanted or [])
    path = args.out / "genai_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    have = config["model"].get("eos_token_id")
    have = [have] if isinstance(have, int) else list(have or [])
    added = [int(i) for i in wanted if i not in have]
    if added:
        config["model"]["eos_token_id"] = have + added
        path.write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    return added


def check(out: Path) -> dict[str, Any]:
    """Load the folder with the sidecar's engine and generate one token through the model's
    chat template; returns what the sidecar takes from the folder."""
    from sidecar.model.engine import Engine

    engine = Engine(out.resolve())
    engine.warm_up()
    return {"context_length": engine.context_length, **engine.facts.log_fields()}


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    try:
        check_builder_installed()
        print(f"exporting {args.model} to {args.out} ({args.precision}, {args.execution_provider})")
        if args.kv_cache:
            export_with_kv_cache(args)
        else:
            run_builder(args)
        added = add_generation_eos(args)
        if added:
            print(f"  added generation_config.json's end ids {added} to genai_config.json")
        if not args.no_check:
            if args.execution_provider != "cpu":
                print(
                    f"  not loaded here: the check runs on cpu, the model is for "
                    f"{args.execution_provider}"
                )
            else:
                facts = check(args.out)
                print("  loaded and generated one token: " + json.dumps(facts))
    except ExportError as e:
        sys.stderr.write(f"error: {e}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted; delete the --out folder and run it again.\n")
        return 130
    except Exception as e:  # the check: the sidecar's own one-line errors
        sys.stderr.write(f"error: the exported folder does not load: {e}\n")
        return 1
    took = time.perf_counter() - began
    print(f"done in {took:.0f} s: {folder_size(args.out):,} bytes in {args.out}")
    print(f"MODEL_PATH={args.out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
