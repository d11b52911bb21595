"""The thread count: CPU affinity capped by the cgroup CPU quota (v1 and v2), NUM_THREADS
overrides, the choice is logged with its source. Fed from made-up /proc and /sys folders."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from scripts.run import services
from sidecar.model.cpus import cpu_budget, session_options, thread_count
from sidecar.settings import Settings


def make_root(tmp_path: Path, cgroup: str, files: dict[str, str]) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    for name, text in files.items():
        path = tmp_path / "sys/fs/cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def four() -> int:
    return 4


def test_no_cgroup_files_means_the_affinity(tmp_path: Path) -> None:
    budget = cpu_budget(tmp_path, affinity=four)
    assert budget.count == 4
    assert budget.source == "CPU affinity (4 CPUs)"


def test_the_real_machine_gives_its_affinity_or_less() -> None:
    budget = cpu_budget()
    assert 1 <= budget.count <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [("200000 100000", 2), ("150000 100000", 2), ("50000 100000", 1), ("100000 100000", 1)],
)
def test_v2_quota_caps_and_rounds_up(tmp_path: Path, cpu_max: str, expected: int) -> None:
    root = make_root(tmp_path, "0::/\n", {"cpu.max": cpu_max + "\n"})
    budget = cpu_budget(root, affinity=four)
    assert budget.count == expected
    assert budget.source.startswith("cgroup CPU quota ")
    assert "cpu.max" not in budget.source or str(root) in budget.source


def test_v2_no_quota_keeps_the_affinity(tmp_path: Path) -> None:
    root = make_root(tmp_path, "0::/\n", {"cpu.max": "max 100000\n"})
    assert cpu_budget(root, affinity=four).count == 4


def test_v2_quota_above_the_affinity_keeps_the_affinity(tmp_path: Path) -> None:
    root = make_root(tmp_path, "0::/\n", {"cpu.max": "800000 100000\n"})
    budget = cpu_budget(root, affinity=four)
    assert (budget.count, budget.source) == (4, "CPU affinity (4 CPUs)")


def test_v2_nested_cgroups_take_the_tightest_quota_on_the_way_up(tmp_path: Path) -> None:
    root = make_root(
        tmp_path,
        "0::/app.slice/sidecar.service\n",
        {
            "app.slice/cpu.max": "100000 100000\n",  # the parent allows one CPU
            "app.slice/sidecar.service/cpu.max": "300000 100000\n",
        },
    )
    budget = cpu_budget(root, affinity=four)
    assert budget.count == 1
    assert "app.slice" in budget.source and "sidecar.service" not in budget.source


def test_v2_host_path_inside_a_container_falls_back_to_the_mount(tmp_path: Path) -> None:
    # The container's own cgroup is mounted at /sys/fs/cgroup; /proc shows the host's path.
    root = make_root(tmp_path, "0::/kubepods/pod42/abc\n", {"cpu.max": "250000 100000\n"})
    assert cpu_budget(root, affinity=four).count == 3


def test_v1_quota(tmp_path: Path) -> None:
    root = make_root(
        tmp_path,
        "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n",
        {
            "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "150000\n",
            "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        },
    )
    budget = cpu_budget(root, affinity=four)
    assert budget.count == 2
    assert "1.5 CPUs" in budget.source


def test_v1_unlimited_quota_keeps_the_affinity(tmp_path: Path) -> None:
    root = make_root(
        tmp_path,
        "4:cpu,cpuacct:/\n",
        {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"},
    )
    assert cpu_budget(root, affinity=four).count == 4


def test_garbage_files_are_ignored(tmp_path: Path) -> None:
    root = make_root(tmp_path, "0::/\nnonsense\n", {"cpu.max": "lots 0\n"})
    assert cpu_budget(root, affinity=four).count == 4


def test_num_threads_overrides(tmp_path: Path) -> None:
    assert thread_count(Settings(model_path=tmp_path, num_threads=3)) == (3, "NUM_THREADS")
    threads, source = thread_count(Settings(model_path=tmp_path))
    assert (threads, source) == (cpu_budget().count, cpu_budget().source)


def test_session_options_always_set_the_threads_and_spinning() -> None:
    assert session_options(2, True) == {
        "intra_op_num_threads": 2,
        "session.intra_op.allow_spinning": "1",
        "session.inter_op.allow_spinning": "1",
    }
    off = session_options(0, False)
    assert off["intra_op_num_threads"] == cpu_budget().count
    assert off["session.intra_op.allow_spinning"] == "0"


def test_the_sidecar_logs_its_thread_count_and_where_it_came_from(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    log = tmp_path / "sidecar.log"
    with services.sidecar(tiny_model_dir, log, NUM_THREADS="1", THREAD_SPINNING="false") as sidecar:
        lines = [json.loads(line) for line in sidecar.log_lines() if line.startswith("{")]
    (line,) = [line for line in lines if line.get("msg") == "onnxruntime threads"]
    assert (line["threads"], line["source"], line["spinning"]) == (1, "NUM_THREADS", False)
    with services.sidecar(tiny_model_dir, log) as sidecar:
        lines = [json.loads(line) for line in sidecar.log_lines() if line.startswith("{")]
    (line,) = [line for line in lines if line.get("msg") == "onnxruntime threads"]
    assert (line["threads"], line["source"], line["spinning"]) == (
        cpu_budget().count,
        cpu_budget().source,
        True,
    )
