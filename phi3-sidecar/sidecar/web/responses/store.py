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

Bounded by RESPONSE_STORE_MB, counted as the memory each entry really takes: an entry is kept
as one UTF-8 JSON bytes object (read back into objects when it is used), so its count is that
object's size plus its id, scope and bookkeeping (`Kept.nbytes`). Kept as Python dicts and
counted by their JSON length, as before, the store took 6.4 to 7.8 times its count.

Fair between API keys: each of the N keys (1 while API_KEY is unset) is guaranteed
RESPONSE_STORE_MB / N (its fair share). A key may hold more while there is room; when the
store is full, what goes is the least recently used entry of the key furthest over its share
(the key storing counts its new entry), so one key's flood evicts only its own entries, never
another key's held within its share. An entry larger than its key's share is kept only while
it fits beside the others. A restart empties it.
"""

from __future__ import annotations

import json
import secrets
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

# What one kept entry costs besides its bytes and strings: the Kept object (slots), its place
# in two dicts: 97 to 119 bytes measured with tracemalloc at 500 to 5,000 entries
# (tests/sidecar/web/responses/test_sidecar_response_store.py checks the whole count).
ENTRY_OVERHEAD = 120


def new_id() -> str:
    return f"resp_{secrets.token_hex(24)}"


@dataclass
class Stored:
    """A response as the API hands it to the store and gets it back."""

    id: str
    owner: str  # the API key's fingerprint (guards/access.py); "" while API_KEY is unset
    scope: str | None  # the conversation cache scope it was made in
    response: dict[str, Any]  # the response object as returned
    conversation: list[dict[str, Any]]  # Chat Completions messages, the reply last


@dataclass(slots=True)
class Kept:
    """A response as the store holds it: its JSON, encoded once."""

    id: str
    owner: str
    scope: str | None
    blob: bytes  # json of [response, conversation]

    @classmethod
    def of(cls, stored: Stored) -> Kept:
        body = [stored.response, stored.conversation]
        blob = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        # The owner's string is interned: one per key, shared by its entries (not counted).
        return cls(stored.id, sys.intern(stored.owner), stored.scope, blob)

    @property
    def nbytes(self) -> int:
        """The memory this entry holds (the owner's string is shared by all its entries)."""
        scope = sys.getsizeof(self.scope) if self.scope is not None else 0
        return sys.getsizeof(self.blob) + sys.getsizeof(self.id) + scope + ENTRY_OVERHEAD

    def stored(self) -> Stored:
        response, conversation = json.loads(self.blob)
        return Stored(self.id, self.owner, self.scope, response, conversation)


class ResponseStore:
    def __init__(self, budget_bytes: int, keys: int = 1) -> None:
        self.budget_bytes = budget_bytes
        self.share_bytes = budget_bytes // max(1, keys)  # each key's fair share
        self._owners: dict[str, OrderedDict[str, Kept]] = {}  # least recently used first
        self._owner_bytes: dict[str, int] = {}
        self._owner_of: dict[str, str] = {}  # id -> owner
        self._bytes = 0
        self.evictions = 0  # entries dropped to make room
        self.refused = 0  # responses not kept: larger than the room they could have

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def put(self, stored: Stored) -> bool:
        """Keep it, making room as the module says; False if it cannot be kept."""
        kept = Kept.of(stored)
        size, owner = kept.nbytes, kept.owner
        self.delete(kept.id, owner)
        if size > self._room_for(owner):  # decided before anything is evicted for it
            self.refused += 1
            return False
        while self._bytes + size > self.budget_bytes:
            victim = self._owners[self._furthest_over(owner, size)]
            self._drop(next(iter(victim.values())))
            self.evictions += 1
        self._owners.setdefault(owner, OrderedDict())[kept.id] = kept
        self._owner_bytes[owner] = self._owner_bytes.get(owner, 0) + size
        self._owner_of[kept.id] = owner
        self._bytes += size
        return True

    def get(self, response_id: str, owner: str) -> Stored | None:
        kept = self._find(response_id, owner)
        return kept.stored() if kept is not None else None

    def continuing(self, response_id: str, owner: str, scope: str | None) -> Stored | None:
        """The response a request of `owner` in `scope` may continue; None: not here for it."""
        kept = self._find(response_id, owner)
        return kept.stored() if kept is not None and kept.scope == scope else None

    def delete(self, response_id: str, owner: str) -> bool:
        kept = self._find(response_id, owner)
        if kept is None:
            return False
        self._drop(kept)
        return True

    @property
    def stats(self) -> tuple[int, int]:
        """Responses kept, and their bytes."""
        return len(self._owner_of), self._bytes

    def owner_bytes(self, owner: str) -> int:
        return self._owner_bytes.get(owner, 0)

    def _find(self, response_id: str, owner: str) -> Kept | None:
        found = self._owner_of.get(response_id)
        if found is None or not secrets.compare_digest(found, owner):
            return None
        entries = self._owners[found]
        entries.move_to_end(response_id)
        return entries[response_id]

    def _room_for(self, owner: str) -> int:
        """The most `owner` can hold: the budget less what the others hold within their
        shares (what no eviction for it may take)."""
        held = sum(min(b, self.share_bytes) for b in self._owner_bytes.values())
        return self.budget_bytes - held + min(self.owner_bytes(owner), self.share_bytes)

    def _furthest_over(self, owner: str, incoming: int) -> str:
        """Of the owners holding entries, the one whose bytes (the new entry counted for
        `owner`) exceed its share most. After `_room_for`, one over its share holds some."""
        held = dict(self._owner_bytes)
        if owner in held:
            held[owner] += incoming
        return max(held, key=lambda o: held[o] - self.share_bytes)

    def _drop(self, kept: Kept) -> None:
        entries = self._owners[kept.owner]
        del entries[kept.id]
        if not entries:
            del self._owners[kept.owner]
        del self._owner_of[kept.id]
        self._owner_bytes[kept.owner] -= kept.nbytes
        if not self._owner_bytes[kept.owner]:
            del self._owner_bytes[kept.owner]
        self._bytes -= kept.nbytes
