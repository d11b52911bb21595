"""The web process's side of the model worker: start it, talk to it, heal it.

Two plain threads move messages so the event loop never blocks on a pipe: a writer sends what
the loop queues, a reader hands each worker message to the loop (call_soon_threadsafe), where
it goes to the reply it belongs to. If the worker dies, every reply in flight is aborted,
readiness turns 503 (phase `restarting`, with the reason), and a new worker is started (with
backoff).

A watchdog notices a worker that is alive but stuck (a hung call, a SIGSTOP): while the model
is ready it pings the worker every few seconds, and the worker answers between two steps (a
token, or a prompt chunk). A ping unanswered for WORKER_STALL_S means no step has finished for
that long: the replies in flight are failed visibly, the worker is killed and replaced. A
replacement worker that is still loading cannot answer pings; it is replaced in the same way
when it reports no progress (a phase) for WORKER_STALL_S plus twice the first worker's load
time. (The first worker has no such limit: a download may take long.)

While a worker is being replaced, `PhaseState.retry_after_s` says when a retry may succeed:
the back-off before the replacement starts plus the time the last load took.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import math
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from sidecar import ipc
from sidecar.settings import Settings
from sidecar.web.errors import RETRY_NOT_READY_S

log = logging.getLogger("sidecar.web.model_client")  # the name its log lines always had

STOP_GRACE_S = 5.0
RESTART_DELAYS_S = (1.0, 2.0, 5.0, 10.0, 30.0)
PING_INTERVAL_S = 2.0  # how often the watchdog asks a ready worker whether it still steps


@dataclass(frozen=True)
class PhaseState:
    name: ipc.PhaseName
    reason: str | None
    since: float
    max_length: int | None = None
    retry_at: float | None = None  # when a replacement should be ready (time.monotonic())
    image_input: bool = False  # the loaded model reads images (ipc.Phase, sent with "ready")
    passage_reuse: str = "off"  # the passage store (ipc.Phase, sent with "ready")

    def retry_after_s(self) -> int:
        """Seconds a client should wait before retrying (Retry-After)."""
        if self.retry_at is None:
            return RETRY_NOT_READY_S
        return max(1, math.ceil(self.retry_at - time.monotonic()))

    @property
    def ready(self) -> bool:
        return ipc.is_ready(self.name)


class Reply:
    """One request's view of its generation: how it started, its pieces, how it ended."""

    def __init__(self, key: int, images: int = 0, *, admitted: bool = True) -> None:
        loop = asyncio.get_running_loop()
        self.key = key
        # Whether it holds an admission place (its end gives it back): a warm request
        # (ipc.Generate.warm) takes none
        self.admitted = admitted
        # A vision model reads a prompt's images in the reply's first step, which may be far
        # longer than a token's (the watchdog allows WORKER_STALL_IMAGE_S more per image).
        self.images = images
        self.first_piece = False
        self.start: asyncio.Future[ipc.Started | ipc.Rejected | ipc.End | ipc.Warmed] = (
            loop.create_future()
        )
        self.end: asyncio.Future[ipc.End] = loop.create_future()
        self.pieces: asyncio.Queue[ipc.Piece | ipc.Reading | ipc.End] = asyncio.Queue()
        self.generated = 0  # as the last piece said

    def deliver(self, message: ipc.FromWorker) -> None:
        if isinstance(message, ipc.Started | ipc.Rejected | ipc.Warmed) and not self.start.done():
            self.start.set_result(message)
        elif isinstance(message, ipc.Reading):
            self.pieces.put_nowait(message)
        elif isinstance(message, ipc.Piece):
            self.first_piece = True
            self.generated = message.generated
            self.pieces.put_nowait(message)
        elif isinstance(message, ipc.End):
            if not self.start.done():
                self.start.set_result(message)
            self.pieces.put_nowait(message)
            if not self.end.done():
                self.end.set_result(message)


