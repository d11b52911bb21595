"""`python -m sidecar`: one uvicorn process serving create_app(Settings())."""

from __future__ import annotations

import logging
import sys

import uvicorn
from pydantic import ValidationError
from pydantic_settings import SettingsError

from sidecar.jsonlog import configure_logging
from sidecar.settings import Settings
from sidecar.web import deadlines
from sidecar.web.app import create_app
from sidecar.web.request_log import DropDeliberateAbort

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
    configure_logging(settings.log_level, DropDeliberateAbort())
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        workers=1,
        log_config=None,
        access_log=False,
        server_header=False,
        http=deadlines.protocol(settings),  # headers and bodies under deadlines
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )


if __name__ == "__main__":
    main()
