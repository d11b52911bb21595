"""What this service may use and holds: the container's memory limit and a process's resident
memory (model/memory.py sizes the KV bound from them; web/models/pool.py the models' budget).

What the container may use is its cgroup's memory limit (v2 `memory.max`, v1
`memory.limit_in_bytes`), else the machine's memory (App Service's sidecar containers share
the instance's). The margin (a tenth of the limit, at least 1 GiB) covers what no bound counts:
the chat app's container on the same instance, onnxruntime's working memory while it reads
prompts, the page cache the model's file needs.
"""

from __future__ import annotations

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


def _total_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 8 * GIB
