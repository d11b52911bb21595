"""`python -m sidecar`: one uvicorn process serving create_app(Settings())."""

from __future__ import annotations

import contextlib
import logging
import sys

import uvicorn
from pydantic import ValidationError
from pydantic_settings import SettingsError
from uvicorn.config import STARTUP_FAILURE

from sidecar.jsonlog import configure_logging
from sidecar.settings import Settings
from sidecar.web.app import create_app
from sidecar.web.guards import connections, deadlines, listener
from sidecar.web.models.registry import RegistryError
from sidecar.web.observability.request_log import DropDeliberateAbort

log = logging.getLogger("sidecar")

# Streams still running when the server is told to stop get this long, then are cancelled.
GRACEFUL_SHUTDOWN_S = 5


def main() -> None:
    try:
        settings = Settings()
    except ValidationError as exc:
        configure_logging("info")
        for error in exc.errors(include_url=False):
            where = ".".join(str(p) for p in error["loc"]).upper()
            log.error(
                "invalid setting", extra={"fields": {"setting": where, "error": error["msg"]}}
            )
        sys.exit(2)
    except SettingsError as exc:  # a value that is not JSON where JSON is wanted
        configure_logging("info")
        reason = str(exc.__cause__ or exc).strip().splitlines() or [type(exc).__name__]
        log.error("invalid setting", extra={"fields": {"error": f"{exc}: {reason[0]}"}})
        sys.exit(2)
    configure_logging(
        settings.log_level, DropDeliberateAbort(), exception_messages=settings.log_prompts
    )
    nofile = listener.raise_nofile()  # before the cap is computed and the worker inherits it
    try:
        app = create_app(settings)
    except RegistryError as exc:  # MODELS_FILE: one sentence, no traceback
        log.error(
            "invalid setting", extra={"fields": {"setting": "MODELS_FILE", "error": str(exc)}}
        )
        sys.exit(2)
    cap = app.state.connections
    listener.log_limits(nofile, settings, cap)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        workers=1,
        log_config=None,
        access_log=False,
        server_header=False,
        # Headers and bodies under deadlines, connections under the cap.
        http=connections.protocol(deadlines.protocol(settings), cap),
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = uvicorn.Server(config)
    # Our own listening socket: one accept attempt a second, not thousands, when out of files.
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run
        server.run(sockets=[listener.Listener.from_config(config)])
    if not server.started:  # the lifespan failed: as uvicorn.run exits
        sys.exit(STARTUP_FAILURE)


if __name__ == "__main__":
    main()