class ModelClient:
    """The model worker process, seen from the web process: submit, cancel, its phase."""

    def __init__(self, settings: Settings, on_generation_over: Callable[[], None]) -> None:
        self._settings = settings
        self._on_generation_over = on_generation_over  # called once per submitted request
        self.restarts = 0
        self.cache_stats = ipc.CacheStats()  # the worker's latest report; a new worker: empty
        self.phase = PhaseState("starting", None, time.monotonic())
        # Whether the model reads images, as the last worker to get ready said (None: none was
        # ready yet): /v1/models answers while a replacement loads.
        self.image_input: bool | None = None
        self._replies: dict[int, Reply] = {}
        self._keys = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._process: BaseProcess | None = None
        self._outbox: queue.SimpleQueue[ipc.ToWorker | None] = queue.SimpleQueue()
        self._epoch = 0
        self._crashes = 0
        self._stopping = False
        self._restart: asyncio.TimerHandle | None = None
        self._spawned_at = time.monotonic()
        self._watchdog: asyncio.Task[None] | None = None
        self._last_heard = time.monotonic()  # any message from the worker
        self._ping_sent: float | None = None  # an unanswered ping, if any
        self._stalled: str | None = None  # why the watchdog killed the current worker
        self._recovering: str | None = None  # why the worker is being replaced, until ready
        self._load_s: float | None = None  # how long the last worker took to become ready

    @property
    def busy(self) -> bool:
        """Whether any request is with the worker (or waits for its start there)."""
        return bool(self._replies)

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.is_alive() else None

    @property
    def load_s(self) -> float | None:
        """How long the last worker took to get ready (None: none was ready yet)."""
        return self._load_s

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the worker; returns at once (the model loads in the background)."""
        self._loop = asyncio.get_running_loop()
        self._spawn()
        self._watchdog = asyncio.create_task(self._watch(), name="model-watchdog")

    async def stop(self) -> None:
        self._stopping = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._restart is not None:
            self._restart.cancel()
        self._abort_all()
        self._outbox.put(ipc.Stop())
        self._outbox.put(None)
        process = self._process
        if process is not None:
            if self.phase.ready:  # let it finish the step it is in, then read Stop
                await asyncio.to_thread(process.join, STOP_GRACE_S)
            if process.is_alive():
                process.kill()
                await asyncio.to_thread(process.join, STOP_GRACE_S)

    def _spawn(self) -> None:
        self._restart = None
        self._epoch += 1
        self._spawned_at = time.monotonic()
        context = multiprocessing.get_context("spawn")
        to_worker_r, to_worker_w = context.Pipe(duplex=False)
        from_worker_r, from_worker_w = context.Pipe(duplex=False)
        process = context.Process(
            target=ipc.run,
            args=(ipc.WORKER_ENTRY, self._settings, to_worker_r, from_worker_w),
            name="model-worker",
            daemon=True,
        )
        process.start()
        to_worker_r.close()
        from_worker_w.close()
        self._process = process
        self._outbox = queue.SimpleQueue()
        self._ping_sent = None
        self._stalled = None
        self._last_heard = self._spawned_at  # the load watchdog counts from here
        self._set_phase(ipc.Phase("starting"))
        threading.Thread(
            target=self._write, args=(to_worker_w, self._outbox), name="worker-writer", daemon=True
        ).start()
        threading.Thread(
            target=self._read,
            args=(from_worker_r, process, self._epoch),
            name="worker-reader",
            daemon=True,
        ).start()

    # -- requests ---------------------------------------------------------------------------

    def submit(self, request: ipc.Generate) -> Reply:
        """Hand a request to the worker (an admitted one, or a warm one: ipc.Generate.warm)."""
        request = dataclasses.replace(request, key=next(self._keys))
        reply = Reply(request.key, len(request.images), admitted=not request.warm)
        self._replies[request.key] = reply
        self._outbox.put(request)
        return reply

    def cancel(self, key: int) -> None:
        if key in self._replies:
            self._outbox.put(ipc.Cancel(key, time.monotonic()))

    # -- threads ----------------------------------------------------------------------------

    @staticmethod
    def _write(conn: Connection, outbox: queue.SimpleQueue[ipc.ToWorker | None]) -> None:
        with conn:
            while (message := outbox.get()) is not None:
                try:
                    conn.send(message)
                except OSError:
                    return

    def _read(self, conn: Connection, process: BaseProcess, epoch: int) -> None:
        with conn:
            while True:
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    break
                self._call(self._dispatch, message)
        process.join(STOP_GRACE_S)
        self._call(self._worker_exited, epoch, process.exitcode)

    def _call(self, callback: Callable[..., object], *args: object) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is already closed: shutting down
            self._loop.call_soon_threadsafe(callback, *args)

    # -- on the event loop ------------------------------------------------------------------

    def _dispatch(self, message: ipc.FromWorker) -> None:
        self._last_heard = time.monotonic()
        if isinstance(message, ipc.Pong):
            self._ping_sent = None
            return
        if isinstance(message, ipc.Phase):
            self._set_phase(message)
            return
        if isinstance(message, ipc.CacheStats):
            self.cache_stats = message
            return
        reply = self._replies.get(message.key)
        if reply is None:
            return
        if isinstance(message, ipc.Rejected | ipc.End | ipc.Warmed):
            del self._replies[message.key]
            if reply.admitted:
                self._on_generation_over()
        reply.deliver(message)

    def _set_phase(self, message: ipc.Phase, retry_at: float | None = None) -> None:
        now = time.monotonic()
        if message.ready:
            self._recovering = None
            self._load_s = now - self._spawned_at
        elif self._recovering is not None and message.name not in ("failed", "restarting"):
            # A replacement coming up is still "restarting" to clients (retry soon), with
            # where it is in the reason.
            reason = f"{self._recovering}; {message.name.replace('_', ' ')}"
            message = ipc.Phase("restarting", reason, message.context_length)
            if self._load_s is not None:
                retry_at = self._spawned_at + self._load_s
        self.phase = PhaseState(
            message.name,
            message.reason,
            now,
            message.context_length,
            retry_at,
            message.image_input,
            message.passage_reuse,
        )
        if message.ready:
            self._crashes = 0
            self.image_input = message.image_input
        fields: dict[str, object] = {"phase": message.name}
        if message.reason:
            fields["reason"] = message.reason
        if message.ready:
            fields["load_s"] = round(now - self._spawned_at, 2)
            fields["image_input"] = message.image_input
        level = {"failed": logging.ERROR, "restarting": logging.WARNING}.get(
            message.name, logging.INFO
        )
        log.log(level, f"model {message.name}", extra={"fields": fields})

    def _worker_exited(self, epoch: int, exitcode: int | None) -> None:
        if epoch != self._epoch or self._stopping:
            return
        self._outbox.put(None)
        self._abort_all()
        self.cache_stats = ipc.CacheStats()  # the cache died with the worker
        if self.phase.name == "failed":
            return  # the worker reported why and stopped on purpose; a restart would not help
        delay = RESTART_DELAYS_S[min(self._crashes, len(RESTART_DELAYS_S) - 1)]
        self._crashes += 1
        self.restarts += 1
        why = self._stalled or f"the model worker exited unexpectedly (exit code {exitcode})"
        self._recovering = why
        retry_at = time.monotonic() + delay + (self._load_s or 0.0)
        self._set_phase(ipc.Phase("restarting", f"{why}; restarting in {delay:g} s"), retry_at)
        assert self._loop is not None
        self._restart = self._loop.call_later(delay, self._spawn)

    async def _watch(self) -> None:
        """Ping a ready worker; kill one that leaves a ping unanswered for WORKER_STALL_S (plus
        WORKER_STALL_IMAGE_S an image while a reply's images are read), or a replacement that
        makes no progress loading for WORKER_STALL_S + twice the last load."""
        while True:
            stall = self._settings.worker_stall_s
            await asyncio.sleep(min(1.0, stall / 4))
            stall += self._settings.worker_stall_image_s * self._images_being_read()
            if self._stalled is not None:
                continue
            now = time.monotonic()
            if not self.phase.ready:
                if self._loading_replacement() and self._load_s is not None:
                    silent = now - self._last_heard
                    if silent > stall + 2 * self._load_s:
                        self._kill_stalled(silent, loading=True)
                continue
            if self._ping_sent is None:
                if now - self._last_heard >= PING_INTERVAL_S:
                    self._ping_sent = now
                    self._outbox.put(ipc.Ping())
            elif now - max(self._ping_sent, self._last_heard) > stall:
                self._kill_stalled(now - self._last_heard)

    def _images_being_read(self) -> int:
        """The most images of a reply in flight that has not made its first token: the worker
        may be in the one step that reads them."""
        return max((r.images for r in self._replies.values() if not r.first_piece), default=0)

    def _loading_replacement(self) -> bool:
        """A replacement worker is running and has not become ready yet."""
        return (
            self._recovering is not None
            and self._restart is None
            and self.phase.name != "failed"
            and self._process is not None
            and self._process.is_alive()
        )

    def _kill_stalled(self, silent_s: float, *, loading: bool = False) -> None:
        if loading:
            self._stalled = (
                f"the replacement model worker hung while loading ({silent_s:.0f} s without "
                "progress)"
            )
        else:
            self._stalled = f"the model worker stopped answering ({silent_s:.0f} s without a step)"
        log.error("model worker stalled", extra={"fields": {"silent_s": round(silent_s, 1)}})
        self._abort_all()  # fail the replies in flight now, not after the kill is noticed
        if self._process is not None and self._process.is_alive():
            self._process.kill()  # SIGKILL ends a stopped process too; the reader sees EOF

    def _abort_all(self) -> None:
        replies, self._replies = self._replies, {}
        for key, reply in replies.items():
            if reply.admitted:
                self._on_generation_over()
            reply.deliver(ipc.End(key, "error", reply.generated, None))
