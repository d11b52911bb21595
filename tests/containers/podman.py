"""Build and run the real images with podman: the harness behind tests/containers/.

Everything that only the test machine needs stays here, never in the Dockerfiles: the local
stand-in base image (scripts/run/container_base.sh), the host's CA bundle and a pip config that
points at the public PyPI index (mounted into `podman build` only), and `--network host` for
the build. Each run's containers and pods get unique names and a label with the pid of the
test process, so leftovers of a killed run are found and removed by the next one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from scripts.run.services import free_port

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build" / "containers"
IMAGES = "localhost/phi3-chat-test"
APP_IMAGE = f"{IMAGES}/app:latest"
SIDECAR_IMAGE = f"{IMAGES}/sidecar:latest"  # target runtime: no model inside
SIDECAR_MODEL_IMAGE = f"{IMAGES}/sidecar:tiny-model"  # default target: the tiny model baked in
BASE_IMAGE = "docker.io/library/python:3.11-slim-bookworm"
LABEL = "phi3chat.test.pid"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# The public index: a pip config on the host (local mirrors, find-links) is not for images.
PIP_INDEX_URL = os.environ.get("CONTAINER_PIP_INDEX_URL", "https://pypi.org/simple")


def require_podman() -> str:
    """podman's path; without it the test fails on CI (CI=true) and is skipped elsewhere."""
    path = shutil.which("podman")
    if path:
        return path
    message = (
        "podman is not installed, so the images cannot be built and run; "
        "run scripts/run/setup_podman.sh (as root) first"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " (CI=true: this test must run on CI)", pytrace=False)
    pytest.skip(message)


