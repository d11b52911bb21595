"""One reply on the Generator path: a generator lent by the conversation cache (through a
lease, kv/prompt_cache.py) or made by the engine for it, stepped by the worker.

A generation reads its prompt in chunks (PREFILL_CHUNK tokens, one chunk per step) before it
generates a token per step: one append of a long prompt is minutes of Phi-3-mini on a CPU, and
the worker can act only between steps, so a cancellation would wait for the whole prefill and
the other generations' replies would freeze meanwhile. Chunked, a cancellation lands within one
chunk and the others' tokens interleave with the chunks. The greedy tokens are the same.

A prompt with images (a vision model) reads everything up to its last image in its first step,
one call: onnxruntime-genai runs the vision graph on a generator's first run only. The text
after the last image follows in chunks, as any prompt's.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np

from sidecar.ipc import Drafts, Finish, Generate, Guidance, TokenLogprob
from sidecar.model.batch.guidance import RowGuide
from sidecar.model.batch.sampling import penalize_repeats
from sidecar.model.family import ModelFacts
from sidecar.model.generator.drafts import draft_counts
from sidecar.model.generator.path import GeneratorPath, ImageInputs, turn_options
from sidecar.model.guidance import fitted, room
from sidecar.model.kv.prompt_cache import PromptCache
from sidecar.model.kv.tiers import Restored
from sidecar.model.logprobs import ReplyLogprobs
from sidecar.model.prompt.builder import Prompt
from sidecar.model.stops import StopFilter


class Host(Protocol):
    """What a generation reads of the engine that made it (engine.Engine); a protocol, so
    this module needs nothing of the engine's."""

    eos_ids: frozenset[int]
    max_length: int
    cache: PromptCache  # the Generator path's conversation cache
    facts: ModelFacts
    generators: GeneratorPath
    prefill_chunk: int
    rewind_slack: int
    tokenizer: Any  # onnxruntime-genai's Tokenizer: create_stream()

    def logprobs_for(self, request: Generate) -> ReplyLogprobs | None: ...

    def shadow_guide(self, guidance: Guidance | None) -> RowGuide | None: ...


