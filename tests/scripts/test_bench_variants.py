"""`python -m scripts.bench variants` on the tiny shapes: the speed and drafts tables are printed
with a row per variant and the KV bytes each variant really costs. No timing is asserted (this
machine is noisy); the point is that the one-command tables keep working."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = ["-m", "scripts.bench", "variants"]


def run(*args: str) -> str:
    json_path = Path(args[args.index("--work-dir") + 1]) / "variants.json"
    result = subprocess.run(
        [sys.executable, *SCRIPT, *args, "--json", str(json_path)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def rows(output: str) -> dict[str, list[str]]:
    lines = [line for line in output.splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[0]: cells[1:] for cells in (line.strip("| ").split(" | ") for line in lines)}


def test_speed_table_on_tiny_shapes(tmp_path: Path) -> None:
    work = tmp_path / "work"
    output = run(
        "speed", "--preset", "tiny", "--variants", "block-64,kv-int8", "--reps", "1",
        "--prompt-tokens", "24", "--new-tokens", "6", "--work-dir", str(work),
    )  # fmt: skip
    table = rows(output)
    assert set(table) == {"variant", "block-64", "kv-int8"}
    kv_bytes = table["variant"].index("KV bytes/token")
    fp32 = 2 * 2 * 4 * 16 * 4  # layers, K and V, KV heads, head size, fp32
    assert table["kv-int8"][kv_bytes] == f"{fp32 // 4:,} / {fp32:,}"
    assert table["block-64"][kv_bytes] == f"{fp32:,} / {fp32:,}"
    assert sorted(p.name for p in work.iterdir()) == ["tiny-default", "variants.json"]
    measured = json.loads((work / "variants.json").read_text())["rows"]
    assert [row["variant"] for row in measured] == ["block-64", "kv-int8"]


def test_drafts_table_on_tiny_shapes(tmp_path: Path) -> None:
    output = run(
        "drafts", "--preset", "tiny", "--skip-real", "--reps", "1", "--new-tokens", "32",
        "--work-dir", str(tmp_path),
    )  # fmt: skip
    (row,) = [cells for name, cells in rows(output).items() if name.startswith("tiny shapes")]
    assert row[-1] == "yes"  # greedy replies the same with drafts on and off


def test_unknown_variants_are_refused() -> None:
    result = subprocess.run(
        [sys.executable, *SCRIPT, "speed", "--variants", "block-512", "--json", "unused.json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "unknown variants: block-512" in result.stderr
