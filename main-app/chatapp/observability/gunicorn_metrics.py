"""gunicorn's hooks for /metrics (chatapp/gunicorn_conf.py), run in its master process.

Every worker process counts its own chats; prometheus-client's multiprocess mode has each write
its numbers into one folder, which /metrics reads and adds up (metrics.py). The folder
is made before the first worker starts, unless PROMETHEUS_MULTIPROC_DIR names one, and removed
when gunicorn exits. Nothing here imports Flask or prometheus-client at import time: the master
loads this module with its config, before the gevent worker patches the standard library, and
prometheus-client picks its mode when it is imported.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
_MADE_HERE = "CHATAPP_METRICS_DIR_MADE"  # the folder is ours to remove


def on_starting(server: Any) -> None:
    """Before the first worker: the folder the workers write their numbers into."""
    if not os.environ.get(MULTIPROC_DIR):
        os.environ[MULTIPROC_DIR] = tempfile.mkdtemp(prefix="chatapp-metrics-")
        os.environ[_MADE_HERE] = "1"


def child_exit(server: Any, worker: Any) -> None:
    """A worker is gone: its live gauge (open streams) no longer counts."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server: Any) -> None:
    if os.environ.pop(_MADE_HERE, None):
        shutil.rmtree(os.environ[MULTIPROC_DIR], ignore_errors=True)
