"""The store benchmark's shape (not its speed): the in-process figures on SQLite, and what
storing adds to TTFT through POST /chat on the tiny model (gunicorn and a sidecar)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from scripts.bench import store


def _args(**overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "engines": "sqlite",
        "users": 3,
        "chats": 2,
        "messages": 4,
        "long": 12,
        "runs": 3,
        "chat_runs": 0,
        "preset": "tiny",
        "model": None,
        "max_new_tokens": 2,
    }
    return argparse.Namespace(**{**values, **overrides})


def test_in_process_figures(capsys: pytest.CaptureFixture[str]) -> None:
    result = store.main(_args())
    figures = result["engines"]["sqlite"]
    assert set(figures) >= {
        "open 12-message chat",
        "chat list",
        "search",
        "turn read, 4-message chat",
    }
    assert all(f["p95"] >= f["p50"] > 0 for f in figures.values())
    assert "through_chat" not in result
    assert "turn read, 12-message chat" in capsys.readouterr().out


def test_through_chat_pairs_a_stored_turn_with_the_same_turn_sent(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = store.main(_args(chat_runs=3, model=str(tiny_model_dir), runs=1))
    rows = result["through_chat"]["sqlite"]
    assert set(rows) == {"4 stored messages", "12 stored messages"}
    assert rows["12 stored messages"]["prompt_tokens"] > rows["4 stored messages"]["prompt_tokens"]
    for row in rows.values():
        assert row["pairs"] == 3
        assert row["prompt_tokens"] > 0  # both sides read it whole (same_work checks each pair)
        assert row["chat_id_p50"] > 0 and row["sent_p50"] > 0
        assert row["storing_adds_p50"] == pytest.approx(row["chat_id_p50"] - row["sent_p50"])
    out = capsys.readouterr().out
    assert "storing adds" in out and "through POST /chat" in out
