"""The indexer process under gunicorn: started by the master when it is ready, watched by a
thread of the master and started again within seconds whenever it dies, stopped when the
master exits.

Whatever ends it (an exception, SIGKILL from the OOM killer or a person), the watcher sees it
at once (it waits on the process itself, `waitid`, without reaping it), logs `indexer exited`
with how it ended, counts it in `chatapp_indexer_restarts_total{cause}` (`killed`: a signal;
`exited`: an exit code), and
starts the next one: at once if the last one ran for a while, else after a back-off that
doubles up to `MAX_BACKOFF_S` (a database that is down is not hammered). Every process it
starts carries the same instance name (`CHATAPP_INDEXER_INSTANCE`, new for each master), so
the next one takes over the documents the dead one was reading (claims.take_over) instead of
waiting for their leases to lapse.

How it ended: gunicorn's master reaps every child it did not start (`waitpid(-1)` on
SIGCHLD), and may do so before the watcher reads the status. So the process also says its
own exit code down a pipe when it ends by itself (`__main__.report_exit`): a process that
said nothing was killed by a signal (its name given where the watcher read it first).

Only the standard library at import: gunicorn's master imports this module before its
workers patch anything; prometheus-client is imported when the first restart is counted (the
master has set PROMETHEUS_MULTIPROC_DIR by then: gunicorn_metrics.on_starting).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("chatapp.start")

INSTANCE = "CHATAPP_INDEXER_INSTANCE"  # the name __main__.py gives its claims
STATUS_FD = "CHATAPP_INDEXER_STATUS_FD"  # where __main__.report_exit says its exit code
MAX_BACKOFF_S = 8.0
STEADY_S = 30.0  # a process that ran this long is started again at once


class Supervisor:
    """One indexer process, started again whenever it dies, until `stop`."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = {**environ, INSTANCE: uuid.uuid4().hex[:12]}
        self.process: subprocess.Popen[bytes] | None = None
        self._said = -1  # the read end of the process's exit-code pipe
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._restarts: Any = None
        self._thread = threading.Thread(target=self._watch, name="indexer-watch", daemon=True)

    def start(self) -> None:
        self._start_process()
        self._thread.start()

    def _start_process(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            command = [sys.executable, "-m", "chatapp.documents"]
            self._said, said = os.pipe()
            try:
                self.process = subprocess.Popen(
                    command, env={**self.environ, STATUS_FD: str(said)}, pass_fds=(said,)
                )
            finally:
                os.close(said)
            log.info("indexer", extra={"fields": {"pid": self.process.pid}})

    def _watch(self) -> None:
        backoff = 0.0
        while not self._stopping.is_set():
            process = self.process
            if process is None:
                return
            began = time.monotonic()
            status = _wait(process.pid)
            process.poll()  # reaped here unless gunicorn's master reaped it first
            said = _read_all(self._said)
            if self._stopping.is_set():
                return
            ran = time.monotonic() - began
            backoff = 0.0 if ran >= STEADY_S else min(max(2 * backoff, 1.0), MAX_BACKOFF_S)
            cause, fields = _ended(status, said)
            fields |= {"pid": process.pid, "ran_s": round(ran, 1), "restart_in_s": backoff}
            log.warning("indexer exited", extra={"fields": fields | {"cause": cause}})
            self._count(cause)
            if self._stopping.wait(backoff):
                return
            self._start_process()

    def _count(self, cause: str) -> None:
        try:
            if self._restarts is None:
                from prometheus_client import Counter

                self._restarts = Counter(
                    "chatapp_indexer_restarts",
                    "Indexer processes started again after one died, by how it ended.",
                    ["cause"],
                    registry=None,  # multiprocess mode: the value lives in the shared folder
                )
            self._restarts.labels(cause).inc()
        except Exception:  # a metric is never worth the restart
            log.warning("indexer restart not counted", exc_info=True)

    def stop(self, timeout: float = 20.0) -> None:
        with self._lock:
            self._stopping.set()
            process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._thread.is_alive():
            self._thread.join(timeout)


def _wait(pid: int) -> os.waitid_result | None:
    """Block until the process has ended, leaving it to be reaped (WNOWAIT); its status, or
    None when someone else reaped it first."""
    while True:
        try:
            return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            return None
        except InterruptedError:
            continue


def _read_all(fd: int) -> bytes:
    """What the ended process wrote down its pipe, without waiting (a worker forked while the
    pipe was made may hold a copy of its writing end), then closed."""
    chunks = []
    os.set_blocking(fd, False)
    try:
        while chunk := os.read(fd, 64):
            chunks.append(chunk)
    except OSError:  # nothing more (BlockingIOError)
        pass
    finally:
        os.close(fd)
    return b"".join(chunks)


def _ended(status: os.waitid_result | None, said: bytes) -> tuple[str, dict[str, Any]]:
    """How the process ended: `killed` (by a signal, named where known) or `exited` (with its
    code)."""
    if status is not None and status.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return "killed", {"signal": signal.Signals(status.si_status).name}
    if status is not None:
        return "exited", {"exit_code": status.si_status}
    if said.strip().lstrip(b"-").isdigit():  # reaped by gunicorn first; it said its code
        return "exited", {"exit_code": int(said)}
    return "killed", {"signal": "unknown"}


_supervisor: Supervisor | None = None


def start(environ: Mapping[str, str]) -> None:
    """Start `python -m chatapp.documents`, and the thread that keeps it running, when
    DOCUMENT_INDEXER is `process` (and they are not running)."""
    global _supervisor
    if environ.get("DOCUMENT_INDEXER", "").strip().lower() != "process":
        return
    if _supervisor is not None:
        return
    _supervisor = Supervisor(environ)
    _supervisor.start()


def stop(timeout: float = 20.0) -> None:
    global _supervisor
    if _supervisor is not None:
        _supervisor.stop(timeout)
    _supervisor = None
