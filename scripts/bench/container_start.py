"""Measure the sidecar container's start: from `podman run` to the first 200 of GET /readyz
(the model loaded and warmed up), with the model baked into the image and on a mounted folder.

    python -m scripts.bench container-start --baked IMAGE --runtime IMAGE \
        --model-dir build/phi3-mini --runs 3 --json build/container-start.json

IMAGE names are podman images built from phi3-sidecar/Dockerfile: --baked the default target
(`--build-context model=DIR`), --runtime the `runtime` target, which gets DIR mounted
read-only at /home/models/mounted. Before each run the model's files are dropped from the page
cache (posix_fadvise DONTNEED on those files only: nothing else on the machine is touched), so
every start reads the model from disk, as the first start of an instance does. Each run's
container is removed at its end. The figure feeds WEBSITES_CONTAINER_START_TIME_LIMIT in
infra/main.bicep (docs/benchmarks/container-start.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.common import BadArguments
from scripts.bench.drivers import cpu_name
from scripts.run.services import free_port

MOUNT_POINT = "/home/models/mounted"
READY_TIMEOUT_S = 1800.0  # App Service's longest WEBSITES_CONTAINER_START_TIME_LIMIT


def podman(*args: str, timeout: float = 120) -> str:
    result = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"podman {' '.join(args)} failed:\n{result.stderr[-2000:]}")
    return result.stdout.strip()


def drop_from_page_cache(folder: Path) -> int:
    """Evict the files under `folder` from the page cache; their total size in bytes."""
    total = 0
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            total += path.stat().st_size
    return total


def baked_model_folder(image: str) -> Path:
    """The folder in podman's storage that holds the image's /opt/model (the layer that
    copied it in): the files the container will read."""
    data = json.loads(podman("image", "inspect", "--format", "{{json .GraphDriver.Data}}", image))
    layers = [data.get("UpperDir", ""), *data.get("LowerDir", "").split(":")]
    for layer in filter(None, layers):
        folder = Path(layer) / "opt" / "model"
        if (folder / "genai_config.json").is_file():
            return folder
    raise SystemExit(f"{image}: no layer holds /opt/model/genai_config.json")


@contextlib.contextmanager
def container(image: str, port: int, *extra: str) -> Iterator[str]:
    name = f"phi3-start-{uuid.uuid4().hex[:8]}"
    try:
        podman(
            "run", "--detach", f"--name={name}", f"--publish=127.0.0.1:{port}:8000", *extra, image
        )
        yield name
    finally:
        subprocess.run(["podman", "rm", "--force", "--time=0", name], capture_output=True)


def time_to_ready(image: str, *extra: str) -> dict[str, float]:
    """Seconds from `podman run` to the first /healthz and /readyz 200."""
    port = free_port()
    started = time.monotonic()
    seen: dict[str, float] = {}
    with container(image, port, *extra), httpx.Client(timeout=2) as client:
        while "readyz" not in seen:
            if time.monotonic() - started > READY_TIMEOUT_S:
                raise SystemExit(f"{image}: not ready after {READY_TIMEOUT_S} s")
            for probe in ("healthz", "readyz"):
                if probe not in seen:
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(f"http://127.0.0.1:{port}/{probe}").status_code == 200:
                            seen[probe] = round(time.monotonic() - started, 2)
            time.sleep(0.1)
    return seen


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baked", help="image with the model baked in")
    parser.add_argument("--runtime", help="image without a model (the runtime target)")
    parser.add_argument("--model-dir", type=Path, help="model folder to mount into --runtime")
    parser.add_argument("--runs", type=int, default=3)


def main(args: argparse.Namespace) -> dict[str, Any]:
    cases: list[tuple[str, str, tuple[str, ...], Path]] = []
    if args.baked:
        cases.append(("baked", args.baked, (), baked_model_folder(args.baked)))
    if args.runtime:
        if args.model_dir is None:
            raise BadArguments("--runtime needs --model-dir")
        folder = args.model_dir.resolve()
        mount = (f"--volume={folder}:{MOUNT_POINT}:ro", f"--env=MODEL_PATH={MOUNT_POINT}")
        cases.append(("mounted", args.runtime, mount, folder))
    if not cases:
        raise BadArguments("name an image: --baked, --runtime, or both")
    results: dict[str, Any] = {"cpu": cpu_name(), "cpus": os.cpu_count(), "runs": {}}
    runs: dict[str, list[dict[str, float]]] = {}
    for label, image, extra, folder in cases:
        runs[label] = []
        for _ in range(args.runs):
            size = drop_from_page_cache(folder)
            seen = time_to_ready(image, *extra)
            runs[label].append(seen)
            print(json.dumps({"case": label, "model_bytes": size, **seen}), flush=True)
    results["runs"] = runs
    results["max_ready_s"] = max(run["readyz"] for case in runs.values() for run in case)
    print("\n| model | run | first /healthz 200 (s) | first /readyz 200 (s) |")
    print("|---|---:|---:|---:|")
    for label, case in runs.items():
        for number, run in enumerate(case, 1):
            print(f"| {label} | {number} | {run.get('healthz', '-')} | {run['readyz']} |")
    return results
