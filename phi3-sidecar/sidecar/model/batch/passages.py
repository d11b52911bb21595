"""The passage store on the batched path (kv/passages.py says what it keeps and why): a grounded
prompt's placements, planned when its reply starts and written as its prompt is read
(row.BatchGeneration.prefill_chunk), and the idle reading of the runs it wanted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sidecar.model.batch.decoder import BatchDecoder
from sidecar.model.kv import compact as kv_compact
from sidecar.model.kv.compact import CompactKv
from sidecar.model.kv.passages import PassageStore, Run, Wanted
from sidecar.model.prompt.builder import Prompt


@dataclass(frozen=True)
class Placement:
    """Positions at..end-1 of a prompt, filled from a run's positions from `source` on (keys
    rotated by at - source where that is not 0: a moved passage)."""

    at: int
    end: int
    run: Run
    kv: CompactKv
    source: int

    @property
    def tokens(self) -> int:
        return self.end - self.at


def plan(
    store: PassageStore | None, prompt: Prompt, scope: str | None, reused: int
) -> list[Placement]:
    """The prompt's positions the store holds, past the `reused` tokens its conversation's
    cache (or a shared prefix) gave it: the longest run of its first tokens up to a passage's
    end, exactly; then, with moved reuse, each later passage found after the same reading
    prefix. A prompt not found whole is wanted (read while idle). Never the prompt's last
    token: its logits give the first token."""
    if store is None or not store.enabled or not prompt.passages:
        return []
    ids, last = prompt.ids, len(prompt.ids) - 1
    ends = [start + len(tokens) for start, tokens in prompt.passages]
    placements: list[Placement] = []
    covered = reused  # the prompt's positions held from the first on
    for end in reversed(ends):
        if end <= reused:
            break
        run = store.exact(scope, ids, end)
        if run is not None and run.kv is not None:
            placements.append(Placement(reused, min(end, last), run, run.kv, reused))
            covered = end
            break
    found = sum(1 for end in ends if reused < end <= covered)
    for start, tokens in prompt.passages:
        if start < covered or not store.moves:
            continue
        moved = store.moved(scope, prompt.reading_prefix, tokens)
        if moved is None:
            continue
        run, source = moved
        if run.kv is None:
            continue
        skip = min(store.recompute, len(tokens))
        end = min(start + len(tokens), last)
        if start + skip < end:
            placements.append(Placement(start + skip, end, run, run.kv, source + skip))
            found += 1
    passages = sum(1 for end in ends if end > reused)
    store.hits += found
    store.misses += passages - found
    if covered < ends[-1]:
        spans = tuple((start, len(tokens)) for start, tokens in prompt.passages)
        want = Wanted(scope, tuple(ids[: ends[-1]]), len(prompt.reading_prefix), spans)
        store.want(want)
    return sorted(placements, key=lambda p: p.at)


def warm(store: PassageStore | None, prompt: Prompt, scope: str | None) -> tuple[int, str | None]:
    """Note the prompt's run, up to its last passage's end, to be read ahead of questions
    (PASSAGE_WARM): its tokens, or 0 and why not."""
    if store is None or not store.enabled:
        return 0, "the passage store is off"
    if not prompt.passages:
        return 0, "no passage was found in the prompt"
    end = max(start + len(tokens) for start, tokens in prompt.passages)
    spans = tuple((start, len(tokens)) for start, tokens in prompt.passages)
    wanted = Wanted(scope, tuple(prompt.ids[:end]), len(prompt.reading_prefix), spans)
    if not store.warm(wanted):
        return 0, "stored already"
    return end, None


class PassageReading:
    """One wanted run read into a free slot, a piece a step (idle work): its reading prefix
    (from the store's copy, else read and kept), then the rest in chunks; encoded into the
    store with the last piece. A request that starts meanwhile ends it (`abandon`): the wish
    stays, and the reading starts again later."""

    def __init__(
        self, store: PassageStore, decoder: BatchDecoder, wanted: Wanted, slot: int, chunk: int
    ) -> None:
        self.store, self.decoder, self.wanted = store, decoder, wanted
        self.slot, self.chunk = slot, chunk
        self.position = 0  # positions of the slot written
        self.nbytes = len(wanted.tokens) * decoder.pool.bytes_per_token
        self._prefix_tried = False

    @property
    def done(self) -> bool:
        return self.position >= len(self.wanted.tokens)

    def step(self) -> None:
        """One piece: the stored reading prefix written, or one chunk read; the run kept
        after its last chunk (the slot is then freed)."""
        wanted, pool = self.wanted, self.decoder.pool
        prefix = wanted.tokens[: wanted.prefix]
        if not self._prefix_tried:
            self._prefix_tried = True
            kept = self.store.prefix(prefix)
            if kept is not None:
                kv_compact.restore(kept, pool, self.slot, len(prefix))
                self.position = len(prefix)
                return
        end = min(len(wanted.tokens), self.position + self.chunk)
        if self.position < len(prefix):
            end = min(end, len(prefix))  # the prefix alone first: it is kept apart
        piece = np.array([wanted.tokens[self.position : end]], dtype=np.int64)
        self.decoder.run(self.slot, piece, [self.position])
        self.position = end
        if end == len(prefix):
            self.store.keep_prefix(prefix, kv_compact.encode(pool, self.slot, 0, end, "fp32"))
        if self.done:
            kv = kv_compact.encode(pool, self.slot, 0, end, self.store.encoding)
            self.store.put(Run(wanted.scope, wanted.tokens, wanted.prefix, wanted.passages, kv))
            pool.free(self.slot)

    def abandon(self) -> None:
        self.decoder.pool.free(self.slot)
