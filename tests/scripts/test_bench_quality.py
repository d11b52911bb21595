"""`python -m scripts.bench quality` on generated models: a folder against itself agrees everywhere
with the same perplexity; a folder that is not a model is refused; --kv-restore measures a
conversation restored from the compact KV encodings, and --exact proves fp32's round trip lossless
(the figures on the real model: tests/realmodel/test_realmodel_kv_restore.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from scripts.bench.quality_kv import Score, exact_failure

REPO = Path(__file__).resolve().parents[2]


def quality(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scripts.bench", "quality", *args, "--json", os.devnull],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_model_against_itself_agrees_everywhere(tiny_model_dir: Path) -> None:
    result = quality("--model", str(tiny_model_dir), "--reference", str(tiny_model_dir))
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    passages = [r for r in rows if re.match(r"\| (\d+|all) \|", r)]
    assert len(passages) == 7  # six passages and the total
    for row in passages:
        _, _, tokens, reference, model, agreement, _ = row.split("|")
        assert int(tokens) > 1 and reference == model and agreement.strip() == "100.0%"
    total = rows[-1].split("|")
    assert total[3].strip() in ("100.0%", "n/a")
    assert total[4].strip() == "8 of 8 replies identical"


def test_a_folder_without_a_model_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = quality("--model", str(tmp_path), "--reference", str(tiny_model_dir))
    assert result.returncode == 2
    assert "has no genai_config.json: not a model folder" in result.stderr


def test_kv_restore_measures_each_encoding_and_fp32_is_lossless(tiny_model_dir: Path) -> None:
    result = quality(
        "--model", str(tiny_model_dir), "--kv-restore", "int8,fp16", "--exact",
        "--timing-tokens", "64",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [line.strip("|").split("|") for line in result.stdout.splitlines()]
    summary = {r[0].strip(): [c.strip() for c in r] for r in rows if len(r) == 10}
    assert list(summary) == ["---", "int8", "fp16", "fp32"]  # the header has escaped bars
    # The tiny model: 2 layers x 4 KV heads x 16 values, K and V.
    assert [summary[e][1] for e in ("int8", "fp16", "fp32")] == ["320", "512", "1,024"]
    assert summary["int8"][2] == "3,355,443 (3.20)" and summary["fp32"][2] == "1,048,576 (1.00)"
    fp32 = summary["fp32"]
    assert fp32[3:5] == ["100.0%", "100.0%"] and fp32[7] == "0" and fp32[9] == "8 of 8"
    for encoding in ("int8", "fp16"):  # lossy on random weights' near ties, yet close
        assert all(90 <= float(cell.rstrip("%")) <= 100 for cell in summary[encoding][3:5])
        assert float(summary[encoding][7]) > 0
    timings = [r for r in rows if len(r) == 3 and r[0].strip() in ("int8", "fp16", "fp32")]
    assert [r[0].strip() for r in timings] == ["int8", "fp16", "fp32"]
    assert all(float(cell) > 0 for r in timings for cell in r[1:])  # ms per 1,000 tokens
    per_text = [r for r in rows if len(r) == 6 and r[0].strip().startswith(("passage", "chat:"))]
    assert len(per_text) == 14  # six passages, eight chats
    assert all(int(r[1]) > 0 and int(r[2]) > 0 for r in per_text)  # positions kept, compared
    assert all(r[5].strip().startswith("100.0%") for r in per_text)  # fp32's column


def test_exact_fails_on_any_difference() -> None:
    scores = {"fp32": {"passage": Score(agree=10, positions=10), "chat": Score()}}
    assert exact_failure(scores) is None  # type: ignore[arg-type]
    scores["fp32"]["passage"].max_diff = 1e-6
    assert "not lossless on the passages" in (exact_failure(scores) or "")  # type: ignore[arg-type]
    scores["fp32"]["passage"].max_diff = 0.0
    scores["fp32"]["chat"] = Score(replies=8, identical=7)
    assert exact_failure(scores) == "fp32 restore changed 1 greedy replies"  # type: ignore[arg-type]


def test_kv_restore_arguments_are_checked(tiny_model_dir: Path) -> None:
    model = str(tiny_model_dir)
    result = quality("--model", model, "--kv-restore", "int4")
    assert result.returncode == 2 and "unknown encoding ['int4']" in result.stderr
    result = quality("--model", model, "--reference", model, "--kv-restore", "int8")
    assert result.returncode == 2 and "leave out --reference" in result.stderr
    result = quality("--model", model)
    assert result.returncode == 2 and "--reference is required" in result.stderr
