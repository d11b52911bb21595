"""The model folder: is it there, and is it usable (download.py fetches one that is not there).

Every failure is a ModelFolderError whose message is one line that says what to do; /readyz
shows it and the log prints it once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class ModelFolderError(Exception):
    """The model folder is missing or broken; str() is one line for /readyz and the log."""


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# A multimodal model's graphs besides its decoder (genai_config.json's sections)
OTHER_PARTS = ("embedding", "vision", "speech")


def first_line(error: BaseException | str, limit: int = 300) -> str:
    """An error's first line (its type's name if it has no text), at most `limit` characters:
    what /readyz and a log line can show of an exception from a library."""
    text = str(error).strip()
    line = (
        text.splitlines() or [type(error).__name__ if isinstance(error, BaseException) else ""]
    )[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def model_files(config: dict[str, Any]) -> list[str]:
    """The files a model folder holds besides genai_config.json: the decoder graph, its weights
    (the official builder always writes them next to it as <graph>.data), a vision model's
    other graphs (embedding, vision, speech) and its processor's configuration, and the
    tokenizer. (The other graphs' weights may live in files of their own or in the decoder's,
    as the generated tiny-vision model's embedding does: the graph names them, not the
    configuration.)"""
    model = config["model"]
    graph = str(model["decoder"]["filename"])
    files = [graph, f"{graph}.data"]
    for section in OTHER_PARTS:
        part = model.get(section)
        if isinstance(part, dict):
            files += [str(part[key]) for key in ("filename", "config_filename") if part.get(key)]
    return [*files, *TOKENIZER_FILES]


def multimodal(config: dict[str, Any]) -> bool:
    """Whether genai_config.json describes more than a decoder (a vision or speech model)."""
    return any(isinstance(config["model"].get(section), dict) for section in OTHER_PARTS)


def read_genai_config(path: Path) -> dict[str, Any]:
    """The parsed genai_config.json, checked for what loading needs before onnxruntime-genai
    is asked (anything else it reports itself, as 'could not load the model')."""
    if not path.is_dir():
        raise ModelFolderError(
            f"MODEL_PATH {str(path)!r} is not a folder: mount the model folder there, "
            "or set MODEL_DOWNLOAD=1 to download it on start"
        )
    config_file = path / "genai_config.json"
    if not config_file.is_file():
        raise ModelFolderError(
            f"MODEL_PATH {str(path)!r} has no genai_config.json: point MODEL_PATH at the folder "
            "that holds it (for Phi-3: .../cpu_and_mobile/cpu-int4-rtn-block-32-acc-level-4)"
        )
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        int(config["model"]["context_length"])
        graph = model_files(config)[0]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelFolderError(
            f"{config_file} is unreadable or not a genai_config.json "
            f"({type(exc).__name__}); download the model folder again"
        ) from exc
    if not (path / graph).is_file():
        raise ModelFolderError(
            f"MODEL_PATH {str(path)!r} lacks {graph}, which genai_config.json names: the "
            "folder is incomplete; copy or download the whole model folder again"
        )
    return config


def is_complete(path: Path) -> bool:
    """True when `path` holds a whole model folder: genai_config.json and every file of
    model_files(), none empty. The Hub client writes each file under a temporary name and
    renames it when complete, so a file that exists with a non-zero size is whole."""
    try:
        config = json.loads((path / "genai_config.json").read_text(encoding="utf-8"))
        files = model_files(config)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return all((path / name).is_file() and (path / name).stat().st_size > 0 for name in files)


def read_json(path: Path) -> object:
    """A JSON file, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
