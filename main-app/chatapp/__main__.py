"""`python -m chatapp`: Flask's development server (threaded), on HOST:PORT.

Production uses gunicorn with `gunicorn.conf.py` instead.
"""

from __future__ import annotations

import logging
import os

from chatapp import create_app
from chatapp.settings import listen_address


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    host, port = listen_address(os.environ)
    create_app().run(host=host, port=port, threaded=True)


if __name__ == "__main__":
    main()
