"""One row of the batch: a reply on the batched path (BatchGeneration: its prompt read chunk by
chunk, each token chosen from its row of logits under its sampler, grammar, stop sequences and
minimum length, the waits of its KV reservation) and the conversation it continues
(SlotHolder: its tokens, how many are in the KV cache, and where that is). scheduler.py steps
the rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from sidecar.ipc import Drafts, Finish, Generate, TokenLogprob
from sidecar.model.batch.decoder import BatchDecoder
from sidecar.model.batch.drafts import RowDrafts
from sidecar.model.batch.guidance import RowGuide
from sidecar.model.batch.passages import Placement
from sidecar.model.batch.sampling import Sampler, penalize_repeats
from sidecar.model.kv.bound import Memory
from sidecar.model.kv.prompt_cache import Entry, Lease
from sidecar.model.kv.tiers import Holding, Restored
from sidecar.model.logprobs import ReplyLogprobs
from sidecar.model.prompt.builder import Prompt
from sidecar.model.stops import StopFilter


class GrammarDeadEnd(RuntimeError):
    """A guided reply's grammar left no token, or refused the one chosen (llguidance's words,
    which quote the grammar and the reply's last tokens)."""


class TokenStream(Protocol):
    def decode(self, token: int) -> str: ...


@dataclass(eq=False)
class SlotHolder:
    """One conversation's KV: its tokens (what the cache matches, as a generator's sequence),
    how many of them are in the KV cache, and where that is: a pool slot, or (kept idle) compact
    RAM or the disk tier (kv/tiers.py)."""

    slot: int | None
    tokens: list[int] = field(default_factory=list)
    kv_len: int = 0
    touched: int = 0  # positions written since the slot was last freed: its memory
    entry: Entry | None = None
    busy: bool = True  # a request is using it
    holding: Holding = field(default_factory=Holding)  # its compact copy and file

    def get_sequence(self, index: int) -> list[int]:
        return self.tokens

    @property
    def index(self) -> int:
        """Its slot, for a holder a reply is using (always in one)."""
        assert self.slot is not None, "a running reply's conversation is in a slot"
        return self.slot


class Batch(Protocol):
    """What a row needs of the scheduler that steps it (scheduler.BatchScheduler, which imports
    this module: a protocol, not an import, keeps the two out of a cycle)."""

    decoder: BatchDecoder
    eos_ids: frozenset[int]
    vocab_size: int
    new_stream: Any  # () -> TokenStream
    draft_tokens: int  # PROMPT_LOOKUP_TOKENS (batch/drafts.py); 0: no drafts

    def chunk_for(self, generation: BatchGeneration) -> int: ...

    def place(self, generation: BatchGeneration, placement: Placement) -> None: ...

    def step_one(self, generation: BatchGeneration) -> str | None: ...

    def leave(self, generation: BatchGeneration, reusable: bool) -> None: ...