def podman(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run one podman command; on failure the error shows its output."""
    result = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} exited {result.returncode}:\n"
            f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return result


def ensure_base_image() -> None:
    """The local stand-in for python:3.11-slim-bookworm (cached; seconds once made)."""
    result = subprocess.run(
        [str(REPO / "scripts" / "run" / "container_base.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(
            f"scripts/run/container_base.sh failed:\n{result.stdout}{result.stderr}"
        )


def pip_config(folder: Path) -> Path:
    """A pip.conf for the build containers: the public index and the host's CA bundle."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "pip.conf"
    path.write_text(f"[global]\nindex-url = {PIP_INDEX_URL}\ncert = {CA_BUNDLE}\n")
    return path


def build(context: Path, tag: str, pip_conf: Path, *extra: str) -> float:
    """`podman build` of a real Dockerfile; returns the seconds it took."""
    started = time.monotonic()
    podman(
        "build",
        "--pull=never",
        "--format=docker",  # keeps HEALTHCHECK (the OCI format has no such field)
        "--network=host",
        "--volume=/etc/ssl/certs:/etc/ssl/certs:ro",
        f"--volume={pip_conf}:/etc/pip.conf:ro",
        f"--tag={tag}",
        *extra,
        str(context),
        timeout=1200,
    )
    return time.monotonic() - started


def image_size(tag: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())


def image_inspect(tag: str) -> dict[str, Any]:
    """`podman image inspect`: Config (User, Env, Cmd, ExposedPorts), Healthcheck, ..."""
    data: list[dict[str, Any]] = json.loads(podman("image", "inspect", tag).stdout)
    return data[0]


def remove_leftovers() -> None:
    """Remove the pods, containers and volumes of earlier test runs whose process is gone."""
    kinds = {
        "pod": (("pod", "ps"), ("--time=0",)),
        "container": (("container", "ps", "--all"), ("--time=0",)),
        "volume": (("volume", "ls"), ()),
    }
    for kind, (listing_command, rm_options) in kinds.items():
        listing = podman(
            *listing_command, "--filter", f"label={LABEL}", "--format", "json", check=False
        )
        with contextlib.suppress(ValueError):
            for item in json.loads(listing.stdout or "[]"):
                labels = item.get("Labels") or {}
                pid = int(labels.get(LABEL, "0"))
                if pid and not _alive(pid):
                    name = item.get("Name") or (item.get("Names") or [""])[0]
                    podman(kind, "rm", "--force", *rm_options, name, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Images:
    """The images one session built, with build times and sizes."""

    app: str
    sidecar: str  # no model inside (target runtime)
    sidecar_model: str  # the tiny model baked in (default target)
    seconds: dict[str, float]
    sizes: dict[str, int]  # bytes, whole image including the base
    base_size: int


# Least privilege, as infra/k8s asks of the cluster: read-only root filesystem (podman mounts
# a tmpfs on /tmp), no capabilities, no privilege escalation.
HARDENED = ("--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges")


@dataclass
class Pod:
    """Two containers in one pod (one network namespace), like one App Service instance."""

    name: str
    url: str
    sidecar: str
    app: str
    containers: list[str] = field(default_factory=list)

    def logs(self) -> str:
        parts = []
        for container in self.containers:
            result = podman("logs", container, check=False)
            parts.append(f"--- {container} ---\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
        return "\n".join(parts)

    def exec_python(self, container: str, code: str) -> subprocess.CompletedProcess[str]:
        return podman("exec", container, "python", "-c", code, check=False, timeout=60)


@contextlib.contextmanager
def pair(app_image: str, sidecar_image: str, host_port: int) -> Iterator[Pod]:
    """Run the sidecar and the app in one new pod; only the app's 8080 is published.

    The pod uses slirp4netns networking: it has no address that the host can route to, so
    the only way in from outside is the published port, as on App Service, where only the
    main container's port receives traffic. Removed on exit, also after a failure.
    """
    name = unique_name("phi3-test")
    pod = Pod(name=name, url=f"http://127.0.0.1:{host_port}", sidecar="", app="")
    label = f"--label={LABEL}={os.getpid()}"
    try:
        podman(
            "pod",
            "create",
            f"--name={name}",
            label,
            "--network=slirp4netns",
            f"--publish=127.0.0.1:{host_port}:8080",
        )
        pod.sidecar = run_detached(sidecar_image, f"--pod={name}", f"--name={name}-sidecar", label)
        pod.containers.append(pod.sidecar)
        pod.app = run_detached(app_image, f"--pod={name}", f"--name={name}-app", label)
        pod.containers.append(pod.app)
        yield pod
    finally:
        podman("pod", "rm", "--force", "--time=2", "--ignore", name, check=False, timeout=60)


def run_detached(image: str, *options: str, command: Sequence[str] = ()) -> str:
    """`podman run -d` with the hardened options; returns the container's name."""
    name = next(o.split("=", 1)[1] for o in options if o.startswith("--name="))
    podman("run", "--detach", *HARDENED, *options, image, *command)
    return name


@contextlib.contextmanager
def volume() -> Iterator[str]:
    """A new named volume (like the compose file's "models"); removed on exit."""
    name = unique_name("phi3-test-models")
    podman("volume", "create", f"--label={LABEL}={os.getpid()}", name)
    try:
        yield name
    finally:
        podman("volume", "rm", "--force", name, check=False)


@contextlib.contextmanager
def alone(
    image: str, container_port: int, *options: str, network: str = "slirp4netns"
) -> Iterator[tuple[str, str]]:
    """One container on its own, its port published; yields (name, url). Removed on exit."""
    name = unique_name("phi3-test")
    host_port = free_port()
    try:
        run_detached(
            image,
            f"--name={name}",
            f"--label={LABEL}={os.getpid()}",
            f"--network={network}",
            f"--publish=127.0.0.1:{host_port}:{container_port}",
            *options,
        )
        yield name, f"http://127.0.0.1:{host_port}"
    finally:
        podman("rm", "--force", "--time=1", "--ignore", name, check=False)


def image_env(tag: str) -> dict[str, str]:
    env = image_inspect(tag)["Config"].get("Env") or []
    return dict(str(item).split("=", 1) for item in env)


def poll(probe: Callable[[], T | None], timeout: float, interval: float = 0.5) -> T | None:
    """Call probe until it returns something other than None, or the time is up."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result is not None or time.monotonic() >= deadline:
            return result
        time.sleep(interval)


def wait_ready(url: str, timeout: float, logs: Callable[[], str]) -> dict[str, object]:
    """Poll the app's /healthz until it reports the sidecar ready; returns that JSON."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            response = httpx.get(url + "/healthz", timeout=3)
            last = response.text
            body = response.json()
            if response.status_code == 200 and body.get("sidecar", {}).get("ready") is True:
                return dict(body)
        except (httpx.HTTPError, ValueError) as exc:
            last = repr(exc)
        time.sleep(0.5)
    raise AssertionError(f"the pair was not ready after {timeout}s (last: {last})\n{logs()}")
