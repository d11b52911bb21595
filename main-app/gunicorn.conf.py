"""Gunicorn settings for the chat app: `gunicorn -c gunicorn.conf.py chatapp.wsgi:app`.

gthread workers: each request runs on a thread, so a long streamed reply holds one thread and
neither blocks other requests nor trips the worker timeout (the worker's main loop keeps
reporting in while threads stream). HOST and PORT match `chatapp.settings.listen_address`.
"""

import os

_host = os.environ.get("HOST", "").strip() or "0.0.0.0"
_port = os.environ.get("PORT", "").strip() or "8080"
bind = f"[{_host}]:{_port}" if ":" in _host else f"{_host}:{_port}"

worker_class = "gthread"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("GUNICORN_THREADS", "16"))
timeout = 60  # worker heartbeat, not a limit on how long a reply may stream
graceful_timeout = 20  # on SIGTERM, let replies in flight finish for this long
keepalive = 5
# No control socket: it would be one shared path ($HOME/.gunicorn/gunicorn.ctl) for every
# gunicorn on the machine, and nothing here uses gunicornc.
control_socket_disable = True
# No access log: the app logs one richer JSON line per chat (chatapp.logs), never its text.
accesslog = None
errorlog = "-"
# gunicorn's own lines (start, workers, errors) as JSON on stderr too, like the app's.
_log_level = (os.environ.get("LOG_LEVEL", "").strip() or "info").upper()
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
