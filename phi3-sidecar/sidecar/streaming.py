"""The reply stream: 200 text/plain, each chunk the text of one or more new tokens.

Pieces are sent as soon as they arrive (several at once when the client reads slower than the
model writes). The client's disconnect is watched the whole time: it cancels the generation
in the worker. An error after the first byte ends the stream without its final chunk, so the
client sees an incomplete response rather than a normal end; no error text is sent.
"""

from __future__ import annotations

import asyncio
import time

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sidecar import ipc
from sidecar.logs import RequestRecord
from sidecar.worker_client import Reply, WorkerClient


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class ReplyResponse(Response):
    media_type = "text/plain"

    def __init__(
        self,
        reply: Reply,
        worker: WorkerClient,
        record: RequestRecord,
        started: ipc.Started,
        *,
        keep_text: bool = False,
    ) -> None:
        self.status_code = 200
        self.background = None
        self._reply = reply
        self._worker = worker
        self._record = record
        self._text: list[str] | None = [] if keep_text else None
        self.init_headers(
            {
                "cache-control": "no-store",
                "x-accel-buffering": "no",  # proxies: do not buffer the stream
                "x-prompt-tokens": str(started.prompt_tokens),
                "x-dropped-messages": str(started.dropped_messages),
            }
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        pump = asyncio.create_task(self._pump(send))
        gone = asyncio.create_task(wait_for_disconnect(receive))
        try:
            await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
            if pump.done():
                end = pump.result()
                outcome: str = end.finish
            else:
                self._worker.cancel(self._reply.key)
                end = await self._reply.end
                outcome = "cancelled"  # even if the model had finished: the client did not get it
        except asyncio.CancelledError:
            # The server is stopping and its grace period is over: stop the generation and end
            # the stream as incomplete (returning quietly: a re-raise only adds a traceback).
            self._worker.cancel(self._reply.key)
            self._record.outcome = "cancelled"
            return
        finally:
            gone.cancel()
            pump.cancel()
        self._finish(end, outcome)
        if end.finish != "error":
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        # else: return without the final chunk; the server closes the connection.

    async def _pump(self, send: Send) -> ipc.End:
        pieces = self._reply.pieces
        while True:
            batch = [await pieces.get()]
            while not pieces.empty() and not isinstance(batch[-1], ipc.End):
                batch.append(pieces.get_nowait())
            text = "".join(m.text for m in batch if isinstance(m, ipc.Piece))
            if text:
                if self._record.ttft_ms is None:
                    elapsed = time.monotonic() - self._record.started_at
                    self._record.ttft_ms = round(elapsed * 1000, 1)
                if self._text is not None:
                    self._text.append(text)
                await send({"type": "http.response.body", "body": text.encode(), "more_body": True})
            if isinstance(batch[-1], ipc.End):
                return batch[-1]

    def _finish(self, end: ipc.End, outcome: str) -> None:
        record = self._record
        record.outcome = outcome
        record.generated_tokens = end.generated_tokens
        if end.tokens_per_s is not None:
            record.tokens_per_s = round(end.tokens_per_s, 1)
        record.tokens_after_disconnect = end.tokens_after_cancel
        if self._text is not None:
            record.reply = "".join(self._text)
