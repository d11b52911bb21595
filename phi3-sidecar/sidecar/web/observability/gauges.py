"""What /metrics reads when it is scraped (metrics.py registers each): readiness, the queue and
the model worker's own counts (`Gauges`, handed over by probes.py), the connection cap's counts
(guards/connections.py, guards/listener.py), the stored responses (responses/store.py) and the
images' memory (images/memory.py). Each changes on the event loop or in the worker, so it is
read at the scrape, not counted per request.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sidecar import ipc

if TYPE_CHECKING:
    from sidecar.web.guards.connections import Connections
    from sidecar.web.images.memory import ImageMemory
    from sidecar.web.responses.store import ResponseStore


@dataclass
class Gauges:
    ready: bool
    active: int
    waiting: int
    worker_restarts: int
    cache: ipc.CacheStats  # the model worker's latest report (a new worker starts empty)


class GaugesCollector(Collector):
    """What is read when /metrics is scraped: readiness, the queue, the worker's own counts."""

    def __init__(self) -> None:
        self.latest = Gauges(False, 0, 0, 0, ipc.CacheStats())

    def collect(self) -> Iterator[Metric]:
        g = self.latest
        yield CounterMetricFamily(
            "sidecar_worker_restarts", "Model worker restarts.", value=g.worker_restarts
        )
        yield CounterMetricFamily(
            "sidecar_prompt_cache_evictions",
            "Cached generators dropped to make room (since the model worker started).",
            value=g.cache.evictions,
        )
        yield CounterMetricFamily(
            "sidecar_kv_growth_pauses",
            "Times a running reply had to wait for room to grow its KV reservation under the "
            "bound (since the model worker started; model/kv/bound.py).",
            value=g.cache.kv_pauses,
        )
        yield CounterMetricFamily(
            "sidecar_kv_memory_waits",
            "Requests that waited for KV memory (KV_MEMORY_MB) beside the running replies "
            "(since the model worker started).",
            value=g.cache.kv_waits,
        )
        yield CounterMetricFamily(
            "sidecar_passage_store_hits",
            "Passages of grounded requests found in the passage store (since the model worker "
            "started; model/kv/passages.py).",
            value=g.cache.passage_hits,
        )
        yield CounterMetricFamily(
            "sidecar_passage_store_misses",
            "Passages of grounded requests not in the passage store: read in their prompt, and "
            "read alone for the store while the worker is idle.",
            value=g.cache.passage_misses,
        )
        for name, help_text, value in (
            (
                "passage_store_bytes",
                "RAM of the passage store: stored passages' K/V and their reading prefixes "
                "(PASSAGE_KV_MB bounds it).",
                g.cache.passage_bytes,
            ),
            ("passage_store_entries", "Passages in the store's RAM.", g.cache.passage_entries),
            (
                "passage_store_disk_bytes",
                "Bytes of the passage store's files (PASSAGE_DISK_MB bounds them).",
                g.cache.passage_disk_bytes,
            ),
            (
                "passage_store_wanted",
                "Passages waiting to be read into the store while the worker is idle.",
                g.cache.passage_wanted,
            ),
            (
                "passage_store_warming",
                "Passages sent to warm the store (POST /v1/passages/warm) not read yet: read "
                "while idle, after the questions' own, while the store has room.",
                g.cache.passage_warming,
            ),
            (
                "prompt_cache_bytes",
                "KV-cache bytes of the generators the conversation cache holds.",
                g.cache.bytes,
            ),
            ("prompt_cache_entries", "Generators the conversation cache holds.", g.cache.entries),
            (
                "kv_bytes_per_token",
                "KV-cache bytes one token costs, measured on the model's KV tensors (type, "
                "layers, heads, head size); PROMPT_CACHE_MB is counted in these.",
                g.cache.bytes_per_token,
            ),
            (
                "prompt_cache_compact_bytes",
                "Bytes of the kept conversations' compact copies in RAM (KV_COMPACT); part of "
                "prompt_cache_bytes.",
                g.cache.compact_bytes,
            ),
            (
                "prompt_cache_compact_entries",
                "Kept conversations held only in compact RAM.",
                g.cache.compact_entries,
            ),
            ("prompt_cache_disk_bytes", "Bytes of the disk tier's files.", g.cache.disk_bytes),
            (
                "prompt_cache_disk_entries",
                "Kept conversations held only on the disk tier.",
                g.cache.disk_entries,
            ),
            (
                "kv_memory_bytes",
                "The one bound on all KV memory (KV_MEMORY_MB, or chosen at start).",
                g.cache.kv_memory_bytes,
            ),
            (
                "kv_reserved_bytes",
                "KV bytes the running replies reserved of the bound.",
                g.cache.kv_reserved_bytes,
            ),
            ("ready", "1 when the model is ready.", int(g.ready)),
            ("active_generations", "Generations running.", g.active),
            ("queue_depth", "Requests waiting for a slot.", g.waiting),
        ):
            yield GaugeMetricFamily(f"sidecar_{name}", help_text, value=value)


