"""`python -m scripts.bench speech` on one short clip, the tiny chat model and the real Whisper
tiny.en: its table and JSON have every figure (no timing asserted; the words are counted)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.bench.speech import faq_sentences, word_errors

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")


def test_word_errors_and_the_faq() -> None:
    assert word_errors("Is Python a good language?", "is python a good language") == (0, 5)
    assert word_errors("one two three", "one three four") == (2, 3)
    sentences = faq_sentences()
    assert len(sentences) > 100 and all(6 <= len(s.split()) <= 30 for s in sentences)


def test_the_question_measures_every_figure(
    tiny_model_dir: Path, whisper_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "speech.json"
    command = [sys.executable, "-m", "scripts.bench", "speech", "--model", str(tiny_model_dir)]
    options = ["--whisper", str(whisper_dir), "--clips", "1", "--clip-seconds", "6"]
    options += ["--long-seconds", "10", "--reps", "1", "--chats", "1", "--chat-tokens", "8"]
    result = subprocess.run(
        [*command, *options, "--json", str(out)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    assert data["benchmark"]["question"] == "speech" and data["benchmark"]["cpu"] in result.stdout
    (clip,) = data["clips"]
    assert clip["audio_s"] > 3 and clip["rtf"] > 0 and clip["bare_s"] > 0
    assert clip["words"] > 10 and clip["word_edits"] <= clip["words"]
    assert 0 <= data["wer"] <= 1 and data["chat"]["alone_tok_s"] > 0
    assert "word error rate" in result.stdout and "route/bare" in result.stdout
