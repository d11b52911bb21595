"""What a speech model folder must hold: a Whisper model converted to CTranslate2's form, as
Systran publishes them (faster-whisper-tiny.en and siblings) and as
`python -m scripts.models.make_real_model --model whisper-tiny-en` writes one."""

from __future__ import annotations

import json
from pathlib import Path

FILES = ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt")


class SpeechFolderError(Exception):
    """The folder is not a speech model this sidecar can serve; str() is one sentence."""


def check_folder(folder: Path) -> None:
    """SpeechFolderError unless `folder` holds FILES and a readable config.json."""
    if not folder.is_dir():
        raise SpeechFolderError(f"{folder} is not a folder")
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise SpeechFolderError(
            f"{folder} holds no {', '.join(missing)}: not a Whisper model in CTranslate2's form"
        )
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise SpeechFolderError(f"{folder}/config.json is not JSON") from None
    if not isinstance(config, dict) or "suppress_ids" not in config:
        raise SpeechFolderError(f"{folder}/config.json is not a Whisper model's configuration")
