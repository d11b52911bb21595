"""How much memory the KV cache may take (KV_MEMORY_MB): what the container may use, less the
loaded model and a margin, chosen at start like the thread count (cpus.py); the limit and the
resident memory are read in sidecar/limits.py.

What the container may use is its cgroup's memory limit (v2 `memory.max`, v1
`memory.limit_in_bytes`), else the machine's memory (App Service's sidecar containers share
the instance's). The loaded model is what the processes of this service hold once it is loaded
and warmed up (the worker's resident memory, the web process's). The margin (a tenth of the
limit, at least 1 GiB) covers the rest: the chat app's container on the same instance,
onnxruntime's working memory while it reads prompts, the page cache the model's file needs.
"""

from __future__ import annotations

import ctypes
import os

from sidecar.limits import MIB, margin, memory_limit, resident_bytes


def default_kv_bytes(limit: int, loaded: int) -> int:
    """The KV bound for a container of `limit` bytes whose service holds `loaded` bytes once
    the model is loaded: the rest less the margin, at least 256 MiB (a machine too small for
    that runs short replies one at a time, and says so in its start log)."""
    return max(256 * MIB, limit - loaded - margin(limit))


def chosen_kv_bound(wanted_bytes: int) -> tuple[int, dict[str, object]]:
    """The KV bound once the model is loaded: `wanted_bytes` (KV_MEMORY_MB) or, 0, chosen
    from the memory limit; and the start log's fields that say how."""
    limit, source = memory_limit()
    loaded = service_resident_bytes()
    bound = wanted_bytes or default_kv_bytes(limit, loaded)
    return bound, {
        "kv_memory_bytes": bound,
        "chosen": "KV_MEMORY_MB" if wanted_bytes else "from the memory limit",
        "memory_limit_bytes": limit,
        "limit_source": source,
        "loaded_bytes": loaded,
    }


def service_resident_bytes() -> int:
    """This worker's resident memory and its parent's (the web process)."""
    return resident_bytes() + resident_bytes(os.getppid())


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def return_freed_memory(threshold: int = 128 * 1024) -> bool:
    """Have glibc's malloc serve every block of `threshold` bytes or more from its own mapping,
    given back to the system when freed, and trim its heaps past that much free space. Its
    default raises the mapping threshold (up to 32 MiB) each time a mapped block is freed, so
    the compact KV blocks, the encoder's scratch and the arrays of each model call, all freed
    and allocated again in other sizes, came from its heaps and stayed there: measured, the
    worker's peak RSS with 8 users taking turns was 5,095 MiB with the default and 4,677 MiB
    with this (loaded model plus what the KV books count: about 4,640), at the same speed. False
    where there is no glibc (nothing changes)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(
            libc.mallopt(_M_MMAP_THRESHOLD, threshold)
            and libc.mallopt(_M_TRIM_THRESHOLD, threshold)
        )
    except (OSError, AttributeError):
        return False
