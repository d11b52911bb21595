"""Gunicorn settings for the chat app: `gunicorn -c python:chatapp.gunicorn_conf chatapp.wsgi:app`.

gthread workers: each request runs on a thread, so a long streamed reply holds one thread and
neither blocks other requests nor trips the worker timeout (the worker's main loop keeps
reporting in while threads stream). HOST, PORT, LOG_LEVEL, WEB_CONCURRENCY and
GUNICORN_THREADS are parsed by `chatapp.settings`, as everywhere else in the app.
"""

import os

from chatapp import metrics, settings

bind = settings.bind_address(os.environ)
workers, threads = settings.server_size(os.environ)
worker_class = "gthread"
timeout = 60  # worker heartbeat, not a limit on how long a reply may stream
graceful_timeout = 20  # on SIGTERM, let replies in flight finish for this long
keepalive = 5
# No control socket: it would be one shared path ($HOME/.gunicorn/gunicorn.ctl) for every
# gunicorn on the machine, and nothing here uses gunicornc.
control_socket_disable = True
# /metrics adds up every worker's numbers: each writes them into one folder (chatapp/metrics.py).
on_starting = metrics.gunicorn_on_starting
child_exit = metrics.gunicorn_child_exit
on_exit = metrics.gunicorn_on_exit
# No access log: the app logs one richer JSON line per chat (chatapp.logs), never its text.
accesslog = None
errorlog = "-"
# gunicorn's own lines (start, workers, errors) as JSON on stderr too, like the app's.
_log_level = settings.log_level(os.environ).upper()
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "chatapp.logs.JsonFormatter"}},
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
