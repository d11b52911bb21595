"""Run a command as on an AVX2-only CPU (avx2_only.c): `python -m scripts.run.avx2_only CMD...`.

onnxruntime's int4 kernels differ between AVX-512 VNNI CPUs and AVX2-only ones in what
matters to the tests: whether a row gets the same bits alone and in a batch
(tests/support/kernels.py). The machines this was written on have AVX-512; a CI machine or
a plan's CPU may not.
`make test-avx2` runs the exactness tests this way; `env()` gives the settings for a process
that a test starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD = HERE.parents[1] / "build" / "cpu"


class Unavailable(RuntimeError):
    """No C compiler, or no CPUID faulting on this CPU or kernel: the shim cannot work here."""


def library() -> Path:
    """The shim, compiled once per source change into build/cpu/."""
    source = HERE / "avx2_only.c"
    out = BUILD / "avx2_only.so"
    if out.exists() and out.stat().st_mtime >= source.stat().st_mtime:
        return out
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise Unavailable("no C compiler (cc) to build the cpuid shim")
    BUILD.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", str(source), "-o", str(out), "-ldl"], check=True
    )
    return out


def env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with the shim preloaded; Unavailable
    where it would not take effect."""
    merged = dict(os.environ if base is None else base)
    preload = str(library())
    merged["LD_PRELOAD"] = " ".join(filter(None, [preload, merged.get("LD_PRELOAD", "")]))
    probe = [sys.executable, "-c", _PROBE]
    answer = subprocess.run(probe, env=merged, capture_output=True, text=True, check=False)
    if answer.stdout.strip() != "avx2-only":
        raise Unavailable(
            f"cpuid is not masked here (CPUID faulting unsupported?): {answer.stdout.strip()!r}"
            f" {answer.stderr.strip()[-200:]!r}"
        )
    return merged


# numpy reads cpuid at import: what it reports is what the shim answered.
_PROBE = """
import numpy._core._multiarray_umath as m
found = {name for name, present in m.__cpu_features__.items() if present}
print("avx2-only" if "AVX2" in found and "AVX512F" not in found else sorted(found))
"""


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    return subprocess.run(argv, env=env(), check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
