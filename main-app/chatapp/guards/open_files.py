"""The app's open-files limit: the soft RLIMIT_NOFILE raised to the hard one when gunicorn starts
(its workers inherit it), and one line that says whether GUNICORN_CONNECTIONS fits in it.

Container runtimes often set the soft limit to 1,024 with a far higher hard one. A gevent worker
holds a descriptor for each connection it serves and, while a chat streams, a second one to the
model service: about 2 x GUNICORN_CONNECTIONS + RESERVE. What happens at each limit:

- past GUNICORN_CONNECTIONS (gunicorn's worker_connections, a gevent pool), a worker stops
  accepting: new connections wait in the kernel's listen queue, unanswered and unlogged, until
  one of its connections closes (an idle kept-alive one after REQUEST_HEADERS_TIMEOUT; a chat
  when it ends). Past the queue (gunicorn's backlog, 2,048) the kernel drops new connections;
- out of descriptors, accept() fails: gevent stops accepting for 0.01 s, doubling up to 1 s
  while it keeps failing, and writes the error to stderr each time, so at most one a second.

The sidecar has a copy of the raise (phi3-sidecar/sidecar/web/guards/listener.py); each image ships
on its own.
"""

from __future__ import annotations

import contextlib
import logging
import resource
from typing import Any

# Descriptors a worker holds besides its connections: the listening socket, logs, the metrics
# files (PROMETHEUS_MULTIPROC_DIR), gevent's own.
RESERVE = 64


def raise_soft_limit() -> tuple[int, int, int]:
    """Raise the soft open-files limit to the hard one; (soft before, soft now, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        # An unlimited hard limit Linux will not take: the soft one is kept (the line says it).
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard


def needed(worker_connections: int) -> int:
    """The descriptors one worker needs with every connection streaming a chat."""
    return 2 * worker_connections + RESERVE


def log_limits(log: logging.Logger, nofile: tuple[int, int, int], worker_connections: int) -> None:
    """One line at start; a warning when GUNICORN_CONNECTIONS does not fit in the limit."""
    before, soft, hard = nofile
    fields: dict[str, Any] = {
        "nofile_soft_at_start": before,
        "nofile_soft": soft,
        "nofile_hard": hard,
        "worker_connections": worker_connections,
        "needed": needed(worker_connections),
    }
    if soft == resource.RLIM_INFINITY or soft >= needed(worker_connections):
        log.info("open files", extra={"fields": fields})
        return
    # Raise the hard limit (ulimit -n, --ulimit nofile=) or lower GUNICORN_CONNECTIONS.
    fields["fits_connections"] = max(0, (soft - RESERVE) // 2)
    log.warning("open files: fewer than GUNICORN_CONNECTIONS needs", extra={"fields": fields})
