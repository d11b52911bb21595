"""The reply of a generation that the worker has started: its text, as it comes.

The 200 goes out at once, then pieces are sent as soon as they arrive (several at once when the
client reads slower than the model writes). The client's disconnect is watched the whole time:
it cancels the generation in the worker. An error after the first byte ends the stream without
its final chunk, so the client sees an incomplete response rather than a normal end; no error
text is sent.

How the text is written is a ReplyFormat: /predict's plain text (predict/api.py), or the
OpenAI formats (chat_completions/api.py): server-sent events, or one JSON body sent when the reply
is complete (`buffered`: nothing goes out before the end, so a failed generation gets an error
status instead, and a client that left gets nothing; the disconnect is watched all the same).
A format may refuse a reply that ended normally (a structured reply that fails its final
check, structured/reply_check.py): an error status when buffered, else its `refused` ending.

A format with a `keepalive` (the server-sent events) writes it whenever the stream has been
silent for STREAM_KEEPALIVE_S (`Outbox`): clients that read with a timeout see a byte while a
long prompt is read. One whose reply has not even started in time is answered by
`early_start.EarlyStart`, which hands its `Outbox` to this response once the reply starts.
A format that `shows_progress` writes how far a long prompt's reading is (progress.py) at each
of the worker's reports and every PROGRESS_INTERVAL_S between them, until the first token.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sidecar import ipc
from sidecar.web.errors import ApiError, not_ready
from sidecar.web.generation.model_client import ModelClient, Reply
from sidecar.web.generation.progress import ProgressEvent, ReadingProgress
from sidecar.web.observability.record import RequestRecord


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class ReplyFormat:
    """How a reply is written: PlainText (predict/api.py), EventStream and Completion
    (chat_completions/api.py). The defaults send nothing around the pieces."""

    media_type: str
    buffered = False  # True: nothing is sent before the end; tail() is then the whole body
    shows_progress = False  # True: progress() writes a long prompt's reading (progress.py)
    model_id: str | None = None  # with MODELS_FILE, the model answering (the pipeline sets it)

    def head(self) -> bytes:
        """Sent right after the headers."""
        return b""

    def keepalive(self) -> bytes:
        """Sent after STREAM_KEEPALIVE_S of silence; b"": nothing (the format has no room for
        it, or is buffered)."""
        return b""

    def piece(self, text: str) -> bytes:
        """Sent for each piece of text as it comes ('' sends nothing)."""
        raise NotImplementedError

    def progress(self, event: ProgressEvent) -> bytes:
        """Sent while a long prompt is read, before the first piece (shows_progress)."""
        return b""

    def loading(self, event: dict[str, Any]) -> bytes:
        """Sent while the model asked for loads (web/models/pool.py `loading`), in place of
        a keepalive; b"": the keepalive (the format has no room for it)."""
        return b""

    def logprobs(self, entries: list[ipc.TokenLogprob]) -> None:
        """The log probabilities of the tokens of the next piece (Generate.logprobs), given
        before it; a format that writes them holds them until it writes text or its tail."""

    def tail(self, end: ipc.End, started: ipc.Started) -> bytes:
        """Sent last, when the generation ended normally (eos, stop or length)."""
        return b""

    def failure(self) -> bytes:
        """Sent last when the generation failed after the first byte; b"": end the stream
        without its final chunk instead, so that the client sees it cut off."""
        return b""

    def refusal(self, end: ipc.End) -> ApiError | None:
        """Why a reply that ended normally is not to be delivered as such; None: it is."""
        return None

    def refused(self, error: ApiError) -> bytes:
        """Sent last, instead of the tail, when `refusal` refused the reply after the first
        byte; b"": end the stream without its final chunk."""
        return b""


class Outbox:
    """A streamed body as it is written: what was sent last, and a keepalive after each
    `keepalive_s` of silence while the response waits (none if `keepalive` is b"")."""

    def __init__(
        self, send: Send, keepalive: bytes | Callable[[], bytes], keepalive_s: float
    ) -> None:
        self._send = send
        # A callable: what to say is chosen when it is said (a model loading, else the keepalive)
        self._keepalive = keepalive
        self._keepalive_s = keepalive_s
        self._last = time.monotonic()

    async def write(self, body: bytes, *, more: bool = True) -> None:
        await self._send({"type": "http.response.body", "body": body, "more_body": more})
        self._last = time.monotonic()

    async def wait(self, *futures: asyncio.Future[Any], until: float | None = None) -> None:
        """Until one of `futures` is done (or `until`, a time.monotonic(), passed), writing the
        keepalive whenever the stream has been silent for `keepalive_s`."""
        while True:
            timeout = None
            if self._keepalive:
                timeout = max(0.0, self._last + self._keepalive_s - time.monotonic())
            if until is not None:
                left = max(0.0, until - time.monotonic())
                timeout = left if timeout is None else min(timeout, left)
            done, _ = await asyncio.wait(
                futures, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if done or (until is not None and time.monotonic() >= until):
                return
            await self.write(self._keepalive() if callable(self._keepalive) else self._keepalive)


class ReplyResponse(Response):
    def __init__(
        self,
        reply: Reply,
        model: ModelClient,
        record: RequestRecord,
        started: ipc.Started,
        reply_format: ReplyFormat,
        *,
        keep_text: bool = False,
        keepalive_s: float = 0.0,
        progress_s: float = 1.0,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.media_type = reply_format.media_type
        self._format = reply_format
        self._reply = reply
        self._model = model
        self._record = record
        self._started = started
        self._text: list[str] | None = [] if keep_text else None
        self._keepalive_s = keepalive_s
        self._progress = ReadingProgress(progress_s)  # PROGRESS_INTERVAL_S
        self.init_headers(
            {
                "cache-control": "no-store",
                "x-accel-buffering": "no",  # proxies: do not buffer the stream
                "x-prompt-tokens": str(started.prompt_tokens),
                "x-image-tokens": str(started.image_tokens),  # of those, standing for images
                "x-cached-tokens": str(started.cached_tokens),
                "x-passage-cached-tokens": str(started.passage_cached_tokens),
                "x-dropped-messages": str(started.dropped_messages),
            }
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outbox = Outbox(send, self._format.keepalive(), self._keepalive_s)
        if not self._format.buffered:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            if head := self._format.head():
                await outbox.write(head)
        await self.stream(scope, receive, send, outbox)

    async def stream(self, scope: Scope, receive: Receive, send: Send, outbox: Outbox) -> None:
        """The reply after the headers and the head (generation/early_start.py sent those
        itself)."""
        buffered = self._format.buffered
        pump = asyncio.create_task(self._pump(outbox))
        gone = asyncio.create_task(wait_for_disconnect(receive))
        try:
            await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
            # A connection the sidecar closed (its client stopped reading: guards/connections.py)
            # ends as cancelled, even if the pump got to the end into a closed connection.
            if pump.done() and self._record.closed is None:
                end = pump.result()
                outcome: str = end.finish
            else:
                self._model.cancel(self._reply.key)
                end = await self._reply.end
                outcome = "cancelled"  # even if the model had finished: the client did not get it
        except asyncio.CancelledError:
            # The server is stopping and its grace period is over: stop the generation and end
            # the stream as incomplete (returning quietly: a re-raise only adds a traceback).
            self._model.cancel(self._reply.key)
            self._record.outcome = "cancelled"
            if buffered:
                await self._error(not_ready("stopping", None), scope, receive, send)
            return
        finally:
            gone.cancel()
            pump.cancel()
        self._finish(end, outcome)
        refusal = None
        if outcome != "cancelled" and end.finish != "error":
            refusal = self._format.refusal(end)
        if refusal is not None:
            self._record.outcome = "error"
            self._record.error_type = refusal.kind
        if buffered:
            await self._send_whole(end, outcome, refusal, scope, receive, send)
        elif refusal is not None:
            if body := self._format.refused(refusal):  # else: cut off, as below
                await outbox.write(body, more=False)
        elif end.finish != "error":
            tail = self._format.tail(end, self._started) if outcome != "cancelled" else b""
            await outbox.write(tail, more=False)
        elif failure := self._format.failure():  # a format that can say so in its stream
            await outbox.write(failure, more=False)
        # else: return without the final chunk; the server closes the connection.

    async def _send_whole(
        self,
        end: ipc.End,
        outcome: str,
        refusal: ApiError | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        if outcome == "cancelled":
            return  # nobody is listening
        if refusal is not None:
            await self._error(refusal, scope, receive, send)
            return
        if end.finish == "error":  # logged by the worker (or the worker died): nothing was sent
            phase = self._model.phase
            if not phase.ready:
                error = not_ready(phase.name, phase.reason, phase.retry_after_s())
            else:
                error = ApiError("generation_failed", "the generation failed; see the log")
            await self._error(error, scope, receive, send)
            return
        body = self._format.tail(end, self._started)
        headers = [*self.raw_headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _error(self, error: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
        self._record.error_type = error.kind
        await error.response(scope["path"])(scope, receive, send)

    async def _pump(self, outbox: Outbox) -> ipc.End:
        pieces = self._reply.pieces
        while True:
            batch = [await self._next(outbox)]
            while not pieces.empty() and not isinstance(batch[-1], ipc.End):
                batch.append(pieces.get_nowait())
            readings = [m for m in batch if isinstance(m, ipc.Reading)]
            if readings and self._format.shows_progress and not self._progress.done:
                event = self._progress.report(readings[-1])
                await outbox.write(self._format.progress(event))
            text = "".join(m.text for m in batch if isinstance(m, ipc.Piece))
            if logprobs := [e for m in batch if isinstance(m, ipc.Piece) for e in m.logprobs]:
                self._format.logprobs(logprobs)
            # telemetry: when the worker made each piece of text (inter-token latency,
            # web/observability/metrics.py; a piece of log probabilities alone is no text)
            self._record.piece_times.extend(
                m.at for m in batch if isinstance(m, ipc.Piece) and m.text
            )
            if text:
                self._progress.done = True  # the first word: no more reading to show
                if self._record.ttft_ms is None:
                    elapsed = time.monotonic() - self._record.started_at
                    self._record.ttft_ms = round(elapsed * 1000, 1)
                if self._text is not None:
                    self._text.append(text)
                if body := self._format.piece(text):
                    await outbox.write(body)
            if isinstance(batch[-1], ipc.End):
                return batch[-1]

    async def _next(self, outbox: Outbox) -> ipc.Piece | ipc.Reading | ipc.End:
        """The next message of the reply, keeping the stream alive while there is none, and
        writing the reading's estimate whenever one is due."""
        pieces = self._reply.pieces
        if not pieces.empty():
            return pieces.get_nowait()
        getter = asyncio.ensure_future(pieces.get())
        progress = self._progress
        try:
            while True:
                await outbox.wait(getter, until=progress.due())
                if getter.done():
                    break
                if body := self._format.progress(progress.tick()):
                    await outbox.write(body)
        finally:
            getter.cancel()  # only if the pump itself is cancelled: no message is lost then
        return getter.result()

    def _finish(self, end: ipc.End, outcome: str) -> None:
        record = self._record
        record.outcome = outcome
        record.generated_tokens = end.generated_tokens
        if end.tokens_per_s is not None:
            record.tokens_per_s = round(end.tokens_per_s, 1)
        record.tokens_after_disconnect = end.tokens_after_cancel
        record.fault = end.fault
        if end.kv_paused_s:
            record.kv_paused_ms = round(end.kv_paused_s * 1000, 1)
        if end.drafts is not None:
            record.draft_tokens = end.drafts.checked
            record.accepted_draft_tokens = end.drafts.accepted
            record.decode_steps = end.drafts.steps
            if end.drafts.steps:
                record.tokens_per_step = round(end.generated_tokens / end.drafts.steps, 2)
        if self._text is not None:
            record.reply = "".join(self._text)
