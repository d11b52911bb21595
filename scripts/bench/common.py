"""What the benchmarks share besides driving a generation (drivers.py): the model folder they
run on, the machine they name, a process's peak memory, the sidecar's cache budget, and how a
benchmark says that its arguments are wrong or that it failed (__main__.py turns those into
exit status 2 and 1)."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from scripts.models.realmodel.sources import SMOLLM2_135M_INSTRUCT
from scripts.run import services
from sidecar.model.folder import is_complete
from sidecar.settings import Settings

REPO = services.REPO
PRESET_DIRS = {
    "phi3-mini": REPO / "models" / "generated-phi3-mini",
    "phi3-mini-vision": REPO / "models" / "generated-phi3-mini-vision",
    "small": None,
    "tiny": None,
    "tiny-vision": None,
}


class BadArguments(Exception):
    """Arguments argparse alone cannot judge together: the usage line and exit status 2."""


class Failed(Exception):
    """The benchmark ran but failed (or could not run): one line on stderr, exit status 1. What
    it measured before that (`result`) is still written as JSON."""

    def __init__(self, message: str, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.result = result


def ensure_model(args: argparse.Namespace, scratch: Path, home: Path | None = None) -> Path:
    """The model folder: --model, or the --preset built once (phi3-mini into models/, the
    others into `home`, else into `scratch`, deleted after the run)."""
    if args.model == "smollm2":
        model = SMOLLM2_135M_INSTRUCT
        out = REPO / "build" / "real-models" / f"{model.name}-{model.precision}"
        make = [sys.executable, "-m", "scripts.models.make_real_model"]
        subprocess.run([*make, "--model", model.name, "--out", str(out)], check=True)
        return out
    if args.model:
        return Path(args.model)
    out = PRESET_DIRS.get(args.preset) or (home or scratch) / args.preset
    if is_complete(out):
        return out
    print(f"building the generated {args.preset} model into {out} ...", flush=True)
    make = [sys.executable, "-m", "scripts.models.make_model"]
    subprocess.run([*make, "--preset", args.preset, "--out", str(out)], check=True)
    return out


def peak_rss_bytes(pid: int, *, children: bool = True) -> int:
    """Kernel-tracked peak RSS (VmHWM) of a process and (optionally) its children, summed."""
    import psutil

    total = 0
    root = psutil.Process(pid)
    for proc in [root, *(root.children(recursive=True) if children else [])]:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))
        total += int(kib) * 1024
    return total


def prompt_cache_mb() -> int:
    """The conversation cache budget the sidecars run with: the environment's, else the default."""
    raw = os.environ.get("PROMPT_CACHE_MB", "").strip()
    return int(raw) if raw else int(Settings.model_fields["prompt_cache_mb"].default)


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def peer_model(model_dir: Path, scratch: Path) -> Path:
    """--peers: the GGUF of the model (converted once, beside it when that folder is writable)
    after checking that llama-server is installed."""
    from scripts.bench.peers import gguf_model, llamacpp

    if not llamacpp.server_binary().exists():
        raise Failed(f"--peers: {llamacpp.server_binary()} is missing; run `make peers`")
    writable = os.access(model_dir.parent, os.W_OK) and not model_dir.is_relative_to(scratch)
    return gguf_model.ensure(model_dir, None if writable else scratch)
