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
accesslog = "-"
errorlog = "-"
# Log lines without query strings or bodies: never the conversation.
access_log_format = '%(h)s "%(m)s %(U)s %(H)s" %(s)s %(B)s %(M)sms'
