"""The passage store on the batched path (kv/passages.py says what it keeps and why): a grounded
prompt's placements, planned when its reply starts and written as its prompt is read
(row.BatchGeneration.prefill_chunk), and the idle reading of the passages it wanted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sidecar.model.batch.decoder import BatchDecoder
from sidecar.model.kv import compact as kv_compact
from sidecar.model.kv.compact import CompactKv
from sidecar.model.kv.passages import PassageKey, PassageStore, StoredPassage, Wanted, digest
from sidecar.model.prompt.builder import Prompt


@dataclass(frozen=True)
class Placement:
    """Positions at..end-1 of a prompt, filled from a stored passage whose first token stands
    at `start` (the ones before `at` are read again, with the prompt's context)."""

    start: int
    at: int
    end: int
    entry: StoredPassage
    kv: CompactKv

    @property
    def tokens(self) -> int:
        return self.end - self.at


def plan(
    store: PassageStore | None, prompt: Prompt, scope: str | None, reused: int
) -> list[Placement]:
    """The prompt's passages found in the store, past the `reused` tokens its conversation's
    cache holds; those not found are wanted (read while idle). Never the prompt's last token:
    its logits give the first token."""
    if store is None or not store.enabled or not prompt.passages:
        return []
    prefix = digest(prompt.reading_prefix)
    placements: list[Placement] = []
    for start, tokens in prompt.passages:
        if start < reused:
            continue
        key = PassageKey(scope, prefix, tokens)
        found = store.find(key)
        if found is None:
            store.misses += 1
            store.want(key, prompt.reading_prefix)
            continue
        store.hits += 1
        entry, kv = found
        at = start + min(store.recompute, len(tokens))
        end = min(start + len(tokens), len(prompt.ids) - 1)
        if at < end:
            placements.append(Placement(start, at, end, entry, kv))
    return placements


class PassageReading:
    """One wanted passage read alone into a free slot, a piece a step (idle work): its reading
    prefix (from the store's copy, else read and kept), then the passage in chunks from the
    prefix's end; encoded into the store with the last piece. A request that starts meanwhile
    ends it (`abandon`): the wish stays, and the reading starts again later."""

    def __init__(
        self, store: PassageStore, decoder: BatchDecoder, wanted: Wanted, slot: int, chunk: int
    ) -> None:
        self.store, self.decoder, self.wanted = store, decoder, wanted
        self.slot, self.chunk = slot, chunk
        self.position = 0  # positions of the slot written
        self.tokens = [*wanted.prefix, *wanted.key.tokens]
        self.nbytes = len(self.tokens) * decoder.pool.bytes_per_token
        self._prefix_read = False

    @property
    def done(self) -> bool:
        return self.position >= len(self.tokens)

    def step(self) -> None:
        """One piece: the stored reading prefix written, or one chunk read; the passage kept
        after its last chunk (the slot is then freed)."""
        prefix = self.wanted.prefix
        pool = self.decoder.pool
        if not self._prefix_read:
            self._prefix_read = True
            kept = self.store.prefix(prefix)
            if kept is not None:
                kv_compact.restore(kept, pool, self.slot, len(prefix))
                self.position = len(prefix)
                return
        end = min(len(self.tokens), self.position + self.chunk)
        if self.position < len(prefix):
            end = min(end, len(prefix))  # the prefix alone first: it is kept apart
        piece = np.array([self.tokens[self.position : end]], dtype=np.int64)
        self.decoder.run(self.slot, piece, [self.position])
        self.position = end
        if end == len(prefix):
            self.store.keep_prefix(prefix, kv_compact.encode(pool, self.slot, 0, end, "fp32"))
        if self.done:
            kv = kv_compact.encode(pool, self.slot, len(prefix), end, self.store.encoding)
            self.store.put(self.wanted.key, len(prefix), kv)
            pool.free(self.slot)

    def abandon(self) -> None:
        self.decoder.pool.free(self.slot)
