"""The WSGI entry point for gunicorn: `gunicorn -c gunicorn.conf.py chatapp.wsgi:app`."""

import logging

from chatapp import create_app

# The app's own warnings (sidecar unreachable, a reply that broke off) in gunicorn's format.
logging.basicConfig(
    level=logging.INFO,
    format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    datefmt="%Y-%m-%d %H:%M:%S %z",
)

app = create_app()
