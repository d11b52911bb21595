"""The model folder: is it there, is it usable, and (MODEL_DOWNLOAD=1) fetch it if not.

Every failure is a ModelFolderError whose message is one line that says what to do; /readyz
shows it and the log prints it once.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from sidecar.settings import Settings

log = logging.getLogger("sidecar.model.folder")


class ModelFolderError(Exception):
    """The model folder is missing or broken; str() is one line for /readyz and the log."""


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


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
    (the official builder always writes them next to it as <graph>.data) and the tokenizer."""
    graph = str(config["model"]["decoder"]["filename"])
    return [graph, f"{graph}.data", *TOKENIZER_FILES]


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


def download_if_needed(settings: Settings) -> Path:
    """The folder to load. With MODEL_DOWNLOAD=1 and no complete model in MODEL_PATH, the
    model is downloaded into MODEL_PATH/<MODEL_SUBFOLDER> (download.py's layout: on the next
    start it is found there and not fetched again) and that folder is returned.

    Runs in the model worker, so the web process neither imports huggingface_hub nor spends
    its GIL on the transfer.
    """
    from sidecar.model.download import download_model

    if not settings.model_download or is_complete(settings.model_path):
        return settings.model_path
    log.info(
        "downloading the model",
        extra={
            "fields": {
                "repo_id": settings.model_repo_id,
                "subfolder": settings.model_subfolder,
                "into": str(settings.model_path),
            }
        },
    )
    try:
        return download_model(
            repo_id=settings.model_repo_id,
            subfolder=settings.model_subfolder,
            out_dir=settings.model_path,
            progress=False,
        )
    except Exception as exc:
        raise ModelFolderError(
            f"MODEL_DOWNLOAD=1 but the download failed: {first_line(exc)} "
            "Alternatively, mount the model folder at MODEL_PATH and set MODEL_DOWNLOAD=0."
        ) from exc
