"""The model worker process: loads the model, then runs generations one bounded step at a time.

Why a process: every onnxruntime-genai Generator call holds the GIL for its whole duration (a
prefill chunk can take seconds on a CPU, a Phi-3-mini decode step a tenth of one: see
docs/benchmarks/decode-step.md). In the web process that would freeze the event loop, so
/healthz and every other stream would stall. A thread
cannot avoid it, and smaller prefill chunks would only shorten the stalls. In a separate process
the model can hold its own GIL as long as it likes; the web process only relays small messages.

Scheduling: up to MAX_CONCURRENCY generations are active (the web process admits no more);
they take turns, one step each, and pending messages (new requests, cancellations) are read
between any two steps. A step is bounded: while a generation's prompt is being read it appends
one chunk of PREFILL_CHUNK tokens (no token comes out of it), then it generates one token. So a
cancellation stops a reply within one token, or within one chunk during a prefill (a prefill
of a long conversation is minutes of Phi-3-mini on a CPU: it would otherwise run to its end for
nobody), and a long prompt arriving does not freeze the replies already streaming: they get a
token between its chunks. Prefill steps are not tokens: they are not counted as generated, nor
as made after a disconnect.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing import connection
from multiprocessing.connection import Connection
from typing import Protocol

from sidecar import ipc
from sidecar.jsonlog import configure_logging
from sidecar.model.batch.setup import passage_reuse
from sidecar.model.download import download_if_needed
from sidecar.model.folder import ModelFolderError, first_line
from sidecar.model.kv.tiers import NoRoom, Restored
from sidecar.model.memory import return_freed_memory
from sidecar.model.prompt.builder import Prompt, PromptTooLong
from sidecar.model.prompt.process import Built, Job, PromptProcess, PromptSpec
from sidecar.model.refusals import rejection
from sidecar.settings import Settings

log = logging.getLogger("sidecar.model.worker")


class Stepper(Protocol):
    """What the scheduler needs of a generation (generator.generation.Generation; tests wrap it)."""

    prompt: Prompt
    generated: int
    cached_tokens: int
    cache_reason: str  # the conversation cache's lease.reason (kv.prompt_cache.REASONS)
    restored: Restored  # where the reused tokens came from (kv/tiers.py) and what it cost
    finish: ipc.Finish | None
    # What ended it with finish "error" inside a step that went on for the others (the batched
    # path isolates each row, batch/step.py); None otherwise.
    fault: Exception | None

    def step(self) -> str | None:
        """Append the next chunk of the prompt and return None while the prompt is not all
        appended; then generate one token and return its new text ('' while incomplete)."""
        ...

    def tokens_per_s(self) -> float | None: ...

    def drafts(self) -> ipc.Drafts | None: ...

    def take_logprobs(self) -> tuple[ipc.TokenLogprob, ...]:
        """The log probabilities of the tokens whose text is now shown (model/logprobs.py);
        () without Generate.logprobs."""
        ...

    def release(self, reusable: bool) -> None:
        """The request is over: keep its generator in the conversation cache, or drop it."""
        ...


class Batch(Protocol):
    """What the scheduler needs of the batched path (batch.scheduler.BatchScheduler)."""

    @property
    def busy(self) -> bool: ...

    def step(self) -> Sequence[tuple[Stepper, str | None]]:
        """One prompt chunk and one decode call for all batched generations: each one
        touched, with its text (None: a chunk was read, no token yet)."""
        ...


class Backend(Protocol):
    """What the scheduler needs of a model (engine.Engine; tests wrap it)."""

    max_length: int
    image_input: bool  # whether requests may carry images (a vision model)

    def start(self, request: ipc.Generate, *, prompt: Prompt | None = None) -> Stepper:
        """`prompt`: built by the prompt process; None: the engine builds it."""
        ...

    def warm_up(self) -> None: ...

    def cache_stats(self) -> ipc.CacheStats: ...


@dataclass
class _Pending:
    """A request not started yet: its prompt (once built elsewhere), what building it cost,
    and since when it waits for KV memory."""

    request: ipc.Generate
    prompt: Prompt | None = None
    prepare_s: float = 0.0
    waiting_since: float | None = None


@dataclass
class _Reading:
    """A long prompt being read (ipc.Reading): its tokens to read, those read when last
    reported, when its reading started and when it was last reported."""

    total: int
    started_at: float
    read: int = 0
    at: float = 0.0


@dataclass
class _Job:
    request_id: str
    generation: Stepper
    deadline: float | None = None  # ipc.Generate.deadline
    reading: _Reading | None = None  # reported as it is read (ipc.READING_REPORT_TOKENS)
    # When recent tokens were finished (prefill steps are not tokens), to count those made
    # after a disconnect was noticed.
    finished_at: deque[float] = field(default_factory=lambda: deque(maxlen=8))
    reserved: int = 0  # its KV reservation when last reported (the batched path grows it)


def main(settings: Settings, inbox: Connection, outbox: Connection) -> None:
    """Entry point of the worker process (multiprocessing, spawn)."""
    # The web process decides when this process ends: it sends Stop, or kills it, and if the
    # web process dies the pipes close and this process exits at its next step. A SIGTERM or
    # Ctrl+C for the service's process group must not end replies before the web process's
    # graceful shutdown does, so this process leaves that group.
    os.setpgid(0, 0)
    # Freed KV blocks go back to the system: the KV bound is about resident memory (memory.py)
    return_freed_memory()
    configure_logging(settings.log_level, exception_messages=settings.log_prompts)
    prompts: PromptProcess | None = None
    try:
        engine = _load(settings, outbox)
        if engine is None:
            return
        spec: PromptSpec | None = getattr(engine, "prompt_spec", lambda: None)()
        prompts = PromptProcess(spec) if spec is not None else None
        if prompts is not None:
            try:  # now: it loads its tokenizer before the first request comes
                prompts.start()
            except OSError as exc:  # the first request tries again (_build)
                fields = {"error_type": type(exc).__name__}
                log.error("the prompt process cannot start", extra={"fields": fields})
        Scheduler(engine, inbox, outbox, log_prompts=settings.log_prompts, prompts=prompts).run()
    except (EOFError, OSError):
        pass  # the web process is gone: so is the reason to run
    finally:
        if prompts is not None:
            prompts.close()


def _load(settings: Settings, outbox: Connection) -> Backend | None:
    try:
        if settings.model_download:
            outbox.send(ipc.Phase("downloading"))
            folder = download_if_needed(settings)
            settings = settings.model_copy(update={"model_path": folder})
        outbox.send(ipc.Phase("loading"))
        engine: Backend = ipc.resolve(settings.engine_factory)(settings)
        outbox.send(ipc.Phase("warming_up"))
        engine.warm_up()
    except ModelFolderError as exc:
        outbox.send(ipc.Phase("failed", str(exc)))
        return None
    except Exception as exc:
        reason = f"loading the model failed: {type(exc).__name__}: {first_line(exc)}"
        outbox.send(ipc.Phase("failed", reason))
        return None
    ready = ipc.Phase(
        "ready",
        context_length=engine.max_length,
        image_input=engine.image_input,
        passage_reuse=passage_reuse(getattr(engine, "batch", None)),  # a wrapper may hide it
    )
    outbox.send(ready)
    outbox.send(engine.cache_stats())  # the KV bound chosen, before any request
    return engine


class Scheduler:
    def __init__(
        self,
        engine: Backend,
        inbox: Connection,
        outbox: Connection,
        *,
        log_prompts: bool = False,
        prompts: PromptProcess | None = None,
    ) -> None:
        self._engine = engine
        # Where text prompts are built, off the step loop (prompt/process.py); None: here
        self._prompts = prompts
        self._building: dict[int, ipc.Generate] = {}  # handed to it, not answered yet
        self._inbox = inbox
        self._outbox = outbox
        # An exception's message may quote the prompt, the schema or the reply (a tokenizer's
        # "Invoked with: '<the whole prompt>'", llguidance's last tokens): logged only then.
        self._log_prompts = log_prompts
        self._jobs: dict[int, _Job] = {}
        # Requests whose KV does not fit beside the running replies (kv.tiers.NoRoom), in
        # arrival order: retried when a reply ends (its reservation is free again).
        self._waiting: deque[_Pending] = deque()
        self._retry = False
        self._stopping = False
        self._books_changed = False  # a running reply's KV reservation grew (kv/bound.py)
        self._tidied = False  # idle work was done since the gauges were last sent
        # Tokens a second the last long prompt was read at: the estimate for a new prompt's
        # first call, before it has a rate of its own (ipc.Reading.rate)
        self._reading_rate: float | None = None

    def run(self) -> None:
        """Until Stop; EOFError/OSError when the web process is gone."""
        batch: Batch | None = getattr(self._engine, "batch", None)
        while not self._stopping:
            self._read(block=not self._jobs and not self._tidy())
            if batch is not None and batch.busy:
                self._end_expired()
                # One model call for every batched reply (batch/scheduler.py).
                keys = {id(job.generation): key for key, job in self._jobs.items()}
                for generation, text in batch.step():
                    key = keys.get(id(generation))
                    if key is not None and key in self._jobs:
                        self._after(key, self._jobs[key], text)
                self._read(block=False)
            if self._retry:
                self._start_waiting()
            for key in list(self._jobs):
                job = self._jobs.get(key)  # a cancellation may have removed it meanwhile
                if job is None:
                    continue
                # An engine wrapper that hides the batch (tests/support/engines.py) steps
                # its batched generations one by one.
                if not (batch is not None and getattr(job.generation, "batched", False)):
                    self._step(key, job)
                    self._read(block=False)
            if self._books_changed:  # a reservation grew: the gauges follow the books
                self._books_changed = False
                self._outbox.send(self._engine.cache_stats())

    def _tidy(self) -> bool:
        """With no reply to run and nothing in the pipe, one small piece of the batched path's
        idle work (BatchScheduler.tidy: room for a new chat, kv/idle.py); False when it had
        none (the worker then blocks on its pipe)."""
        tidy = getattr(getattr(self._engine, "batch", None), "tidy", None)
        if tidy is None or self._jobs or self._waiting or self._inbox.poll():
            return False
        worked = bool(tidy())
        if worked:
            self._tidied = True
        elif self._tidied:  # the idle work is done: the gauges follow (the passage store's)
            self._tidied = False
            self._outbox.send(self._engine.cache_stats())
        return worked

    def _read(self, *, block: bool) -> None:
        if block:
            answers = self._prompts.conn if self._prompts and self._building else None
            connection.wait([self._inbox] if answers is None else [self._inbox, answers])
        while not self._stopping and self._inbox.poll():
            self._handle(self._inbox.recv())
        if self._prompts is not None and self._building:
            for built in self._prompts.answers():
                self._built(built)

    def _handle(self, message: ipc.ToWorker) -> None:
        if isinstance(message, ipc.Generate):
            if self._prompts is not None and _built_elsewhere(message):
                self._build(message, self._prompts)
            else:
                self._handle_here(message)
        elif isinstance(message, ipc.Ping):
            self._outbox.send(ipc.Pong())
        elif isinstance(message, ipc.Cancel):
            job = self._jobs.pop(message.key, None)
            if job is not None:
                after = sum(1 for t in job.finished_at if t > message.noticed_at)
                self._end(message.key, job, "cancelled", tokens_after_cancel=after)
            for waiting in [p for p in self._waiting if p.request.key == message.key]:
                self._waiting.remove(waiting)
                self._outbox.send(ipc.End(message.key, "cancelled", 0, None))
            if self._building.pop(message.key, None) is not None:
                assert self._prompts is not None
                self._prompts.forget(message.key)
                self._outbox.send(ipc.End(message.key, "cancelled", 0, None))
        else:
            self._stopping = True

    def _handle_here(self, request: ipc.Generate) -> None:
        """Start a request whose prompt the engine builds (in this process)."""
        if request.warm:
            self._warm(request, None)
        elif self._waiting:  # first come, first served
            self._waiting.append(_Pending(request))
        else:
            self._start(_Pending(request))

    def _build(self, request: ipc.Generate, prompts: PromptProcess) -> None:
        """Refuse a prompt the byte bound rules out; hand the others to the prompt process."""
        try:
            prompts.rule_out(request)
        except PromptTooLong as exc:
            self._refuse(request, exc)
            return
        try:
            prompts.submit(Job(request, prompts.max_length))
        except OSError as exc:  # no prompt process could start: the prompt is built here
            self._log_failure("the prompt process cannot start", request.request_id, exc)
            self._handle_here(request)
            return
        self._building[request.key] = request

    def _built(self, built: Built) -> None:
        request = self._building.pop(built.key, None)
        if request is None:
            return  # cancelled meanwhile
        if built.refusal is not None:
            self._refuse(request, built.refusal, built.seconds)
            return
        if request.warm:
            self._warm(request, built.prompt)
            return
        pending = _Pending(request, built.prompt, built.seconds)
        if self._waiting:  # first come, first served
            self._waiting.append(pending)
        else:
            self._start(pending)

    def _warm(self, request: ipc.Generate, prompt: Prompt | None) -> None:
        """Note a warm request's passages to be read while idle (ipc.Generate.warm): no
        reply, no slot, no wait; the idle work reads them when nothing else waits."""
        warm = getattr(self._engine, "warm_passages", None)
        try:
            tokens, reason = warm(request, prompt) if warm else (0, "the passage store is off")
        except Exception as exc:
            self._refuse(request, exc)
            return
        self._outbox.send(ipc.Warmed(request.key, tokens, reason))
        self._outbox.send(self._engine.cache_stats())

    def _start_waiting(self) -> None:
        """Start the waiting requests that fit now, in order; refuse those past their
        deadline (they waited for KV memory as long as a reply may take)."""
        self._retry = False
        now = time.monotonic()
        while self._waiting:
            pending = self._waiting[0]
            request = pending.request
            if request.deadline is not None and now >= request.deadline:
                self._waiting.popleft()
                message = "the model's KV memory stayed full while this request waited"
                self._outbox.send(ipc.Rejected(request.key, "overloaded", message))
                continue
            if not self._start(pending, waiting=True):
                return
            self._waiting.popleft()

    def _start(self, pending: _Pending, *, waiting: bool = False) -> bool:
        """Start a request, or refuse it; False if it must wait for KV memory (queued)."""
        request = pending.request
        began = time.perf_counter()
        try:
            if pending.prompt is None:
                generation = self._engine.start(request)
            else:
                generation = self._engine.start(request, prompt=pending.prompt)
        except NoRoom:
            if not waiting:
                pending.waiting_since = time.monotonic()
                self._waiting.append(pending)
                log.info(
                    "request waits for KV memory",
                    extra={"fields": {"request_id": request.request_id}},
                )
                self._outbox.send(self._engine.cache_stats())  # kv_waits
            return False
        except Exception as exc:
            self._refuse(request, exc, pending.prepare_s + time.perf_counter() - began)
            return True
        reserved = getattr(generation, "reserved", 0)
        self._jobs[request.key] = _Job(
            request.request_id, generation, request.deadline, reserved=reserved
        )
        prompt = generation.prompt
        built_here = pending.prompt is None
        waited = pending.waiting_since
        self._outbox.send(
            ipc.Started(
                request.key,
                len(prompt.ids),
                prompt.dropped_messages,
                prompt.max_new_tokens,
                generation.cached_tokens,
                generation.cache_reason,
                generation.restored.tier,
                generation.restored.seconds,
                image_tokens=prompt.image_tokens,
                tokenized_chars=prompt.encoded_chars,
                prepare_s=time.perf_counter() - began if built_here else pending.prepare_s,
                kv_wait_s=time.monotonic() - waited if waited is not None else 0.0,
                room_s=getattr(generation, "room_s", 0.0),
                room_moves=getattr(generation, "room_moves", (0, 0)),
                passage_cached_tokens=getattr(generation, "passage_cached_tokens", 0),
            )
        )
        # The gauges follow the books: the reservation it made is in them from now on, not
        # only after the next reply ends (sidecar_kv_reserved_bytes read 0 while a reply held
        # 3 GB of the bound)
        self._outbox.send(self._engine.cache_stats())
        left = getattr(generation, "prompt_left", 0)  # an engine wrapper may not say
        if left >= ipc.READING_REPORT_TOKENS:
            job = self._jobs[request.key]
            job.reading = _Reading(left, time.monotonic())
            self._report_reading(request.key, job)
        return True

    def _report_reading(self, key: int, job: _Job) -> None:
        """Tell the web process how far a long prompt's reading is (ipc.Reading): when it
        starts, then after each of its calls, the last one when all of it is read."""
        reading = job.reading
        assert reading is not None
        left = getattr(job.generation, "prompt_left", 0)
        read = reading.total - left
        if reading.at and read == reading.read:
            return  # another reply's step: nothing new of this one
        now = time.monotonic()
        if read > 0:  # its own rate, over all of its reading so far
            self._reading_rate = read / max(now - reading.started_at, 1e-6)
        reading.read, reading.at = read, now
        call = self._call_tokens(job.generation, left, read)
        self._outbox.send(ipc.Reading(key, read, reading.total, call, self._reading_rate, now))
        if not left:
            job.reading = None

    def _call_tokens(self, generation: Stepper, left: int, read: int) -> int:
        """The prompt tokens the generation's next call reads: the batch's chunk for it
        (BatchStep.chunk_for), the Generator path's (Generation.reading_chunk), or what an
        engine wrapper that hides the batch says (tests); else as many as its last call read,
        or all that is left."""
        batch = getattr(self._engine, "batch", None)
        if getattr(generation, "batched", False) and hasattr(batch, "chunk_for"):
            chunk = batch.chunk_for(generation)  # type: ignore[union-attr]
        elif hasattr(generation, "reading_chunk"):
            chunk = generation.reading_chunk()
        elif hasattr(self._engine, "reading_chunk"):
            chunk = self._engine.reading_chunk(generation)
        else:
            return min(read, left) if read else left
        return min(int(chunk), left)

    def _refuse(self, request: ipc.Generate, exc: Exception, spent_s: float = 0.0) -> None:
        """Answer Rejected for what building or starting a request raised; `spent_s`: the
        time spent on it until then."""
        rejected = rejection(request, exc)
        if rejected is None:
            self._log_failure("starting a generation failed", request.request_id, exc)
            rejected = ipc.Rejected(request.key, "start_failed", "the model failed to start")
        self._outbox.send(dataclasses.replace(rejected, spent_s=spent_s))

    def _end_expired(self) -> None:
        """End the batched replies past their deadline (_step checks the others)."""
        now = time.monotonic()
        for key, job in list(self._jobs.items()):
            expired = job.deadline is not None and now >= job.deadline
            if expired and getattr(job.generation, "batched", False):
                del self._jobs[key]
                self._end(key, job, "time_limit")

    def _step(self, key: int, job: _Job) -> None:
        if job.deadline is not None and time.monotonic() >= job.deadline:
            # Checked between steps: the reply ends within one token (or one prompt chunk) of
            # its deadline, as a normal end (the web process sends its final chunk).
            del self._jobs[key]
            self._end(key, job, "time_limit")
            return
        try:
            text = job.generation.step()
        except Exception as exc:
            del self._jobs[key]
            self._end(key, job, "error", fault=exc)
            return
        self._after(key, job, text)

    def _log_failure(self, message: str, request_id: str, exc: BaseException) -> None:
        """One line: the request id and the exception's type; its message only with
        LOG_PROMPTS."""
        fields = {"request_id": request_id, "error_type": type(exc).__name__}
        if self._log_prompts:
            fields["error"] = str(exc)
        log.error(message, extra={"fields": fields})

    def _after(self, key: int, job: _Job, text: str | None) -> None:
        """Send what a step made, and end the job if its reply is over."""
        reserved = getattr(job.generation, "reserved", 0)
        if reserved != job.reserved:
            job.reserved, self._books_changed = reserved, True
        if job.reading is not None:
            self._report_reading(key, job)
        if text is not None:  # None: a chunk of the prompt was appended, no token yet
            now = time.monotonic()
            job.finished_at.append(now)
            logprobs = job.generation.take_logprobs()
            if text or logprobs:
                generated = job.generation.generated
                self._outbox.send(ipc.Piece(key, text, generated, now, logprobs))
        if job.generation.finish is not None:
            del self._jobs[key]
            fault = job.generation.fault if job.generation.finish == "error" else None
            self._end(key, job, job.generation.finish, fault=fault)

    def _end(
        self,
        key: int,
        job: _Job,
        finish: ipc.Finish,
        tokens_after_cancel: int | None = None,
        *,
        fault: Exception | None = None,
    ) -> None:
        """Release the generation and report its end; a fault (an exception of its own step)
        is logged here, once, and its type goes with End (sidecar_reply_faults)."""
        generation = job.generation
        self._retry = bool(self._waiting)  # its KV reservation is free again
        if fault is not None:
            self._log_failure("generation failed", job.request_id, fault)
        # A cancelled reply's tokens stay cached (the next turn resends what the user saw);
        # a failed generation's state is not trusted.
        generation.release(reusable=finish != "error")
        self._outbox.send(
            ipc.End(
                key,
                finish,
                generation.generated,
                generation.tokens_per_s(),
                tokens_after_cancel,
                generation.drafts(),
                type(fault).__name__ if fault is not None else None,
                kv_paused_s=getattr(generation, "kv_paused_s", 0.0),
            )
        )
        self._outbox.send(self._engine.cache_stats())


def _built_elsewhere(request: ipc.Generate) -> bool:
    """Whether the prompt process builds this request's prompt: text to tokenize (not images,
    which need the model's image processor, and not token ids, which need no tokenizer)."""
    return not request.images and (request.prompt is None or isinstance(request.prompt, str))
