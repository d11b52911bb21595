"""The resident models: one worker process each (a ModelClient), loaded when first asked for,
within MODELS_MEMORY_BYTES.

A model's cost is what it holds once loaded, measured: its worker's resident memory and its
prompt process's when it gets ready, plus the KV bound and passage store it may still fill
(registry.ModelEntry.booked_bytes); before its first load, its folder's bytes stand for the
weights. Measured once, a model's cost is used from then on, also after it was unloaded: never
a guess that refuses a model that would have fitted (Ollama's complaint), never one that
overcommits.

A model that does not fit makes room: the least recently used resident that is not pinned and
has no request (`users`: from routing until its generation is over) is unloaded. If nothing can
go, the request is refused (503 overloaded, Retry-After) rather than left waiting for memory.
A model not used for its `idle_unload_s` is unloaded too (never a pinned one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.limits import margin, memory_limit, resident_bytes
from sidecar.settings import Settings
from sidecar.web.errors import ApiError, not_ready
from sidecar.web.generation.admission import Admission
from sidecar.web.generation.model_client import ModelClient
from sidecar.web.models.registry import ModelEntry, Registry

log = logging.getLogger("sidecar.web.models")

TIDY_S = 1.0  # how often memory is measured and idle models looked at
# A worker process's own memory beyond its model's files and KV, before any was measured
WORKER_BYTES = 400 * 2**20
RETRY_FULL_S = 5  # Retry-After when the models in use fill the budget


@dataclass
class Resident:
    entry: ModelEntry
    client: ModelClient
    started_at: float
    last_used: float
    users: int = 0  # requests routed to it whose generation is not over
    measured: bool = False


@dataclass
class ModelPool:
    registry: Registry
    admission: Admission
    settings: Settings
    budget_bytes: int = 0  # MODELS_MEMORY_BYTES, or chosen at start
    residents: dict[str, Resident] = field(default_factory=dict)
    cost: dict[str, int] = field(default_factory=dict)  # measured, per model id
    load_times: dict[str, float] = field(default_factory=dict)  # its last load's seconds
    image_input: dict[str, bool] = field(default_factory=dict)  # as its last worker said
    pinned: set[str] = field(default_factory=set)
    _folder_bytes: dict[str, int] = field(default_factory=dict)
    # The most a worker took beyond its model's files and bookings, as measured (None: none yet)
    _overhead: int | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _tidy: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.pinned = {e.id for e in self.registry.entries if e.pinned}

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """The pinned models' workers (the default first); returns at once (they load)."""
        if not self.budget_bytes:
            limit, _ = memory_limit()
            self.budget_bytes = max(0, limit - margin(limit) - resident_bytes())
        for entry in self.registry.entries:
            if entry.id in self.pinned:
                await self._load(entry)
        if self.registry.strict:
            self._tidy = asyncio.create_task(self._tidy_loop(), name="models-tidy")
        fields = {"models": [e.id for e in self.registry.entries], "budget": self.budget_bytes}
        log.info("models", extra={"fields": fields})

    async def stop(self) -> None:
        if self._tidy is not None:
            self._tidy.cancel()
        for resident in list(self.residents.values()):
            await resident.client.stop()
        self.residents.clear()

    # -- what routes ask ----------------------------------------------------------------------

    @property
    def default(self) -> ModelClient:
        """The default model's client (pinned: always resident)."""
        return self.residents[self.registry.default.id].client

    def resident(self, entry: ModelEntry) -> Resident | None:
        return self.residents.get(entry.id)

    def state(self, entry: ModelEntry) -> str:
        """`loaded`, `loading` (also a worker being replaced), `failed` or `available`."""
        resident = self.residents.get(entry.id)
        if resident is None:
            return "available"
        phase = resident.client.phase
        if phase.ready:
            return "loaded"
        return "failed" if phase.name == "failed" else "loading"

    def memory_bytes(self, entry: ModelEntry) -> int | None:
        """Its measured cost (None: never loaded yet)."""
        return self.cost.get(entry.id)

    def load_s(self, entry: ModelEntry) -> float | None:
        """How long its last load took (None: never loaded yet): a cold load's expected wait."""
        return self.load_times.get(entry.id)

    async def take(self, entry: ModelEntry) -> ModelClient:
        """The model's client for a request, loaded first if need be (it may still be
        loading: wait_ready); give it back with `release` unless its generation starts."""
        resident = self.residents.get(entry.id)
        if resident is None:
            async with self._lock:
                resident = self.residents.get(entry.id) or await self._load(entry)
        resident.users += 1
        resident.last_used = time.monotonic()
        return resident.client

    def release(self, entry: ModelEntry) -> None:
        """A request routed to the model is over (its generation ended, or it never began)."""
        resident = self.residents.get(entry.id)
        if resident is not None and resident.users > 0:
            resident.users -= 1
            resident.last_used = time.monotonic()

    async def wait_ready(self, entry: ModelEntry, client: ModelClient) -> None:
        """Until the model is ready; a 503 if it fails or takes MODEL_LOAD_WAIT_S."""
        until = time.monotonic() + self.settings.model_load_wait_s
        while not client.phase.ready:
            phase = client.phase
            if phase.name == "failed" or time.monotonic() >= until:
                raise not_ready(phase.name, phase.reason, phase.retry_after_s())
            await asyncio.sleep(0.05)

    def loading(self, entry: ModelEntry) -> dict[str, Any] | None:
        """A cold model's loading, as a stream's `loading` event says it (None: not loading)."""
        resident = self.residents.get(entry.id)
        if resident is None or resident.client.phase.ready:
            return None
        seconds = time.monotonic() - resident.started_at
        last = self.load_times.get(entry.id)
        left = None if last is None else max(0, math.ceil(last - seconds))
        return {"model": entry.id, "seconds": round(seconds, 1), "seconds_left": left}

    async def load(self, entry: ModelEntry) -> None:
        """POST /v1/models/{id}/load: resident now (room made as for a request)."""
        async with self._lock:
            if entry.id not in self.residents:
                await self._load(entry)

    async def unload(self, entry: ModelEntry) -> None:
        """POST /v1/models/{id}/unload: a pinned model or one answering is refused (409)."""
        async with self._lock:
            resident = self.residents.get(entry.id)
            if resident is None:
                return
            if not self._can_go(resident):
                why = "pinned" if entry.id in self.pinned else "answering requests"
                raise ApiError("model_busy", f"model {entry.id!r} is {why}: not unloaded")
            await self._unload(resident, "asked")

    # -- room ---------------------------------------------------------------------------------

    def need(self, entry: ModelEntry) -> int:
        """What the model holds once loaded: measured; else its folder's bytes, its bookings
        and what a worker process took beyond those, as measured on the models loaded so far
        (onnxruntime, Python, the prompt process: hundreds of MB), WORKER_BYTES before any."""
        measured = self.cost.get(entry.id)
        if measured is not None:
            return measured
        overhead = WORKER_BYTES if self._overhead is None else self._overhead
        return self._weights(entry) + entry.booked_bytes + overhead

    def _weights(self, entry: ModelEntry) -> int:
        size = self._folder_bytes.get(entry.id)
        if size is None:
            size = self._folder_bytes[entry.id] = folder_bytes(entry.settings.model_path)
        return size

    def used(self) -> int:
        return sum(self.need(r.entry) for r in self.residents.values())

    async def _load(self, entry: ModelEntry) -> Resident:
        if self.registry.strict:
            await self._make_room(entry)
        client = ModelClient(entry.settings, on_generation_over=lambda: self._over(entry))
        now = time.monotonic()
        resident = Resident(entry, client, now, now)
        self.residents[entry.id] = resident
        await client.start()
        fields = {"model": entry.id, "need_bytes": self.need(entry), "used_bytes": self.used()}
        log.info("model loading", extra={"fields": fields})
        return resident

    def _over(self, entry: ModelEntry) -> None:
        self.admission.release()
        self.release(entry)

    async def _make_room(self, entry: ModelEntry) -> None:
        self._measure()  # what is ready now, not at the next tidy
        need = self.need(entry)
        if need > self.budget_bytes:
            raise ApiError(
                "overloaded",
                f"model {entry.id!r} needs {need} bytes, more than MODELS_MEMORY_BYTES "
                f"({self.budget_bytes}) allows",
            )
        while self.used() + need > self.budget_bytes:
            victim = self._least_recently_used()
            if victim is None:
                raise ApiError(
                    "overloaded",
                    f"the models answering fill MODELS_MEMORY_BYTES: {entry.id!r} loads when "
                    "one of them is free",
                    headers={"Retry-After": str(RETRY_FULL_S)},
                )
            await self._unload(victim, f"room for {entry.id}")

    def _can_go(self, resident: Resident) -> bool:
        """Whether it may be unloaded now: not pinned, no request routed to it or with it."""
        return (
            resident.entry.id not in self.pinned
            and not resident.users
            and not resident.client.busy
        )

    def _least_recently_used(self) -> Resident | None:
        """The resident that may go and was used longest ago (None: none may go)."""
        idle = [r for r in self.residents.values() if self._can_go(r)]
        return min(idle, key=lambda r: r.last_used) if idle else None

    async def _unload(self, resident: Resident, why: str) -> None:
        del self.residents[resident.entry.id]
        await resident.client.stop()
        log.info("model unloaded", extra={"fields": {"model": resident.entry.id, "why": why}})

    async def _tidy_loop(self) -> None:
        while True:
            await asyncio.sleep(TIDY_S)
            try:
                await self._tidy_once()
            except Exception:  # never let the loop die
                log.exception("models tidy failed")

    async def _tidy_once(self) -> None:
        now = time.monotonic()
        self._measure()
        async with self._lock:
            # A first measure above the estimate: back within the budget
            if self.used() > self.budget_bytes and (victim := self._least_recently_used()):
                await self._unload(victim, "over the budget")
            for resident in list(self.residents.values()):
                idle_for = now - resident.last_used
                unload_after = resident.entry.idle_unload_s
                if unload_after and idle_for > unload_after and self._can_go(resident):
                    await self._unload(resident, f"idle {idle_for:.0f} s")


    def _measure(self) -> None:
        """Each model that got ready since: its processes' resident memory, once."""
        for resident in self.residents.values():
            entry, client = resident.entry, resident.client
            if client.phase.ready and not resident.measured and client.pid is not None:
                resident.measured = True
                self.cost[entry.id] = tree_resident_bytes(client.pid) + entry.booked_bytes
                beyond = self.cost[entry.id] - self._weights(entry) - entry.booked_bytes
                self._overhead = max(beyond, self._overhead or 0)
                if client.load_s is not None:
                    self.load_times[entry.id] = client.load_s
                self.image_input[entry.id] = bool(client.image_input)
                fields = {"model": entry.id, "memory_bytes": self.cost[entry.id]}
                log.info("model loaded", extra={"fields": fields | {"load_s": client.load_s}})


def folder_bytes(folder: Path) -> int:
    """The bytes of a model folder's files (its weights, before a load measures it)."""
    try:
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    except OSError:
        return 0


def tree_resident_bytes(pid: int) -> int:
    """A process's resident memory and its descendants' (the worker and its prompt process)."""
    total, todo, seen = 0, [pid], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        total += resident_bytes(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                todo += [int(child) for child in task.read_text().split()]
    return total
