"""One step of the batched path (BatchScheduler is a BatchStep): one decode call per
DECODE_BATCH_ROWS replies past their prompt, each over a run of adjacent slots (a reply whose KV
reservation cannot grow waits, a guided reply decoding alone reads its forced run in a call of
its own, and so does a reply decoding alone that reads a prompt-lookup draft, batch/drafts.py);
the first token of each reply whose prompt the previous step finished; and one chunk of the
prompt next_prompt picks. Each row is isolated: whatever fails for one reply ends that reply
alone.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from sidecar.model.batch.decoder import BatchDecoder
from sidecar.model.batch.row import BatchGeneration
from sidecar.model.batch.slots import SlotTable
from sidecar.model.guidance import FF_MARGIN
from sidecar.model.kv.bound import GROWTH_TOKENS, Memory


class BatchStep(SlotTable):
    # Set by BatchScheduler.__init__
    decoder: BatchDecoder
    memory: Memory
    rows: int
    chunk: int
    prefilling: deque[BatchGeneration]
    ready: list[BatchGeneration]  # prompt read; first token at the next step
    draft_tokens = 0  # PROMPT_LOOKUP_TOKENS (batch/drafts.py), set by batch/setup.py

    def step(self) -> list[tuple[BatchGeneration, str | None]]:
        """One decode call per DECODE_BATCH_ROWS replies past their prompt, the first token
        of each reply whose prompt the previous step finished reading, and one chunk of a
        prompt still being read (next_prompt says which): each touched
        generation with its new text (None: a chunk, or no token).

        Each row is isolated: whatever fails for one reply (its logits, its sampler, its
        grammar, its stop filter, a model call it is part of) ends that reply alone, with
        finish "error" and the exception as its `fault` (the worker logs and counts it); the
        others go on."""
        results: list[tuple[BatchGeneration, str | None]] = []
        self._propose()
        # A reply without KV reserved for the positions its call writes, and no room to grow,
        # waits: the calls bind the runs of slots around it (kv/bound.py)
        writing = [
            i
            for i, generation in enumerate(self.decoding)
            if self._may_write(generation, self._fed(generation))
        ]
        for start, end in _runs(writing):
            for first, group in self._calls(self.decoding[start:end], start):
                results.extend(zip(group, self._decode_isolated(first, group), strict=True))
        for generation in list(self.ready):
            try:
                first_text: str | None = self._first_token(generation)
            except Exception as exc:
                self._failed(generation, exc)
                first_text = None
            results.append((generation, first_text))
        if self.prefilling:
            generation = self.next_prompt()
            try:
                self._prefill(generation)
            except Exception as exc:
                self._failed(generation, exc)
                self.prefilling.remove(generation)
            results.append((generation, None))
        return results

    def _propose(self) -> None:
        """A prompt-lookup draft for the reply that decodes alone (batch/drafts.py), as long
        as its length, its slot and the KV already reserved for it leave room: a draft never
        makes a reply wait for room to grow. Nobody else is in the batch: GroupQueryAttention
        takes several tokens a row in a call of one row only, and a call of its own would cost
        every other row a pass over the weights each step."""
        for generation in self.decoding:
            generation.draft = []
        if len(self.decoding) != 1 or self.ready or self.prefilling:
            return
        generation = self.decoding[0]
        if generation.lookup is None or generation.pending != 1:
            return
        holder = generation.holder
        room = min(
            generation.prompt.max_new_tokens - generation.generated,  # with its own token
            self.pool.length - holder.kv_len,
            generation.reserved // self.pool.bytes_per_token - holder.kv_len,
        )
        generation.draft = generation.lookup.propose(holder.tokens, room - 1)

    def _fed(self, generation: BatchGeneration) -> int:
        """The positions the reply's next decode call writes: one token, or as much of a run
        of forced tokens as one call reads (a call of its own, _calls). A reply that decodes
        alone reads a forced run in one call, as onnxruntime-genai does, up to the longest run
        it allows for (guidance.FF_MARGIN), or a prompt chunk where that is longer. Beside
        other replies it reads one forced token a step, in their call: a call of its own
        would cost them a whole extra pass over the weights each time (the guidance bench's
        three chats decoded at 0.74x their rate beside an unguided reply), where one token
        a step costs them nothing and the guided reply no more than an unguided one."""
        if generation.pending > 1 and len(self.decoding) == 1:
            return min(generation.pending, max(self.chunk, FF_MARGIN))
        return 1 + len(generation.draft)

    def _may_write(self, generation: BatchGeneration, positions: int) -> bool:
        """Whether the reply's next decode call has KV reserved for the `positions` it
        writes, growing its reservation by GROWTH_TOKENS (or what the call needs, if more) if
        it must; False: no room, it waits."""
        per_token = self.pool.bytes_per_token
        short = (generation.holder.kv_len + positions) * per_token - generation.reserved
        if short <= 0:
            return True
        more = min(max(GROWTH_TOKENS * per_token, short), generation.need - generation.reserved)
        if more <= 0:
            return True  # its whole length is reserved (the slot is MAX_LENGTH long anyway)
        if not self.memory.grow(generation.booking, more):
            generation.wait_for_room(self.memory)
            return False
        generation.reserved += more
        generation.room_found()
        self.cache.shrink(self.cache.limit())  # kept conversations move down to make room
        return True

    def _calls(
        self, decoding: list[BatchGeneration], start: int
    ) -> list[tuple[int, list[BatchGeneration]]]:
        """The decode calls over adjacent slots from `start`: runs whose rows each feed one
        token, DECODE_BATCH_ROWS rows at most; a row that reads a run of forced tokens at once
        (a guided reply decoding alone, _fed) has a call of its own, the run read as a prompt
        is."""
        calls: list[tuple[int, list[BatchGeneration]]] = []
        run: list[BatchGeneration] = []
        for slot, generation in enumerate(decoding, start):
            if self._fed(generation) > 1:
                if run:
                    calls.append((slot - len(run), run))
                    run = []
                calls.append((slot, [generation]))
                continue
            run.append(generation)
            if len(run) == self.rows:
                calls.append((slot + 1 - len(run), run))
                run = []
        if run:
            calls.append((start + len(decoding) - len(run), run))
        return calls

    def chunk_for(self, generation: BatchGeneration) -> int:
        """The prompt tokens `generation` reads in its next call: PREFILL_CHUNK while any
        other reply runs or waits for its turn (its stall is one chunk), ALONE_CHUNK when it
        is all the batch has to do (each call has a fixed cost: three calls of 64 for a
        130-token prompt took 7 to 13% more CPU time than one). PROMPT_CACHE_EXACT keeps
        PREFILL_CHUNK: replies then never depend on what else ran."""
        alone = not self.decoding and not self.ready and len(self.prefilling) == 1
        return self.alone_chunk() if alone and generation in self.prefilling else self.chunk

    def alone_chunk(self) -> int:
        return self.chunk if self.cache.exact else max(self.chunk, ALONE_CHUNK)

    def next_prompt(self) -> BatchGeneration:
        """The prompt whose chunk this step reads: the one with the fewest tokens left to
        read, less a chunk for every step it was passed over (ties: the one that came first).
        Prompts that arrive together then get their first tokens one after another, not all
        after the last chunk of all of them (taking turns a chunk each did that: four 130-token
        prompts all waited about four prefills), a short prompt passes a long one, and a long
        one is passed at most about its own number of chunks."""
        chosen = min(self.prefilling, key=lambda g: g.prompt_left - g.passed_over * self.chunk)
        for generation in self.prefilling:
            if generation is not chosen:
                generation.passed_over += 1
        return chosen

    def step_one(self, generation: BatchGeneration) -> str | None:
        """Step one generation alone (a batch of one row): for an engine wrapper (the tests'
        fault injection) that steps its generations one by one. Raises what the model
        raises."""
        if generation in self.prefilling:
            self._prefill(generation)
            return None
        if generation in self.ready:
            return self._first_token(generation)
        generation.draft = []  # drafts are step()'s (_propose)
        if not self._may_write(generation, self._fed(generation)):
            return None  # it waits for room to grow (kv/bound.py)
        index = self.decoding.index(generation)
        return self._decode(index, [generation])[0]

    def _prefill(self, generation: BatchGeneration) -> None:
        """Read a chunk; after the last one the reply's first token waits for the next step
        (as on the Generator path: a step reads a chunk or makes a token)."""
        generation.prefill_chunk()
        if not generation.prefilling:
            self.prefilling.remove(generation)
            self.ready.append(generation)

    def _first_token(self, generation: BatchGeneration) -> str:
        self.ready.remove(generation)  # first: a failure must not leave it there
        text = generation.first_token()
        if generation.finish is None:
            self._swap(generation.holder.index, len(self.decoding))
            self.decoding.append(generation)
        return text

    def _decode(self, first: int, group: list[BatchGeneration]) -> list[str | None]:
        """One decode call for the generations in slots first..first+len(group)-1; raises
        what the model or a row raises (step_one)."""
        fed, logits = self._run(first, group)
        return [self._settle(g, fed, row) for g, row in zip(group, logits, strict=True)]

    def _decode_isolated(self, first: int, group: list[BatchGeneration]) -> list[str | None]:
        """_decode, where a failure ends only the reply it belongs to. A failed model call is
        run again one row at a time (each writes the same KV position again), so only a row
        that fails alone ends; a row whose token cannot be taken ends, the others keep
        theirs."""
        try:
            fed, logits = self._run(first, group)
        except Exception as exc:
            if len(group) == 1:
                self._failed(group[0], exc)
                return [None]
            return [
                self._decode_isolated(first + i, [generation])[0]
                for i, generation in enumerate(group)
            ]
        texts: list[str | None] = []
        for generation, row in zip(group, logits, strict=True):
            try:
                texts.append(self._settle(generation, fed, row))
            except Exception as exc:
                self._failed(generation, exc)
                texts.append(None)
        return texts

    @staticmethod
    def _settle(generation: BatchGeneration, fed: int, logits: np.ndarray) -> str | None:
        """A row's tokens from its call: a draft's agreeing run and the model's own token
        (`logits`: each position's), else the token after what it fed (None while a forced
        run is still being read)."""
        if generation.draft:
            return generation.take_run(logits)
        generation.wrote(fed)
        if generation.lookup is not None:
            generation.lookup.settle(0, 0)  # a call without a draft
        return None if generation.pending else generation.take(logits)

    def _run(self, first: int, group: list[BatchGeneration]) -> tuple[int, np.ndarray]:
        """The model call: the tokens each generation holds past its KV (its last token; a
        row alone: its forced run too, or its draft after it), at its own length; how many
        each fed, and the logits of each row's last one (a draft's row: of each position)."""
        fed = self._fed(group[0]) if len(group) == 1 else 1
        ids = np.array(
            [g.holder.tokens[g.holder.kv_len : g.holder.kv_len + fed] + g.draft for g in group],
            dtype=np.int64,
        )
        drafted = any(g.draft for g in group)  # one row: _propose
        logits = self.decoder.run(first, ids, [g.holder.kv_len for g in group], every=drafted)
        return fed, logits

    @staticmethod
    def _failed(generation: BatchGeneration, exc: Exception) -> None:
        """End one reply with finish "error"; the worker logs `fault` (its type only, unless
        LOG_PROMPTS: a message may quote the prompt, the grammar or the reply)."""
        generation.finish = "error"
        generation.fault = exc


# Prompt tokens read per call by a prompt that is all the batch has to do (chunk_for): a 1,000-
# token prompt in two calls, where PREFILL_CHUNK would take 16.
ALONE_CHUNK = 512


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive indices, as (first, past the last)."""
    runs: list[tuple[int, int]] = []
    for index in indices:
        if runs and runs[-1][1] == index:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    return runs
