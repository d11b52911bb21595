"""`python -m chatapp.documents`: the indexer process (indexer/worker.py), with the
app's settings from the same environment, until SIGTERM or SIGINT. `chatapp.gunicorn_conf`
starts it beside the web workers (indexer/supervisor.py, which starts it again when it dies,
under the same INSTANCE name: this process takes over the documents its predecessor was
reading, claims.take_over).

`python -m chatapp.documents reembed`: the operator's command after changing the encoder
(reembed.py): the library's vectors forgotten and every document queued to be indexed again
by the indexer, which need not be stopped. It prints what it did and exits."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chatapp.store import Store

log = logging.getLogger("chatapp.documents.indexer")
# The name this process's claims carry, set by indexer/supervisor.py: the same for every process it
# starts, so the next one takes over the documents of the one that died.
INSTANCE = "CHATAPP_INDEXER_INSTANCE"
STATUS_FD = "CHATAPP_INDEXER_STATUS_FD"  # where it says its exit code (report_exit)


USAGE = "usage: python -m chatapp.documents [reembed]"


def main() -> None:
    """`python -m chatapp.documents`: the indexer process, with the app's settings
    (the same environment), until SIGTERM or SIGINT."""
    from chatapp.documents.encoder_check import EncoderCheck
    from chatapp.documents.indexer import claims
    from chatapp.documents.service import embedder_for, make_indexer
    from chatapp.documents.warming import Warmer

    config = _config()
    store = _store(config)
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    count = config["DOCUMENT_INDEXER_THREADS"]
    instance = os.environ.get(INSTANCE, "").strip() or None
    taken = claims.take_over(store, instance) if instance else 0
    fields = {"pid": os.getpid(), "threads": count, "taken_over": taken}
    log.info("indexer started", extra={"fields": fields})
    # Several documents at once, each thread an indexer of its own (its own connection to the
    # model service, its own reader process): their claims never take the same document
    # (indexer/claims.py). With two or more, the last is the quick lane (indexer/worker.py).
    warmer = Warmer.of(store, config)  # PASSAGE_WARM: one for the process's indexers
    encoder = EncoderCheck(embedder_for(config))  # one probe a minute for them all
    indexers = [
        make_indexer(
            store,
            config,
            quick=count > 1 and n == count - 1,
            instance=instance,
            warmer=warmer,
            encoder=encoder,
        )
        for n in range(count)
    ]
    threads = [
        threading.Thread(target=indexer.run, args=(stop,), name=f"indexer-{n}")
        for n, indexer in enumerate(indexers)
    ]
    for thread in threads:
        thread.start()
    while not stop.wait(1.0):  # a timed wait: the signal handlers run on this thread
        pass
    for thread in threads:
        thread.join()
    store.close()


def reembed_main() -> None:
    """`python -m chatapp.documents reembed` (reembed.py), with the app's settings."""
    from chatapp.documents.reembed import reembed

    store = _store(_config())
    try:
        done = reembed(store)
    finally:
        store.close()
    log.info("reembed", extra={"fields": {"queued": done.queued, "passages": done.passages}})
    sys.stdout.write(done.summary() + "\n")


def _config() -> Mapping[str, Any]:
    from chatapp import settings
    from chatapp.observability.logs import configure_logging

    config = {**settings.DEFAULTS, **settings.from_environ(os.environ)}
    configure_logging(config["LOG_LEVEL"])
    return config


def _store(config: Mapping[str, Any]) -> Store:
    """The app's database, migrated."""
    from chatapp.store import Store, migrate
    from chatapp.store.database import default_url

    store = Store.open(config["DATABASE_URL"] or default_url(config["DATA_DIR"]))
    migrate.upgrade(store.engine)
    return store


def report_exit(code: object) -> None:
    """Tell the supervisor (indexer/supervisor.py) this process ends by itself, with `code`: an
    end it is not told of was a signal's, whoever reaped the process."""
    fd = os.environ.get(STATUS_FD, "")
    if fd.isdigit():
        with contextlib.suppress(OSError):
            os.write(int(fd), str(code if isinstance(code, int) else 1).encode())


if __name__ == "__main__":
    if sys.argv[1:] == ["reembed"]:
        reembed_main()
        sys.exit(0)
    if sys.argv[1:]:  # the supervisor starts the indexer with no arguments
        sys.exit(USAGE)
    try:
        main()
    except SystemExit as exit:
        report_exit(exit.code or 0)
        raise
    except BaseException:
        report_exit(1)
        raise
    report_exit(0)
