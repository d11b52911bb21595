"""Start the real services as separate processes, and always stop them.

One home for "how to run the sidecar and the app": the tests (real HTTP between real processes),
scripts/run_local.py and scripts/bench.py all start them through here. Each process gets a
loopback port and a log file that is shown when something needs explaining.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
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


def wait_for(url: str, process: subprocess.Popen[bytes], log_path: Path, timeout: float) -> None:
    """Poll `url` until it answers 200, failing early if the process has died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode}:\n{log_path.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
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
) -> Iterator[Service]:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            cmd, cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        if wait:
            wait_for(url + ready_path, process, log_path, timeout)
        yield Service(url=url, process=process, log_path=log_path)
    finally:
        stop(process)


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
    **settings: str,
) -> contextlib.AbstractContextManager[Service]:
    """`python -m sidecar` on `port` (default: a free one); waits for /readyz unless wait=False."""
    port = port or free_port()
    env = {"MODEL_PATH": str(model_dir), "HOST": "127.0.0.1", "PORT": str(port), **settings}
    return run_service(
        [sys.executable, "-m", "sidecar"],
        cwd=SIDECAR_DIR,
        env=env,
        ready_path="/readyz",
        port=port,
        log_path=log_path,
        wait=wait,
    )


def chatapp(
    sidecar_url: str,
    log_path: Path,
    *,
    port: int | None = None,
    gunicorn: bool = True,
    **settings: str,
) -> contextlib.AbstractContextManager[Service]:
    """The Flask app as production runs it (gunicorn + gthread config), on `port` (default: a
    free one); waits for /healthz."""
    port = port or free_port()
    env = {"SIDECAR_URL": sidecar_url, "HOST": "127.0.0.1", "PORT": str(port), **settings}
    cmd = (
        [sys.executable, "-m", "gunicorn", "-c", "python:chatapp.gunicorn_conf", "chatapp.wsgi:app"]
        if gunicorn
        else [sys.executable, "-m", "chatapp"]
    )
    return run_service(
        cmd, cwd=APP_DIR, env=env, ready_path="/healthz", port=port, log_path=log_path, timeout=30
    )