class BatchGeneration:
    """One reply on the batched path (the worker's Stepper, stepped by BatchScheduler)."""

    batched = True  # the worker steps it through BatchScheduler.step, not step()

    def __init__(
        self,
        scheduler: Batch,
        prompt: Prompt,
        request: Generate,
        holder: SlotHolder,
        lease: Lease,
    ) -> None:
        self.prompt = prompt
        self.generated = 0
        self.lease = lease
        self.cached_tokens = lease.reused
        self.cache_reason: str = lease.reason
        self.finish: Finish | None = None
        self.fault: Exception | None = None  # what ended it with finish "error" (step)
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.holder = holder
        self._scheduler = scheduler
        self._appended = lease.reused
        self.passed_over = 0  # steps that read another prompt's chunk while this one waited
        self._first_logits: np.ndarray | None = None
        # KV bytes reserved against the bound (kv.bound.Memory) under its booking, and its
        # whole length's; the seconds it waited to grow (while the bound was full)
        self.booking = -1
        self.reserved = 0
        self.need = 0
        self.kv_paused_s = 0.0
        self._paused_at: float | None = None
        self._row_size = scheduler.vocab_size  # logits per row (a forced token's logprobs)
        self.restored = Restored(None)  # where the reused tokens came from, and its cost
        self.room_s = 0.0  # its start moving kept conversations down a tier for its room
        self.room_moves = (0, 0)  # how many: compacted, written to disk
        self._min_new = min(request.min_new_tokens, prompt.max_new_tokens)
        top_k = request.top_k
        if top_k is not None and scheduler.vocab_size:
            top_k = min(top_k, scheduler.vocab_size)
        # One rule for greedy (ipc.Generate.sampling): a temperature below the floor is greedy
        temperature = request.temperature if request.sampling else None
        self._sampler = Sampler(temperature, top_k, request.top_p, request.seed)
        self._penalty = request.repetition_penalty or 1.0
        self._stream: TokenStream = scheduler.new_stream()
        self._stops = StopFilter(request.stop)
        # A guided request's matcher (batch/guidance.py), set by the engine before the first step
        self.guide: RowGuide | None = None
        # Generate.logprobs (logprobs.py), set by the engine before the first step
        self.logprobs: ReplyLogprobs | None = None
        # Prompt-lookup drafts (batch/drafts.py): the one the next call reads, set by the step
        self.lookup = RowDrafts(scheduler.draft_tokens) if scheduler.draft_tokens else None
        self.draft: list[int] = []
        # Its prompt's positions filled from the passage store (batch/passages.py), in order;
        # set by the scheduler's start
        self.placements: list[Placement] = []

    @property
    def passage_cached_tokens(self) -> int:
        """Prompt tokens whose K/V come from the passage store, not from reading them."""
        return sum(placement.tokens for placement in self.placements)

    @property
    def prefilling(self) -> bool:
        return self._appended < len(self.prompt.ids)

    @property
    def pending(self) -> int:
        """Tokens of the sequence not yet in the KV cache: the last one chosen, and the
        tokens its grammar forced after it (batch/guidance.py); the next call reads them."""
        return len(self.holder.tokens) - self.holder.kv_len

    @property
    def prompt_left(self) -> int:
        """Prompt tokens still to read (those the passage store fills are not read)."""
        placed = sum(p.tokens for p in self.placements if p.at >= self._appended)
        return len(self.prompt.ids) - self._appended - placed

    def step(self) -> str | None:
        """This generation alone (the worker steps batched ones through the scheduler)."""
        return self._scheduler.step_one(self)

    def prefill_chunk(self) -> None:
        """Read the next chunk of the prompt (up to the next passage from the store, whose
        positions are then written first); the last one's logits give the first token."""
        start, ids = self._appended, self.prompt.ids
        while placement := next((p for p in self.placements if p.at == start), None):
            self._scheduler.place(self, placement)
            self.holder.tokens[start:] = ids[start : placement.end]
            self.wrote(placement.end - start)
            start = self._appended = placement.end
        end = min(start + self._scheduler.chunk_for(self), len(ids))
        end = min([end, *(p.at for p in self.placements if p.at > start)])
        chunk = np.array([ids[start:end]], dtype=np.int64)
        logits = self._scheduler.decoder.run(self.holder.index, chunk, [start])
        self.holder.tokens[start:] = ids[start:end]
        self.wrote(end - start)
        self._appended = end
        self.lease.prefilled(end)
        if self.placements and self.lease.entry is not None:  # not a fresh read's K/V from there
            entry = self.lease.entry
            entry.exact_end = min(entry.exact_end, self.placements[0].at)
        if not self.prefilling:
            self._first_logits = logits[0]

    def first_token(self) -> str:
        logits, self._first_logits = self._first_logits, None
        assert logits is not None, "the prompt is not read yet"
        self._row_size = len(logits)
        guide = self.guide
        if guide is not None and guide.fast_forward:
            # What the grammar forces before any choice (a JSON reply's opening): taken as
            # onnxruntime-genai takes it, read by the next call, the token chosen after it
            forced = self._forced(guide)
            if forced is not None:
                return self._ended(forced)
        return self.take(logits)

    def wrote(self, count: int) -> None:
        """`count` more positions of this reply's slot hold K/V."""
        holder = self.holder
        holder.kv_len += count
        holder.touched = max(holder.touched, holder.kv_len)
        self.lease.holds(holder.kv_len)

    def take(self, logits: np.ndarray) -> str:
        """Choose the next token; its text ('' while a character is incomplete)."""
        eos = self._scheduler.eos_ids
        self._row_size = len(logits)
        if self._penalty != 1.0:
            logits = penalize_repeats(logits, self.holder.tokens, self._penalty)
        banned = eos if self.generated < self._min_new else ()
        guide = self.guide
        if guide is not None:
            allowed = guide.masked(logits, banned)
            if allowed is None:  # never a token outside the grammar (batch/guidance.py)
                raise GrammarDeadEnd(guide.error)  # its text quotes the grammar and the reply
            logits, banned = allowed, ()
        token = self._sampler.pick(logits, banned)
        if guide is not None and token not in eos and not guide.consume(token):
            raise GrammarDeadEnd(guide.error)
        self.generated += 1
        self.last_token_at = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = self.last_token_at
        if token in eos:
            # As on the Generator path: EOS is not in the sequence, whose K/V is all cached.
            self.finish = "eos"
            return self._stops.flush()
        if self.logprobs is not None:  # from the row the token was chosen from
            self.logprobs.chosen(logits, token, banned)
        # In the sequence, not yet in the KV cache: the next step feeds it.
        self.holder.tokens.append(token)
        text = str(self._stream.decode(token))
        if guide is not None and self.generated < self.prompt.max_new_tokens:
            text += self._forced(guide) or ""
        return self._ended(text)

    def take_run(self, logits: np.ndarray) -> str:
        """The tokens of a call that read the last token and `draft` (`logits`: each
        position's, batch/drafts.py): each chosen from its position as take() chooses, while the
        choice is the draft's next token (a sampled reply: where its sampler picks it), then the
        model's own; the draft's K/V past them is left behind kv_len, for the next call to
        overwrite."""
        draft, self.draft = self.draft, []
        holder, start, accepted = self.holder, self.holder.kv_len, 0
        text = ""
        try:
            for position, row in enumerate(logits):
                before = len(holder.tokens)
                text += self.take(row)
                # The draft's token alone (a grammar's forced tokens after it end the run too)
                if position == len(draft) or holder.tokens[before:] != [draft[position]]:
                    break
                accepted += 1
                if self.finish is not None:
                    break
        finally:  # positions read: the last token and the agreeing run
            self.wrote(1 + accepted)
            holder.touched = max(holder.touched, start + 1 + len(draft))  # its pages
            if self.lookup is not None:
                self.lookup.settle(len(draft), accepted)
        return text

    def _forced(self, guide: RowGuide) -> str | None:
        """Take the tokens the grammar forces now (none with forced tokens off), as many as
        the reply's max_new_tokens leaves (as the Generator path shows them): their text, None
        when there are none. They join the sequence, and the next call reads them."""
        forced = guide.forced()[: self.prompt.max_new_tokens - self.generated]
        if not forced:
            return None
        text = ""
        for token in forced:
            if self.logprobs is not None:  # the only token the grammar allowed
                self.logprobs.forced(token, self._row_size)
            self.holder.tokens.append(token)
            text += str(self._stream.decode(token))
        self.generated += len(forced)
        self.last_token_at = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = self.last_token_at
        return text

    def _ended(self, text: str) -> str:
        """The text of the tokens just taken, and whether the reply ends with them."""
        if self._stops:
            text, stopped = self._stops.feed(text)
            if stopped:
                self.finish = "stop"
                return text
        guide = self.guide
        if self.generated >= self.prompt.max_new_tokens:
            self.finish = "length"
            text += self._stops.flush()
        elif guide is not None and guide.stopped:
            # The grammar is complete: the end token the Generator path would make next
            self.generated += 1
            self.finish = "eos"
            text += self._stops.flush()
        return text

    def wait_for_room(self, memory: Memory) -> None:
        """Its reservation cannot grow this step (the bound is full): it waits."""
        if self._paused_at is None:
            self._paused_at = time.monotonic()
            memory.pauses += 1

    def room_found(self) -> None:
        if self._paused_at is not None:
            self.kv_paused_s += time.monotonic() - self._paused_at
            self._paused_at = None

    def take_logprobs(self) -> tuple[TokenLogprob, ...]:
        """The log probabilities of the tokens whose text is now shown (logprobs.py)."""
        return () if self.logprobs is None else self.logprobs.take(self._stops, self.finish)

    def release(self, reusable: bool) -> None:
        self._scheduler.leave(self, reusable)

    def tokens_per_s(self) -> float | None:
        if self.first_token_at is None or self.last_token_at is None or self.generated < 2:
            return None
        elapsed = self.last_token_at - self.first_token_at
        return (self.generated - 1) / elapsed if elapsed > 0 else None

    def drafts(self) -> Drafts | None:
        """Its prompt-lookup drafts (PROMPT_LOOKUP_TOKENS, batch/drafts.py); None when off."""
        return None if self.lookup is None else self.lookup.counts()