class Generation:
    """One reply: a generator (lent by the conversation cache, or made for it) and its own
    tokenizer stream."""

    def __init__(
        self,
        engine: Host,
        prompt: Prompt,
        request: Generate,
        *,
        cached: bool,
        images: ImageInputs | None = None,
    ) -> None:
        self.prompt = prompt
        self.generated = 0
        self.finish: Finish | None = None
        self.fault: Exception | None = None  # a failed step raises instead (worker.py)
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self._eos = engine.eos_ids
        sampling = request.sampling  # below ipc.MIN_TEMPERATURE: greedy
        needed = len(prompt.ids) + prompt.max_new_tokens
        guidance = fitted(request.guidance, needed, engine.max_length)
        needed += room(guidance)  # forced tokens may run past the reply's budget (guidance.py)
        self.guided = guidance is not None
        # A generator made for this request has its KV cache allocated for all of its length
        # up front; a sliding-window model's is at least its window: onnxruntime refuses less.
        self.lease = engine.cache.lease(
            request,
            prompt.ids,
            needed,
            guidance=guidance,
            wanted=cached and images is None,  # images are read on a new generator's first run
            min_capacity=engine.facts.min_cache_length,
        )
        lease = self.lease
        vocab_size = engine.generators.options.vocab_size
        # A generator the cache does not keep reserves its KV against KV_MEMORY_MB before it is
        # made (NoRoom: the request waits); the cache's own are within PROMPT_CACHE_MB.
        self._memory = engine.generators.memory
        fresh_alone = lease.fresh and not lease.keep
        nbytes = lease.capacity * engine.cache.bytes_per_token
        self._reserved = self._memory.reserve(nbytes) if fresh_alone else 0
        if lease.fresh:
            try:
                generator, params = engine.generators.new_generator(
                    lease.capacity, request, prompt, guidance
                )
            except Exception:
                self._memory.release(self._reserved)
                raise
            entry = lease.attach(generator, params)
        else:
            assert lease.entry is not None
            entry = lease.entry
            try:
                generator = entry.generator
                if self.guided and generator.token_count() == lease.reused > 0:
                    lease.reused -= 1  # only a rewind re-arms the grammar (guidance.py)
                if generator.token_count() > lease.reused:
                    generator.rewind_to(lease.reused)
                entry.params.set_search_options(**turn_options(request, prompt, vocab_size))
            except Exception:
                lease.give_back(reusable=False)
                raise
        self.cached_tokens = lease.reused
        self.cache_reason: str = lease.reason
        # A generator is its own cache: what it reuses was always in RAM (no tiers here)
        self.restored = Restored("ram" if lease.reused else None)
        self.generator = entry.generator
        # Log probabilities (logprobs.py): the grammar's mask from a matcher of its own
        self.logprobs = engine.logprobs_for(request)
        self._shadow = engine.shadow_guide(guidance) if self.logprobs is not None else None
        self._penalty = request.repetition_penalty or 1.0
        self._min_length = len(prompt.ids) + min(request.min_new_tokens, prompt.max_new_tokens)
        drafting = (
            engine.generators.options.prompt_lookup_tokens and not sampling and not self.guided
        )
        drafting = drafting and self.logprobs is None
        self._drafts_before = draft_counts(self.generator) if drafting else None
        self._stream = engine.tokenizer.create_stream()
        self._stops = StopFilter(request.stop)
        self._chunk = engine.prefill_chunk
        self._slack = engine.rewind_slack
        self._appended = self.cached_tokens  # prompt tokens in the generator so far
        self._images = images  # read by the first step, then let go (the pixels are big)

    @property
    def prefilling(self) -> bool:
        """True while part of the prompt is still to be appended."""
        return self._appended < len(self.prompt.ids)

    @property
    def prompt_left(self) -> int:
        """Prompt tokens still to read (as BatchGeneration's: the worker's progress reports)."""
        return len(self.prompt.ids) - self._appended

    def reading_chunk(self) -> int:
        """The prompt tokens the next step reads: everything up to the last image, or a chunk."""
        end = self._images.end if self._images is not None else self._appended + self._chunk
        return min(end, len(self.prompt.ids)) - self._appended

    def step(self) -> str | None:
        """One bounded piece of work: while the prompt is not all appended, append its next
        chunk (at most PREFILL_CHUNK tokens) and return None, no token made; after that,
        generate one token and return its new text.

        The text is '' while a character is still incomplete; the stream never yields half a
        character, so a reply cut off by the length limit ends on a whole character.
        """
        if self.prefilling:
            if self._images is not None:  # the images and all before them, in one call
                self.generator.set_inputs(self._images.named(self.prompt.ids))
                end, self._images = self._images.end, None
            else:
                end = self._appended + self._chunk
                self.generator.append_tokens(self.prompt.ids[self._appended : end])
            self._appended = min(end, len(self.prompt.ids))
            self.lease.holds(self.generator.token_count())
            self.lease.prefilled(self._appended)
            return None
        before = self.generator.token_count()
        chosen_from = self._logits(before) if self.logprobs is not None else None
        self.generator.generate_next_token()
        token = int(self.generator.get_next_tokens()[0])
        count = self.generator.token_count()
        if chosen_from is not None and token not in self._eos:
            self._chosen(chosen_from, token)
        self.last_token_at = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = self.last_token_at
        # A guided step may also have added the tokens its grammar forced, in front of the
        # sampled one (guidance.py); an unguided step adds exactly the sampled token.
        if count - before == 1 and token not in self._eos:
            tokens = [token]
        else:
            tokens = [int(t) for t in self.generator.get_sequence(0)[before:count]]
        budget = self.prompt.max_new_tokens - self.generated
        shown = tokens[:budget]  # forced tokens never take a reply past its max_new_tokens
        self.generated += len(shown)
        text = "".join(str(self._stream.decode(t)) for t in shown)
        ended = token in self._eos and len(shown) == len(tokens)
        if token in self._eos:
            # EOS is not added to the sequence, and the step fed the token before it (and any
            # forced ones): the KV cache now holds the whole sequence.
            self.lease.holds(count - self._slack)
            if ended:
                self.generated += 1  # the end token counts, as it always did
        else:
            # The sampled token is in the sequence but not yet in the KV cache (the next step
            # feeds it): a later request re-appends it.
            self.lease.holds(count - 1 - self._slack)
        if self._stops:
            text, stopped = self._stops.feed(text)
            if stopped:
                self.finish = "stop"
                return text
        if ended:
            self.finish = "eos"
            return text + self._stops.flush()
        if self.generated >= self.prompt.max_new_tokens or self.generator.is_done():
            self.finish = "length"
            text += self._stops.flush()
        return text

    def _logits(self, before: int) -> np.ndarray:
        """The row the next token is chosen from, processed as the Generator processes it
        (logprobs.py); the tokens a grammar forced in front of it are listed first."""
        assert self.logprobs is not None
        logits = np.asarray(self.generator.get_logits(), dtype=np.float32)
        row = logits.reshape(-1, logits.shape[-1])[-1]
        now = self.generator.token_count()  # computing the logits appends forced tokens
        sequence = self.generator.get_sequence(0) if now > before or self._penalty != 1.0 else ()
        for forced in sequence[before:now]:
            self.logprobs.forced(int(forced), len(row))
            if self._shadow is not None:
                self._shadow.consume(int(forced))
        if self._penalty != 1.0:  # image slots (negative ids) are no tokens to penalize
            seen = [int(t) for t in sequence[:now] if t >= 0]
            row = penalize_repeats(row, seen, self._penalty)
        banned = self._eos if now < self._min_length else ()
        if self._shadow is not None:
            masked = self._shadow.masked(row, banned)
            if masked is not None:
                return masked
        if banned:
            row = row.copy()
            row[list(banned)] = -np.inf
        return row

    def _chosen(self, row: np.ndarray, token: int) -> None:
        assert self.logprobs is not None
        self.logprobs.chosen(row, token)
        if self._shadow is not None:
            self._shadow.consume(token)

    def take_logprobs(self) -> tuple[TokenLogprob, ...]:
        """The log probabilities of the tokens whose text is now shown (logprobs.py)."""
        return () if self.logprobs is None else self.logprobs.take(self._stops, self.finish)

    def release(self, reusable: bool) -> None:
        """The request is over (finished, cancelled, or failed: not reusable)."""
        self.lease.give_back(reusable)
        self._memory.release(self._reserved)
        self._reserved = 0

    def drafts(self) -> Drafts | None:
        """This reply's prompt-lookup drafts; None when it had none (PROMPT_LOOKUP_TOKENS=0,
        sampling)."""
        if self._drafts_before is None:
            return None
        return draft_counts(self.generator).since(self._drafts_before)

    def tokens_per_s(self) -> float | None:
        """Decode speed: tokens after the first one over the time they took."""
        if self.first_token_at is None or self.last_token_at is None or self.generated < 2:
            return None
        elapsed = self.last_token_at - self.first_token_at
        return (self.generated - 1) / elapsed if elapsed > 0 else None
