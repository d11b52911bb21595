"""How many CPUs this process may really use: its CPU affinity, capped by a cgroup CPU quota;
and the decoder's thread options (NUM_THREADS, THREAD_SPINNING) built on it.

onnxruntime-genai's own default is half of the cores the machine has, which on a 2-vCPU plan is
one thread: half speed. `os.cpu_count()` is no better the other way: in a container limited by
a CPU quota (`docker run --cpus`, Kubernetes `limits.cpu`, App Service) it sees every core of
the host, and more threads than the quota allows get throttled in bursts, which is slower than
using the right number. So the count is the smaller of:
- the affinity mask (`sched_getaffinity`: cpusets, `taskset`, `docker --cpuset-cpus`), and
- the CFS quota of this process's cgroup and of every cgroup above it, rounded up
  (cgroup v2 `cpu.max`, cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`).
Everything is read below `root` so tests can feed it a folder of made-up files.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sidecar.settings import Settings


@dataclass(frozen=True)
class CpuBudget:
    count: int
    source: str  # for the start-up log line: where the count came from


def cpu_budget(
    root: Path = Path("/"),
    affinity: Callable[[], int] | None = None,
) -> CpuBudget:
    """The CPUs this process may use, and where that number came from."""
    cpus = affinity() if affinity is not None else _affinity_count()
    budget = CpuBudget(cpus, f"CPU affinity ({cpus} CPUs)")
    quota = _cgroup_quota(root)
    if quota is not None:
        limit, where = quota
        count = max(1, math.ceil(limit - 1e-9))
        if count < budget.count:
            budget = CpuBudget(count, f"cgroup CPU quota {limit:g} CPUs ({where})")
    return budget


def thread_count(settings: Settings) -> tuple[int, str]:
    """NUM_THREADS if set, else the CPUs this process may use; and where the number came from."""
    if settings.num_threads:
        return settings.num_threads, "NUM_THREADS"
    budget = cpu_budget()
    return budget.count, budget.source


def session_options(num_threads: int, thread_spinning: bool) -> dict[str, Any]:
    """The decoder's onnxruntime session options (genai_config.json's `session_options`).

    onnxruntime-genai's default thread count is half the machine's cores (one thread on a
    2-vCPU plan: half speed), so the count is always set; `num_threads` 0 means the CPUs this
    process may really use (cpu_budget). Spinning: idle pool threads busy-wait for the next
    operator; off, they sleep, which costs decode speed (see THREAD_SPINNING in settings.py).
    Keys not known to onnxruntime-genai go to onnxruntime as session config entries.
    """
    spin = "1" if thread_spinning else "0"
    return {
        "intra_op_num_threads": num_threads or cpu_budget().count,
        "session.intra_op.allow_spinning": spin,
        "session.inter_op.allow_spinning": spin,
    }


def _affinity_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def _cgroup_quota(root: Path) -> tuple[float, str] | None:
    """The tightest CPU quota on the way from this process's cgroup up to the root, if any."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    found: list[tuple[float, str]] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            found += _walk(root / "sys/fs/cgroup", path, _read_v2)
        elif "cpu" in controllers.split(","):
            for name in (controllers, "cpu", "cpu,cpuacct"):
                mount = root / "sys/fs/cgroup" / name
                if mount.is_dir():
                    found += _walk(mount, path, _read_v1)
                    break
    return min(found, default=None)


def _walk(
    mount: Path, cgroup: str, read: Callable[[Path], float | None]
) -> list[tuple[float, str]]:
    """Quotas of the cgroup's folder and its parents, up to the mount point.

    In a container the path in /proc/self/cgroup is often the host's while the mount shows the
    container's own cgroup at its root: a path that does not exist falls back to the mount.
    """
    parts = PurePosixPath(cgroup).parts[1:]
    while parts and not (mount.joinpath(*parts)).is_dir():
        parts = parts[1:]  # strip host-side prefixes until the rest exists under the mount
    quotas = []
    for depth in range(len(parts), -1, -1):
        folder = mount.joinpath(*parts[:depth])
        limit = read(folder)
        if limit is not None:
            quotas.append((limit, str(folder)))
    return quotas


def _read_v2(folder: Path) -> float | None:
    try:
        quota, _, period = (folder / "cpu.max").read_text().strip().partition(" ")
    except OSError:
        return None
    if quota == "max" or not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return None
    return int(quota) / int(period)


def _read_v1(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text().strip())
        period = int((folder / "cpu.cfs_period_us").read_text().strip())
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:  # -1: no quota
        return None
    return quota / period
