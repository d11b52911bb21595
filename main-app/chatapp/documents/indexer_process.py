"""The indexer process under gunicorn: started by the master when it is ready, stopped when
it exits, and started again when a worker exits if it has died meanwhile.

Only the standard library here: gunicorn's master imports it before its workers patch anything.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Mapping

log = logging.getLogger("chatapp.start")
_process: subprocess.Popen[bytes] | None = None


def start(environ: Mapping[str, str]) -> None:
    """Start `python -m chatapp.documents` when DOCUMENT_INDEXER is `process` (and it is not
    running)."""
    global _process
    if environ.get("DOCUMENT_INDEXER", "").strip().lower() != "process":
        return
    if _process is not None and _process.poll() is None:
        return
    _process = subprocess.Popen([sys.executable, "-m", "chatapp.documents"], env=dict(environ))
    log.info("indexer", extra={"fields": {"pid": _process.pid}})


def stop(timeout: float = 20.0) -> None:
    global _process
    if _process is None:
        return
    _process.terminate()
    try:
        _process.wait(timeout)
    except subprocess.TimeoutExpired:
        _process.kill()
        _process.wait()
    _process = None
