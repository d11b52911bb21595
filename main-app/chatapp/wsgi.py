"""The WSGI entry point for gunicorn.

gunicorn -c python:chatapp.gunicorn_conf chatapp.wsgi:app
"""

from chatapp import create_app
from chatapp.observability.logs import configure_logging

app = create_app()
# JSON lines: the app's warnings and its one line per chat (gunicorn's own, see its config).
configure_logging(app.config["LOG_LEVEL"])
