"""Start the real services as separate processes, and always stop them.

One home for "how to run the sidecar and the app": the tests (real HTTP between real processes),
scripts/run/run_local.py and the benchmarks (scripts/bench/) all start them through here. Each
process gets a loopback port and a log file that is shown when something needs explaining.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
SIDECAR_DIR = REPO / "phi3-sidecar"
APP_DIR = REPO / "main-app"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Service:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_lines(self) -> list[str]:
        """The log's complete lines so far: the process may be writing the last one now."""
        text = self.log()
        return text[: text.rfind("\n") + 1].splitlines()


def request_lines(service: Service, logger: str = "sidecar.request") -> list[dict[str, Any]]:
    """The per-request log lines written so far: the sidecar's (`sidecar.request`), or the
    chat app's (`chatapp.request`)."""
    lines = []
    for line in service.log_lines():
        if line.startswith("{"):
            data = json.loads(line)
            if data.get("logger") == logger:
                lines.append(data)
    return lines


def request_line(
    service: Service, request_id: str, timeout: float = 30.0, logger: str = "sidecar.request"
) -> dict[str, Any]:
    """Wait for the log line of one request (written when the request is over)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in request_lines(service, logger):
            if line["request_id"] == request_id:
                return line
        time.sleep(0.05)
    raise TimeoutError(f"no log line for request {request_id}:\n{service.log()[-3000:]}")


def wait_for_embeddings(service: Service, timeout: float = 120.0) -> dict[str, Any]:
    """Wait until the sidecar's encoder is ready (/readyz `embeddings.served`); its /readyz
    `embeddings` object. RuntimeError when it failed to load."""
    deadline = time.monotonic() + timeout
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = httpx.get(service.url + "/readyz", timeout=5).json().get("embeddings", {})
        if state.get("served"):
            return state
        if state.get("phase") in ("failed", "off"):
            raise RuntimeError(f"no embeddings: {state}\n{service.log()[-3000:]}")
        time.sleep(0.1)
    raise TimeoutError(f"the encoder was not ready in {timeout} s: {state}")


def wait_for_speech(service: Service, timeout: float = 120.0) -> dict[str, Any]:
    """Wait until the sidecar's speech model is ready (/readyz `speech.served`); its /readyz
    `speech` object. RuntimeError when it failed to load."""
    deadline = time.monotonic() + timeout
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = httpx.get(service.url + "/readyz", timeout=5).json().get("speech", {})
        if state.get("served"):
            return state
        if state.get("phase") in ("failed", "off"):
            raise RuntimeError(f"no speech: {state}\n{service.log()[-3000:]}")
        time.sleep(0.1)
    raise TimeoutError(f"the speech model was not ready in {timeout} s: {state}")


def wait_for(url: str, process: subprocess.Popen[bytes], log_path: Path, timeout: float) -> None:
    """Poll `url` until it answers 200, failing early if the process has died or says that it
    will never be ready (the sidecar's readiness phase `failed`: its model cannot load)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode}:\n{log_path.read_text()}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = httpx.get(url, timeout=1.0)
            if response.status_code == 200:
                return
            body = response.json()
            if isinstance(body, dict) and body.get("phase") == "failed":
                raise RuntimeError(f"{url}: {body.get('reason')}\n{log_path.read_text()}")
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout}s:\n{log_path.read_text()}")


@contextlib.contextmanager
def run_service(
    cmd: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    ready_path: str,
    port: int,
    log_path: Path,
    timeout: float = 60.0,
    wait: bool = True,
    nofile: tuple[int, int] | None = None,
) -> Iterator[Service]:
    """`nofile`: the process's open-files limit (soft, hard), set before it starts."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=None if nofile is None else _open_files_limit(nofile),
        )
    url = f"http://127.0.0.1:{port}"
    try:
        if wait:
            wait_for(url + ready_path, process, log_path, timeout)
        yield Service(url=url, process=process, log_path=log_path)
    finally:
        stop(process)


def _open_files_limit(nofile: tuple[int, int]) -> Callable[[], None]:
    """For Popen's preexec_fn, which runs in the child between fork and exec. Python warns
    that code there may deadlock when the parent has threads; this is one system call on
    objects made before the fork (no import, no I/O)."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile)


