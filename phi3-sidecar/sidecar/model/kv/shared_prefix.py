"""Shared prefixes (SHARED_PREFIXES): the operator's system prompts, read once, from which every
new chat that sends one starts (batched path).

Every new chat reads the operator's system prompt (the app's instructions, a grounded answer's
rules) before its own words, the same tokens for every user. The operator declares those
system messages in the settings; the worker reads each once at start (after the warm-up) and
keeps its K/V as a lossless copy (kv/compact.py, `fp32`), counted against the one KV bound
(kv.tiers.Memory). A new chat (nothing of its own scope reused) whose prompt starts with a
prefix's tokens gets the copy written into its slot and reads only the rest of its prompt.

Which tokens: the rendered prompt of the system message and a user turn, up to the first token
that depends on the user's turn (the common start of the prompts for two different user
turns), so the prefix is the same whatever the template wraps around it; a request's prompt
must start with exactly those tokens (compared token by token) to use it.

Exactness: the prefix is read as a fresh prompt read alone is (batch.step.chunk_for), in
chunks from its first token, so its K/V are such a read's bit for bit; the rest of the prompt
is then read from the prefix's end. Where that end is not a whole number of chunks the rest's
chunks fall elsewhere than a fresh read's (the same last-bit differences the conversation
cache accepts for a next turn); PROMPT_CACHE_EXACT=true uses only the prefix's whole chunks,
and replies are then an uncached run's, bit for bit.

Written ahead: writing a prefix's K/V into a new chat's slot is a pass over fresh pages (a
400-token prefix is 300 MiB of fp32 K/V on Phi-3-mini: 0.1 s of a first token on a 2-vCPU EPYC,
0.2-0.4 s on a VM whose memory was still being touched for the first time). So while the worker
is idle (kv/idle.py's room made first), the prefix last used is written into a free slot ahead,
STAGE_PIECE_TOKENS positions a step (the worker reads its pipe between steps), and counted
against the bound while it waits there. The next new chat that starts with it takes that slot
and finds it written; any other request gives the slot back first (its pages are freed: the
bound's room is the same as before). It is the same decoding of the same copy, so the slot holds
the same bits.

Not an oracle: a prefix comes only from the settings, never from a request, so no request
learns anything from another's tokens; it is used only by a request that sent all of it
itself; and `cached_tokens` (the response's usage, X-Cached-Tokens) counts only what the
request's own scope held, not the shared prefix. What the timing of a first token can still
tell a caller is whether the system message it sent is, whole, one the operator declared: do
not declare a system prompt that callers who send system messages must not be able to confirm.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sidecar.ipc import Role
from sidecar.model.batch.decoder import BatchDecoder, KvPool
from sidecar.model.kv import compact as kv_compact
from sidecar.model.kv.compact import CompactKv
from sidecar.model.prompt.passages import common_start

log = logging.getLogger("sidecar.model.shared_prefix")  # the name its log lines always had


class Reader(Protocol):
    """The batched path as read_declared needs it (batch.scheduler.BatchScheduler, which
    imports this module: a protocol, not an import, keeps them out of a cycle)."""

    shared: list[SharedPrefix]

    def read_shared(self, prefixes: list[list[int]]) -> None: ...


@dataclass(frozen=True)
class SharedPrefix:
    ids: tuple[int, ...]
    kv: CompactKv

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes


Render = Callable[[Sequence[tuple[Role, str]]], list[int]]  # messages -> prompt ids


STAGE_PIECE_TOKENS = 64  # positions written ahead per idle step (Phi-3-mini: 48 MiB)


@dataclass
class Staged:
    """A shared prefix being written ahead into a free slot (positions 0 to `written` - 1
    done); its whole size is set aside in the bound while it is there."""

    prefix: SharedPrefix
    slot: int
    nbytes: int
    written: int = 0

    @property
    def done(self) -> bool:
        return self.written >= len(self.prefix.ids)

    def step(self, pool: KvPool) -> None:
        """Write the next piece."""
        end = min(len(self.prefix.ids), self.written + STAGE_PIECE_TOKENS)
        kv_compact.restore(self.prefix.kv, pool, self.slot, end, start=self.written)
        self.written = end


def prefix_tokens(system: str, render: Render) -> list[int]:
    """The tokens every prompt that opens with this system message starts with."""
    return common_start(system, render)


def read(decoder: BatchDecoder, slot: int, ids: Sequence[int], chunk: int) -> SharedPrefix:
    """Read a prefix into a free slot as a fresh prompt is read (chunks from its first token)
    and keep its K/V losslessly; the slot is left as it was found (freed)."""
    pool = decoder.pool
    try:
        for start in range(0, len(ids), chunk):
            piece = np.array([ids[start : start + chunk]], dtype=np.int64)
            decoder.run(slot, piece, [start])
        kv = kv_compact.encode(pool, slot, 0, len(ids), "fp32")
    finally:
        pool.free(slot)
    return SharedPrefix(tuple(int(t) for t in ids), kv)


def longest(prefixes: Sequence[SharedPrefix], prompt: Sequence[int]) -> SharedPrefix | None:
    """The longest prefix the prompt starts with and goes on past (a token is always read)."""
    best: SharedPrefix | None = None
    for prefix in prefixes:
        size = len(prefix.ids)
        longer = best is None or size > len(best.ids)
        if longer and len(prompt) > size and tuple(prompt[:size]) == prefix.ids:
            best = prefix
    return best


def read_declared(batch: Reader | None, systems: Sequence[str], render: Render) -> None:
    """Read each declared system message's prefix once into the batched path (logged); the
    Generator path has none."""
    if batch is None or not systems:
        return
    batch.read_shared([prefix_tokens(text, render) for text in systems])
    fields = {"prefixes": len(batch.shared), "tokens": [len(p.ids) for p in batch.shared]}
    fields["bytes"] = sum(p.nbytes for p in batch.shared)
    log.info("shared prefixes", extra={"fields": fields})
