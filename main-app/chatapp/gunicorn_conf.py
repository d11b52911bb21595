"""Gunicorn settings for the chat app: `gunicorn -c python:chatapp.gunicorn_conf chatapp.wsgi:app`.

gevent workers: every connection is a greenlet, so a long streamed reply, and any number of idle
or slow clients (up to worker_connections each), cost a little memory and no thread. With the
threaded worker, a client that sent half a request's headers held a thread until it finished:
45 of them took the app offline. The gevent worker reads each request's headers under a
deadline of `keepalive` seconds (REQUEST_HEADERS_TIMEOUT), so a client that stalls, or sends a
byte a second, is closed after that; its body is read under REQUEST_BODY_TIMEOUT
(chatapp/guards/body_deadline.py), so a stalled or endless body is answered 408 and closed
(`python -m scripts.bench slow-clients`; docs/benchmarks/slow-clients.md). Past
worker_connections a worker stops accepting until one of its connections closes, and the soft
open-files limit is raised to the hard one at start (chatapp/guards/open_files.py). HOST, PORT,
LOG_LEVEL, WEB_CONCURRENCY, GUNICORN_CONNECTIONS and REQUEST_HEADERS_TIMEOUT are parsed by
`chatapp.settings`.
"""

import logging
import os

from chatapp import settings
from chatapp.documents.indexer import supervisor as indexer_process
from chatapp.guards import open_files
from chatapp.observability import gunicorn_metrics

# Python warnings (gevent's, say) become JSON log lines like everything else on stderr.
logging.captureWarnings(True)

bind = settings.bind_address(os.environ)
workers, worker_connections = settings.server_size(os.environ)
worker_class = "gevent"
timeout = 60  # worker heartbeat, not a limit on how long a reply may stream
graceful_timeout = 20  # on SIGTERM, let replies in flight finish for this long
# Seconds a client has to send a request's headers (and an idle kept-alive connection lives),
# and to finish sending a body nobody reads (gunicorn drains it before closing).
keepalive = settings.headers_timeout(os.environ)
# No control socket: it would be one shared path ($HOME/.gunicorn/gunicorn.ctl) for every
# gunicorn on the machine, and nothing here uses gunicornc.
control_socket_disable = True
# /metrics adds up every worker's numbers: each writes them into one folder
# (observability/gunicorn_metrics.py).
# Documents are indexed by one process the master starts beside the workers, never in a gevent
# worker (chatapp/documents/service.py); the workers inherit the setting and start no thread.
os.environ.setdefault("DOCUMENT_INDEXER", "process")


def on_starting(server: object) -> None:
    gunicorn_metrics.on_starting(server)
    start_log = logging.getLogger("chatapp.start")
    # In the master, before the workers fork: they inherit the raised open-files limit. What
    # happens past worker_connections and past the limit: chatapp/guards/open_files.py.
    open_files.log_limits(start_log, open_files.raise_soft_limit(), worker_connections)
    # One line at start: whether the app sends a key to the model service, whom it answers.
    start_log.info("access", extra={"fields": settings.access_summary(os.environ)})


def when_ready(server: object) -> None:
    # The indexer process, and a thread of this master that starts it again whenever it dies
    # (chatapp/documents/indexer/supervisor.py).
    indexer_process.start(os.environ)


def on_exit(server: object) -> None:
    indexer_process.stop()
    gunicorn_metrics.on_exit(server)


def child_exit(server: object, worker: object) -> None:
    gunicorn_metrics.child_exit(server, worker)


# No access log: the app logs one richer JSON line per chat (chatapp.observability.logs), never
# its text.
accesslog = None
errorlog = "-"
# gunicorn's own lines (start, workers, errors) as JSON on stderr too, like the app's.
_log_level = settings.log_level(os.environ).upper()
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "chatapp.observability.logs.JsonFormatter"}},
    "handlers": {
        "json": {
            "class": "logging.StreamHandler",
            "formatter": "json",
            "stream": "ext://sys.stderr",
        }
    },
    "root": {"level": _log_level, "handlers": ["json"]},
    "loggers": {
        "gunicorn.error": {"level": _log_level, "handlers": [], "propagate": True},
        # logconfig_dict turns gunicorn's access log back on; this keeps it silent.
        "gunicorn.access": {"level": "CRITICAL", "handlers": [], "propagate": False},
    },
}