def stop(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM the process group (the sidecar has a worker child), then SIGKILL if needed."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def sidecar(
    model_dir: Path | str,
    log_path: Path,
    *,
    port: int | None = None,
    wait: bool = True,
    env: Mapping[str, str] | None = None,
    cgroup: Path | None = None,
    nofile: tuple[int, int] | None = None,
    **settings: str,
) -> contextlib.AbstractContextManager[Service]:
    """`python -m sidecar` on `port` (default: a free one); waits for /readyz unless wait=False.
    Its environment: this one's, then `env`, then `settings` (MAX_CONCURRENCY="2", ...);
    `nofile`: its open-files limit (soft, hard); `cgroup`: a cgroup directory (memory_cgroup)
    the sidecar starts in, as in a container."""
    port = port or free_port()
    # Absolute: the sidecar runs in its own folder, where a relative path means something else.
    model_path = str(Path(model_dir).resolve())
    environ = {"MODEL_PATH": model_path, "HOST": "127.0.0.1", "PORT": str(port)}
    environ |= {**(env or {}), **settings}
    command = [sys.executable, "-m", "sidecar"]
    if cgroup is not None:  # in the group before anything runs: its worker is born there
        procs = cgroup / "cgroup.procs"
        command = ["sh", "-c", f'echo $$ > "{procs}" && exec "{sys.executable}" -m sidecar']
    return run_service(
        command,
        cwd=SIDECAR_DIR,
        env=environ,
        ready_path="/readyz",
        port=port,
        log_path=log_path,
        wait=wait,
        nofile=nofile,
    )


def models_file(folder: Path, tables: list[dict[str, Any]], name: str = "models.toml") -> Path:
    """A MODELS_FILE of `[[models]]` tables (docs/api.md, "Several models")."""
    lines: list[str] = []
    for table in tables:
        lines += ["[[models]]", *(f"{key} = {json.dumps(value)}" for key, value in table.items())]
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def several_models(
    folder: Path, tables: list[dict[str, Any]], **settings: str
) -> contextlib.AbstractContextManager[Service]:
    """A sidecar serving `tables` (MODELS_FILE in `folder`, its log and PROMPT_CACHE_DIR there
    too; KV and passage store small unless a table says otherwise), a roomy budget unless
    MODELS_MEMORY_BYTES is given."""
    small = {"kv_memory_mb": 64, "passage_kv_mb": 0}
    file = models_file(folder, [small | table for table in tables])
    environ = {
        "MODELS_FILE": str(file),
        "MODELS_MEMORY_BYTES": str(64 * 2**30),
        "PROMPT_CACHE_DIR": str(folder / "cache"),
    }
    return sidecar(tables[0]["path"], folder / "sidecar.log", env=environ | settings)


def chatapp(
    sidecar_url: str,
    log_path: Path,
    *,
    port: int | None = None,
    gunicorn: bool = True,
    env: Mapping[str, str] | None = None,
    nofile: tuple[int, int] | None = None,
    **settings: str,
) -> contextlib.AbstractContextManager[Service]:
    """The Flask app as production runs it (gunicorn + its gevent config), on `port` (default: a
    free one); waits for /healthz. `nofile`: its open-files limit (soft, hard)."""
    port = port or free_port()
    environ = {"SIDECAR_URL": sidecar_url, "HOST": "127.0.0.1", "PORT": str(port)}
    environ |= {**(env or {}), **settings}
    # Its database beside its log, never in the source tree (the app's default DATA_DIR is
    # relative to its working directory, main-app/).
    if "DATA_DIR" not in os.environ:  # the tests set one for the whole session
        environ.setdefault("DATA_DIR", str(log_path.parent / "chatapp-data"))
    cmd = (
        [sys.executable, "-m", "gunicorn", "-c", "python:chatapp.gunicorn_conf", "chatapp.wsgi:app"]
        if gunicorn
        else [sys.executable, "-m", "chatapp"]
    )
    return run_service(
        cmd,
        cwd=APP_DIR,
        env=environ,
        ready_path="/healthz",
        port=port,
        log_path=log_path,
        timeout=30,
        nofile=nofile,
    )


def own_memory_cgroup() -> Path | None:
    """This process's cgroup v1 memory directory where a child group can be made (root, with
    the v1 memory controller mounted writable), else None."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            directory = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if os.access(directory / "cgroup.procs", os.W_OK):
                return directory
    return None


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[Path]:
    """A fresh cgroup with a memory limit (what `podman run --memory` gives a container), for
    sidecar(cgroup=...); removed at the end, once its processes are gone. RuntimeError where
    none can be made."""
    parent = own_memory_cgroup()
    if parent is None:
        raise RuntimeError("no writable cgroup v1 memory controller (run as root)")
    group = parent / f"phi3-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
        yield group
    finally:
        for _ in range(100):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
