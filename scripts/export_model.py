"""Convert a Hugging Face model into a folder the sidecar loads, with onnxruntime-genai's own
model builder, then check that the folder loads and answers one token.

    python scripts/export_model.py --model Qwen/Qwen2.5-0.5B-Instruct
    python scripts/export_model.py --model ./my-hf-model --out models/mine --precision int4

--model is a Hugging Face Hub id (owner/name: downloaded by the builder; HF_TOKEN for gated
models) or a local folder with config.json, the weights and the tokenizer. The default is int4
for the CPU, the sidecar's configuration; --precision and --execution-provider take the
builder's other combinations (fp16/bf16 for cuda, fp32 for cpu, ...). The check loads the
folder with the sidecar's own engine, renders a chat through the model's template and generates
one token; it then prints what the sidecar will take from the folder and the MODEL_PATH to use.

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
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BUILDER = "onnxruntime_genai.models.builder"
PRECISIONS = ("int4", "int8", "fp16", "bf16", "fp32")
PROVIDERS = ("cpu", "cuda", "dml", "webgpu", "NvTensorRtRtx")
# What the builder imports besides onnxruntime-genai (requirements-export.txt).
BUILDER_NEEDS = ("torch", "transformers", "onnx_ir", "safetensors")
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


def builder_command(args: argparse.Namespace) -> list[str]:
    source = ["-i", str(args.local)] if args.local else ["-m", args.model]
    command = [
        sys.executable,
        "-m",
        BUILDER,
        *source,
        "-o",
        str(args.out.resolve()),
        "-p",
        args.precision,
        "-e",
        args.execution_provider,
        "-c",
        str(args.cache_dir.resolve()),
    ]
    if args.extra_option:
        command += ["--extra_options", *args.extra_option]
    return command


def run_builder(args: argparse.Namespace) -> None:
    """Run the builder, showing its progress; ExportError with its last words if it fails."""
    env = dict(os.environ)
    if args.local:  # nothing to download: never wait for a Hub that cannot be reached
        env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        builder_command(args),
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