class ConnectionsCollector(Collector):
    """The connection cap's counts, read when scraped (they change on the event loop)."""

    def __init__(self, connections: Connections) -> None:
        self.connections = connections

    def collect(self) -> Iterator[Metric]:
        c = self.connections
        for name, help_text, count in (
            (
                "connections_refused",
                "Requests answered 503 too_many_connections: their connection opened over "
                "MAX_CONNECTIONS with none idle (probes are answered instead).",
                c.refused,
            ),
            (
                "idle_connections_closed",
                "Idle kept-alive connections closed to admit a new one at MAX_CONNECTIONS.",
                c.idle_closed,
            ),
            (
                "write_timeouts",
                "Connections closed because their client stopped reading for WRITE_TIMEOUT_S "
                "(its reply cancelled in the model worker).",
                c.write_timeouts,
            ),
            (
                "accept_errors",
                "Connections that could not be accepted: out of file descriptors or memory "
                "(EMFILE, ENFILE, ENOBUFS, ENOMEM); accepting resumes a second later.",
                c.accept_errors,
            ),
        ):
            yield CounterMetricFamily(f"sidecar_{name}", help_text, value=count)
        yield GaugeMetricFamily(
            "sidecar_open_connections", "Client connections open.", value=c.open
        )
        yield GaugeMetricFamily(
            "sidecar_connection_limit",
            "Connections admitted at once: MAX_CONNECTIONS, or less where the open-files limit "
            "leaves less.",
            value=c.limit,
        )


class ResponseStoreCollector(Collector):
    """The stored responses, read when /metrics is scraped."""

    def __init__(self, store: ResponseStore) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        store = self._store
        entries, held = store.stats
        yield GaugeMetricFamily(
            "sidecar_response_store_entries", "Responses kept (store: true).", value=entries
        )
        yield GaugeMetricFamily(
            "sidecar_response_store_bytes",
            "Memory the kept responses take, as RESPONSE_STORE_MB counts it.",
            value=held,
        )
        yield CounterMetricFamily(
            "sidecar_response_store_evictions",
            "Kept responses dropped to make room (the key furthest over its share first).",
            value=store.evictions,
        )
        yield CounterMetricFamily(
            "sidecar_response_store_refused",
            "Responses not kept: larger than the room their key could have.",
            value=store.refused,
        )


class ImageMemoryCollector(Collector):
    """The images' memory (IMAGE_MEMORY_MB), read when /metrics is scraped."""

    def __init__(self, memory: ImageMemory) -> None:
        self._memory = memory

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "sidecar_image_memory_bytes",
            "Memory counted for the images of requests in flight (from their headers until "
            "decoded, then their PNGs).",
            value=self._memory.in_use,
        )
        yield GaugeMetricFamily(
            "sidecar_image_memory_limit_bytes",
            "IMAGE_MEMORY_MB, in bytes.",
            value=self._memory.budget_bytes,
        )
