"""`python -m chatapp`: Flask's development server (threaded), on HOST:PORT.

Production uses gunicorn with `chatapp.gunicorn_conf` instead.
"""

from __future__ import annotations

import os

from chatapp import create_app
from chatapp.observability.logs import configure_logging
from chatapp.settings import listen_address


def main() -> None:
    host, port = listen_address(os.environ)
    app = create_app()
    configure_logging(app.config["LOG_LEVEL"])
    app.run(host=host, port=port, threaded=True)


if __name__ == "__main__":
    main()
