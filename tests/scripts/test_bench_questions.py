"""The smaller questions of `python -m scripts.bench` end to end on the tiny model, each through
the command line: it prints its table and writes its JSON (with the CPU and the date). No timing
is asserted; counts are. (images runs on the tiny vision model; store on SQLite and the
embedded PostgreSQL, no model; hops, peers, users,
users-turns, variants, quality and guidance have test files of their own; container-start
needs podman images and kv-memory root.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def ask(question: str, tmp_path: Path, *args: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / f"{question}.json"
    result = subprocess.run(
        [sys.executable, "-m", "scripts.bench", question, *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    assert data["benchmark"]["question"] == question
    assert data["benchmark"]["cpu"] in result.stdout and data["benchmark"]["started"]
    return data, result.stdout


def test_turns_of_one_chat_cache_on_and_off(tiny_model_dir: Path, tmp_path: Path) -> None:
    data, printed = ask(
        "turns", tmp_path, "--model", str(tiny_model_dir), "--reps", "1",
        "--turn-words", "12", "--reply-tokens", "6", "--pause", "0",
    )  # fmt: skip
    turns = data["turns"]
    assert [row["turn"] for row in turns] == [1, 2, 3, 4, 5]
    assert turns[0]["cached_tokens"] == 0
    assert all(row["cached_tokens"] > 0 for row in turns[1:])  # the cache on continues
    assert all(len(row["samples"]["off"]) == 1 for row in turns)
    assert "Conversation cache" in printed and "| 5 |" in printed


def test_health_latency_sorts_probes_into_phases(tiny_model_dir: Path, tmp_path: Path) -> None:
    data, printed = ask(
        "health-latency", tmp_path, "--model", str(tiny_model_dir), "--prompt-repeats", "20",
        "--max-new-tokens", "16", "--idle-seconds", "0.3",
    )  # fmt: skip
    assert data["phases"]["idle"]["probes"] > 0
    assert "| idle |" in printed


def test_slow_clients_are_held_and_the_chat_answers(tmp_path: Path) -> None:
    data, printed = ask(
        "slow-clients", tmp_path, "--sidecar", "--idle", "4", "--drip", "2",
        "--stalled-body", "2", "--seconds", "2",
    )  # fmt: skip
    assert data["connections"] == {"idle": 4, "drip": 2, "stalled_body": 2, "endless_body": 0}
    assert data["chat_s"] is not None and data["health_failures"] == 0
    assert "one chat: done" in printed


def test_tracing_measures_three_pairs(tiny_model_dir: Path, tmp_path: Path) -> None:
    data, printed = ask(
        "tracing", tmp_path, "--model", str(tiny_model_dir), "--rounds", "3", "--new-tokens", "4"
    )
    assert list(data["pairs"]) == ["off", "on", "off-again"]
    assert all(pair["web_cpu_ms_per_chat"] > 0 for pair in data["pairs"].values())
    assert "| on |" in printed


def test_images_counts_each_image_as_the_formula_does(
    tiny_vision_model_dir: Path, tmp_path: Path
) -> None:
    data, printed = ask(
        "images", tmp_path, "--model", str(tiny_vision_model_dir), "--reps", "1",
        "--sizes", "336x336,640x480",
    )  # fmt: skip
    rows = data["rows"]
    assert [row["size"] for row in rows] == ["336x336", "640x480"]
    # what the sidecar reports (the processor's count) is the formula's
    assert all(row["image_tokens"] == row["formula_tokens"] > 1000 for row in rows)
    assert all(row["prompt_tokens"] > row["image_tokens"] for row in rows)
    assert data["clip_encoder_estimate_s"] > 0 and "CLIP ViT-L/14" in printed


def test_store_measures_each_figure_on_both_engines(tmp_path: Path) -> None:
    data, printed = ask(
        "store", tmp_path, "--users", "3", "--chats", "3", "--messages", "4", "--long", "12",
        "--runs", "3",
    )  # fmt: skip
    for engine in ("sqlite", "postgresql"):
        figures = data["engines"][engine]
        assert set(figures) == {
            "open 12-message chat",
            "chat list",
            "search",
            "turn read, 4-message chat",
            "turn read, 12-message chat",
            "turn write (after the reply)",
        }
        assert all(row["p95"] >= row["p50"] > 0 for row in figures.values())
    assert "postgresql  chat list" in printed


def test_first_word_of_a_new_chat(tiny_model_dir: Path, tmp_path: Path) -> None:
    data, printed = ask(
        "first-word", tmp_path, "--model", str(tiny_model_dir), "--fill-tokens", "300",
        "--prefix-tokens", "120", "--reply-tokens", "4", "--idle-s", "2",
    )  # fmt: skip
    rows = {row["row"]: row for row in data["rows"]}
    assert len(rows) == 5 and "| new chat | prompt tokens |" in printed
    assert rows["shared prefix + question"]["cache_reason"] == "shared"
    assert rows["shared prefix + question"]["cached_tokens"] == 0  # not counted
    assert rows["question alone"]["cache_reason"] == "miss"
    assert all(row["ttft_s"] > 0 for row in rows.values())


def test_prefill_calls_one_against_several(tiny_model_dir: Path, tmp_path: Path) -> None:
    data, printed = ask(
        "prefill-calls", tmp_path, "--model", str(tiny_model_dir), "--tokens", "100",
        "--chunks", "16,512", "--reps", "1",
    )  # fmt: skip
    calls = {row["reading"]: row["calls"] for row in data["rows"]}
    assert calls == {
        "engine (one append)": 1, "decoder, chunks of 16": 7, "decoder, chunks of 512": 1,
    }  # fmt: skip
    assert all(row["cpu_s"] > 0 for row in data["rows"]) and "| reading | calls |" in printed
