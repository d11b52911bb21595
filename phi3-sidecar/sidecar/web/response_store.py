"""The Responses API's stored responses (`store`, `previous_response_id`, GET and DELETE
/v1/responses/{id}): a bounded store in the web process's memory.

Each stored response keeps the object that was returned and the conversation it ended
(Chat Completions messages, without `instructions`, ending with the reply), which a later
request with `previous_response_id` continues: its prompt then starts with the tokens the
conversation cache already holds for that conversation, so the new turn reads only its own.

Who may read one: a stored response belongs to the API key it was made with (none while
API_KEY is unset) and, for continuing it, to its conversation cache scope (`prompt_cache_key`,
else `user`; ipc.Generate.cache_scope) as well, the scope whose cached tokens the continuation
reads. An id that is missing, evicted, deleted or another owner's is the same 404: whether an
id exists elsewhere is not told. Ids are 192 random bits.

Bounded by RESPONSE_STORE_MB: the JSON size of what each keeps; the least recently used go
first, and one larger than the whole budget is not kept (0: nothing is stored). A restart
empties it.
"""

from __future__ import annotations

import json
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


def new_id() -> str:
    return f"resp_{secrets.token_hex(24)}"


@dataclass
class Stored:
    id: str
    owner: str  # the API key's fingerprint (access.py); "" while API_KEY is unset
    scope: str | None  # the conversation cache scope it was made in
    response: dict[str, Any]  # the response object as returned
    conversation: list[dict[str, Any]]  # Chat Completions messages, the reply last

    @property
    def size(self) -> int:
        return len(json.dumps([self.response, self.conversation], ensure_ascii=False))


class ResponseStore:
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[str, tuple[Stored, int]] = OrderedDict()
        self._bytes = 0

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def put(self, stored: Stored) -> bool:
        """Keep it, evicting the least recently used to make room; False if it cannot fit."""
        size = stored.size
        if size > self.budget_bytes:
            return False
        self.delete(stored.id, stored.owner)
        while self._bytes + size > self.budget_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._bytes -= evicted
        self._entries[stored.id] = (stored, size)
        self._bytes += size
        return True

    def get(self, response_id: str, owner: str) -> Stored | None:
        found = self._entries.get(response_id)
        if found is None or not secrets.compare_digest(found[0].owner, owner):
            return None
        self._entries.move_to_end(response_id)
        return found[0]

    def continuing(self, response_id: str, owner: str, scope: str | None) -> Stored | None:
        """The response a request of `owner` in `scope` may continue; None: not here for it."""
        stored = self.get(response_id, owner)
        return stored if stored is not None and stored.scope == scope else None

    def delete(self, response_id: str, owner: str) -> bool:
        if self.get(response_id, owner) is None:
            return False
        _, size = self._entries.pop(response_id)
        self._bytes -= size
        return True

    @property
    def stats(self) -> tuple[int, int]:
        """Responses kept, and their bytes."""
        return len(self._entries), self._bytes
