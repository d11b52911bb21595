"""PASSAGE_WARM: the library's passages sent to our sidecar's passage store ahead of questions.

The sidecar keeps the K/V of a grounded prompt's first tokens up to a passage (its passage
store, `POST /v1/passages/warm`), and a later prompt that holds the same tokens from its first
up to that passage finds them read. A first question's prompt is the page's (no system
message unless the person set one) with the block of `grounding.block_of` before the question,
so what stands before its best passage, [1], depends on that passage alone: each passage here
is sent as such a prompt, cut before the question. A question whose best passage was warmed
then waits for the rest of its passages and itself only. (A chat's later turns, or a system
prompt of one's own, start otherwise: they are read as without warming, and the store keeps
them for the next time, as it does for any grounded prompt.)

The indexer sends each document once it is ready, and a sweep of the newest
`PASSAGE_WARM_PASSAGES` passages, newest documents first, at its start and every
`SWEEP_EVERY_S` (a sidecar that restarted without its disk part is warmed again; what it holds
already it answers "stored already"). The sidecar reads the latest noted first, so each batch is
sent in reverse: the newest document's first passage is read first. Nothing is sent with
`UPSTREAM_API=openai`: another server has no passage store.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import requests
from sqlalchemy import select

from chatapp.documents.models import Chunk, Document
from chatapp.documents.search.grounding import block_of, with_block
from chatapp.documents.search.retrieval import Passage
from chatapp.store import Store

log = logging.getLogger("chatapp.documents.warming")

WARM_PATH = "/v1/passages/warm"
ITEMS_PER_REQUEST = 64  # the sidecar's bound (web/passages/api.py)
SWEEP_EVERY_S = 600.0
RETRY_S = 30.0  # a sweep the sidecar could not take (loading, restarting) is tried again


def library_scope(owner_id: int) -> str:
    """The passage store an owner's grounded turns use (relay/chat.py sends the same)."""
    return f"library-{owner_id}"


def warm_item(passage: Passage) -> dict[str, Any]:
    """A first grounded question's prompt with `passage` as its best one, cut before the
    question: the tokens up to the passage's end are those of every such question."""
    content = with_block("", block_of([passage]))
    return {"messages": [{"role": "user", "content": content}], "passages": [passage.text]}


def newest_passages(
    store: Store, limit: int, document_id: int | None = None
) -> list[tuple[int, Passage]]:
    """(owner, passage) of ready documents, newest documents first, each in its order."""
    query = (
        select(Chunk, Document.name)
        .join(Document, Document.id == Chunk.document_id)
        .where(Document.status == "ready")
        .order_by(Document.created_at.desc(), Document.id.desc(), Chunk.ordinal)
        .limit(limit)
    )
    if document_id is not None:
        query = query.where(Document.id == document_id)
    with store.session() as session:
        return [
            (chunk.owner_id, Passage.of(chunk, name))
            for chunk, name in session.execute(query).all()
        ]


class Warmer:
    """Sends passages to warm the sidecar's passage store, from a thread of its own."""

    def __init__(self, store: Store, config: Mapping[str, Any]) -> None:
        self.store = store
        self.limit = int(config["PASSAGE_WARM_PASSAGES"])
        base = str(config["SIDECAR_URL"]).rstrip("/").removesuffix("/v1")
        self.url = base + WARM_PATH
        self.headers = {"Content-Type": "application/json"}
        if config.get("UPSTREAM_API_KEY"):
            self.headers["Authorization"] = f"Bearer {config['UPSTREAM_API_KEY']}"
        self.timeout = float(config["SIDECAR_READ_TIMEOUT"])
        self._documents: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    @classmethod
    def of(cls, store: Store, config: Mapping[str, Any]) -> Warmer | None:
        """The app's warmer; None when PASSAGE_WARM is off (or cannot work: said once)."""
        if not config.get("PASSAGE_WARM"):
            return None
        if config["UPSTREAM_API"] != "predict":
            log.warning(
                "passage warming off",
                extra={"fields": {"reason": "UPSTREAM_API=openai: no passage store to warm"}},
            )
            return None
        return cls(store, config)

    def start(self, stop: threading.Event) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.run, args=(stop,), name="passage-warmer", daemon=True
            )
            self._thread.start()

    def document_ready(self, document_id: int) -> None:
        self._documents.put(document_id)

    def run(self, stop: threading.Event) -> None:
        """A sweep now and every SWEEP_EVERY_S (RETRY_S after one that failed); each
        document as it becomes ready."""
        next_sweep = 0.0
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_sweep:
                done = self.send(newest_passages(self.store, self.limit), "library")
                next_sweep = now + (SWEEP_EVERY_S if done else RETRY_S)
            try:
                document_id = self._documents.get(timeout=min(1.0, max(0.0, next_sweep - now)))
            except queue.Empty:
                continue
            if not stop.is_set():
                self.send(newest_passages(self.store, self.limit, document_id), "document")

    def send(self, passages: Sequence[tuple[int, Passage]], what: str) -> bool:
        """Send passages (in the order they should be read), per owner; False if the sidecar
        took none of it (not ready, unreachable, refused)."""
        by_owner: dict[int, list[Passage]] = defaultdict(list)
        for owner, passage in passages:
            by_owner[owner].append(passage)
        noted = stored = other = 0
        for owner, owned in by_owner.items():
            items = [warm_item(p) for p in reversed(owned)]  # the last sent is read first
            for start in range(0, len(items), ITEMS_PER_REQUEST):
                body = {
                    "items": items[start : start + ITEMS_PER_REQUEST],
                    "passage_scope": library_scope(owner),
                }
                answers = self._post(body)
                if answers is None:
                    return False
                for answer in answers:
                    if answer.get("tokens"):
                        noted += 1
                    elif answer.get("reason") == "stored already":
                        stored += 1
                    else:
                        other += 1
        if passages:
            fields = {"what": what, "noted": noted, "stored_already": stored, "not_noted": other}
            log.info("passages sent to warm", extra={"fields": fields})
        return True

    def _post(self, body: dict[str, Any]) -> list[dict[str, Any]] | None:
        try:
            response = requests.post(
                self.url, json=body, headers=self.headers, timeout=(5.0, self.timeout)
            )
        except requests.RequestException as exc:
            log.info("passage warming waits", extra={"fields": {"reason": type(exc).__name__}})
            return None
        if response.status_code != 200:
            fields = {"status": response.status_code}
            log.info("passage warming waits", extra={"fields": fields})
            return None
        items = response.json().get("items")
        return items if isinstance(items, list) else None
