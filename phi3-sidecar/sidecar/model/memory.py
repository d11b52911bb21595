"""How much memory the KV cache may take (KV_MEMORY_MB): what the container may use, less the
loaded model and a margin, chosen at start like the thread count (cpus.py).

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
from pathlib import Path

MIB = 2**20
GIB = 2**30
_CGROUP = Path("/sys/fs/cgroup")
_OWN = Path("/proc/self/cgroup")
_UNLIMITED_V1 = 2**60  # cgroup v1 reports "no limit" as a huge number


def memory_limit(cgroup: Path = _CGROUP, own: Path = _OWN) -> tuple[int, str]:
    """The bytes this process may use, and where that came from: the smallest memory limit of
    its own cgroup and the cgroups above it (`/proc/self/cgroup` names them; inside a container
    with its own cgroup namespace that is the mounted root), v2 or v1."""
    found: list[tuple[int, str]] = []
    for version, base, name, path in _own_cgroups(cgroup, own):
        parts = [part for part in path.split("/") if part]
        for depth in range(len(parts), -1, -1):
            file = base.joinpath(*parts[:depth], name)
            try:
                text = file.read_text().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < _UNLIMITED_V1:
                found.append((int(text), f"cgroup {version} {name}"))
    if found:
        return min(found)
    return _total_memory(), "the machine's memory (no cgroup limit)"


def _own_cgroups(cgroup: Path, own: Path) -> list[tuple[str, Path, str, str]]:
    """(version, mount point, limit file, this process's path) for each memory hierarchy."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        lines = []
    found = []
    for line in lines:
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and not controllers:  # the unified (v2) hierarchy
            base = cgroup if (cgroup / "cgroup.controllers").exists() else cgroup / "unified"
            found.append(("v2", base, "memory.max", path))
        elif "memory" in controllers.split(","):
            found.append(("v1", cgroup / "memory", "memory.limit_in_bytes", path))
    if not found:  # no /proc/self/cgroup: the mounted roots
        found = [
            ("v2", cgroup, "memory.max", "/"),
            ("v1", cgroup / "memory", "memory.limit_in_bytes", "/"),
        ]
    return found


def resident_bytes(pid: int | str = "self") -> int:
    """A process's resident memory (VmRSS); 0 where it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def margin(limit: int) -> int:
    return max(GIB, limit // 10)


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


def _total_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 8 * GIB


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
