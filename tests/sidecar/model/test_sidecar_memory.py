"""The KV bound's default (model/memory.py): the memory this process may use is the smallest
limit of its own cgroup and those above it (v1 or v2, as /proc/self/cgroup names them), else
the machine's; the bound is that less the loaded service and a margin."""

from __future__ import annotations

from pathlib import Path

from sidecar.limits import GIB, MIB, memory_limit
from sidecar.model.memory import default_kv_bytes


def test_a_v1_cgroup_limit_is_the_smallest_on_the_way_up(tmp_path: Path) -> None:
    own = tmp_path / "self-cgroup"
    own.write_text("5:devices:/\n4:memory:/outer/inner\n0::/\n")
    memory = tmp_path / "memory"
    (memory / "outer" / "inner").mkdir(parents=True)
    (memory / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # none
    (memory / "outer" / "memory.limit_in_bytes").write_text(f"{6 * GIB}\n")
    (memory / "outer" / "inner" / "memory.limit_in_bytes").write_text(f"{8 * GIB}\n")
    assert memory_limit(tmp_path, own) == (6 * GIB, "cgroup v1 memory.limit_in_bytes")


def test_a_v2_cgroup_limit_and_max_meaning_none(tmp_path: Path) -> None:
    own = tmp_path / "self-cgroup"
    own.write_text("0::/app.slice/sidecar\n")
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "app.slice" / "sidecar").mkdir(parents=True)
    (tmp_path / "app.slice" / "memory.max").write_text("max\n")
    (tmp_path / "app.slice" / "sidecar" / "memory.max").write_text(f"{8 * GIB}\n")
    assert memory_limit(tmp_path, own) == (8 * GIB, "cgroup v2 memory.max")
    (tmp_path / "app.slice" / "sidecar" / "memory.max").write_text("max\n")
    limit, source = memory_limit(tmp_path, own)
    assert source == "the machine's memory (no cgroup limit)" and limit > 0


def test_inside_a_container_the_mounted_root_is_its_own(tmp_path: Path) -> None:
    own = tmp_path / "self-cgroup"
    own.write_text("0::/\n")
    (tmp_path / "cgroup.controllers").write_text("memory\n")
    (tmp_path / "memory.max").write_text(f"{4 * GIB}\n")
    assert memory_limit(tmp_path, own)[0] == 4 * GIB


def test_the_default_bound_leaves_the_model_and_a_margin() -> None:
    loaded = 3300 * MIB  # Phi-3-mini int4, worker and web process
    assert default_kv_bytes(8 * GIB, loaded) == 8 * GIB - loaded - GIB
    assert default_kv_bytes(32 * GIB, loaded) == 32 * GIB - loaded - 32 * GIB // 10
    assert default_kv_bytes(4 * GIB, loaded) == 256 * MIB  # the floor


def test_freed_blocks_go_back_to_the_system() -> None:
    """glibc's malloc told to map every block of 128 KiB or more (the KV bound is about resident
    memory: a freed compact block must not stay in a heap)."""
    import subprocess
    import sys

    probe = (
        "import numpy as np, resource\n"
        "from sidecar.limits import resident_bytes\n"
        "from sidecar.model.memory import return_freed_memory\n"
        "assert return_freed_memory()\n"
        "before = resident_bytes()\n"
        "blocks = [np.ones(2**20 + i * 4096, np.uint8) for i in range(400)]\n"
        "del blocks\n"
        "print(resident_bytes() - before)\n"
    )
    grown = int(
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        ).stdout
    )
    assert grown < 64 * MIB  # 400 MiB allocated and freed: given back
