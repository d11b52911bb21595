"""`python -m chatapp.documents`: the indexer process (chatapp/documents/indexer.py), with the
app's settings from the same environment, until SIGTERM or SIGINT. `chatapp.gunicorn_conf`
starts it beside the web workers."""

from __future__ import annotations

import logging
import os
import signal
import threading

log = logging.getLogger("chatapp.documents.indexer")


def main() -> None:
    """`python -m chatapp.documents`: the indexer process, with the app's settings
    (the same environment), until SIGTERM or SIGINT."""
    from chatapp import settings
    from chatapp.documents.service import make_indexer
    from chatapp.logs import configure_logging
    from chatapp.store import Store, migrate
    from chatapp.store.database import default_url

    config = {**settings.DEFAULTS, **settings.from_environ(os.environ)}
    configure_logging(config["LOG_LEVEL"])
    store = Store.open(config["DATABASE_URL"] or default_url(config["DATA_DIR"]))
    migrate.upgrade(store.engine)
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    count = config["DOCUMENT_INDEXER_THREADS"]
    log.info("indexer started", extra={"fields": {"pid": os.getpid(), "threads": count}})
    # Several documents at once, each thread an indexer of its own (its own connection to the
    # model service): their claims never take the same document (indexer.py `claim`).
    threads = [
        threading.Thread(target=make_indexer(store, config).run, args=(stop,), name=f"indexer-{n}")
        for n in range(count)
    ]
    for thread in threads:
        thread.start()
    while not stop.wait(1.0):  # a timed wait: the signal handlers run on this thread
        pass
    for thread in threads:
        thread.join()
    store.close()


if __name__ == "__main__":
    main()
