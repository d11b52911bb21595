"""Prompt-lookup drafts on the batched path (PROMPT_LOOKUP_TOKENS > 0): a reply whose last
tokens occurred before in its conversation (the prompt, its quoted passages, or the reply) is
offered the tokens that followed them there, and one model call reads its last token and the
draft (decoder.run(..., every=True): every position's logits). BatchGeneration.take_run then
chooses each next token from its position's logits exactly as a one-token step would (penalty,
minimum length, grammar, sampler, stops) and goes on while the choice is the draft's next token:
the agreeing run is taken plus the model's own token after it, and the K/V written past what was
taken is left behind (the reply's kv_len stops before it; the next call overwrites it, and the
attention mask, sized by kv_len, never reads it).

Only while the reply decodes alone (step.BatchStep._propose): GroupQueryAttention refuses a call
of several rows that reads several tokens each after a cache ("batch_size must be 1 when
sequence_length > 1 and past context is given", onnxruntime 1.31), and a call of its own beside
other rows would add a pass over the weights to every step of theirs
(docs/benchmarks/drafts.md). Same rule as the Generator's drafts (generator/drafts.py): an
n-gram of NGRAM_SIZE tokens must match; the draft shortens after a miss and drafting pauses
after misses in a row, so a plain chat pays little for the calls that find nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sidecar.ipc import Drafts

NGRAM_SIZE = 3  # as generator/drafts.py: 2 proposes more often and is accepted less
# Misses in a row (a draft whose first token was refused) before drafting pauses, and the
# steps the pause lasts (a wider call that finds nothing costs a plain chat its time)
MISSES_BEFORE_PAUSE = 2
PAUSE_STEPS = 8


def lookup(tokens: Sequence[int], most: int, ngram: int = NGRAM_SIZE) -> list[int]:
    """The tokens that followed the latest earlier occurrence of the last `ngram` tokens
    (up to `most`, stopping at the sequence's end); [] when they occurred nowhere before."""
    if most < 1 or len(tokens) <= ngram:
        return []
    sequence = np.asarray(tokens, dtype=np.int64)
    tail = sequence[-ngram:]
    # Start positions of every earlier window whose successor exists: 0 .. len - ngram - 1
    starts = len(sequence) - ngram
    found = np.ones(starts, dtype=bool)
    for offset in range(ngram):
        found &= sequence[offset : offset + starts] == tail[offset]
    hits = np.flatnonzero(found)
    if not len(hits):
        return []
    after = int(hits[-1]) + ngram
    return [int(t) for t in sequence[after : after + most]]


class RowDrafts:
    """One reply's drafts: how long the next may be, and what they did (ipc.Drafts)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.length = most  # the next draft's length: adapts down after a miss, up after a hit
        self.checked = 0
        self.accepted = 0
        self.calls = 0  # the reply's decode calls, drafted or not
        self._misses = 0
        self._paused = 0

    def propose(self, tokens: Sequence[int], room: int) -> list[int]:
        """A draft for the sequence `tokens` (the last is the one the next call reads), at
        most `room` tokens (what the reply's length, slot and KV reservation leave)."""
        if self._paused:
            self._paused -= 1
            return []
        return lookup(tokens, min(self.length, room))

    def settle(self, checked: int, accepted: int) -> None:
        """One decode call of the reply: `checked` draft tokens read, `accepted` taken."""
        self.calls += 1
        if not checked:
            return
        self.checked += checked
        self.accepted += accepted
        if accepted == checked:
            self.length = min(self.most, self.length + 1)
            self._misses = 0
            return
        self.length = max(1, accepted + 1)
        self._misses = self._misses + 1 if not accepted else 0
        if self._misses >= MISSES_BEFORE_PAUSE:
            self._paused, self._misses = PAUSE_STEPS, 0

    def counts(self) -> Drafts:
        return Drafts(self.checked, self.accepted, self.calls)
