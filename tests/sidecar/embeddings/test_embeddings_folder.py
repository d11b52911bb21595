"""sidecar/embeddings/folder.py: what an encoder folder's sentence-transformers files say, and
each folder it refuses, with the sentence the log and /readyz show."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from scripts.models.make_encoder import make_encoder
from sidecar.embeddings.folder import EncoderFolderError, is_complete, read_spec


@pytest.fixture
def folder(tiny_encoder_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "encoder"
    shutil.copytree(tiny_encoder_dir, copy)
    return copy


def edit(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_the_tiny_encoder_s_spec(folder: Path) -> None:
    spec = read_spec(folder)
    assert (spec.pooling, spec.normalize, spec.max_tokens, spec.dimensions) == (
        "mean",
        True,
        32,
        32,
    )
    assert spec.onnx == folder / "onnx" / "model.onnx" and is_complete(folder)


def test_cls_pooling_without_normalize(tmp_path: Path) -> None:
    folder = make_encoder(tmp_path / "cls", pooling="cls")
    modules = json.loads((folder / "modules.json").read_text())[:2]
    (folder / "modules.json").write_text(json.dumps(modules))
    spec = read_spec(folder)
    assert spec.pooling == "cls" and spec.normalize is False


def test_the_limit_falls_back_to_the_tokenizer_and_is_capped_by_positions(folder: Path) -> None:
    (folder / "sentence_bert_config.json").unlink()
    edit(folder / "tokenizer_config.json", model_max_length=10**30)  # transformers' "none"
    assert read_spec(folder).max_tokens == 64  # config.json's max_position_embeddings
    edit(folder / "tokenizer_config.json", model_max_length=48)
    assert read_spec(folder).max_tokens == 48


def test_prompts_are_read_from_config_sentence_transformers(folder: Path) -> None:
    """sentence-transformers' own file names the prompts (e5's); an empty one is no prompt, and
    a folder without the file (the tiny encoder, all-MiniLM-L6-v2) has none."""
    assert read_spec(folder).prompts == {}
    prompts = {"query": "query: ", "passage": "passage: ", "classification": ""}
    config = {"prompts": prompts, "default_prompt_name": None}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config))
    assert read_spec(folder).prompts == {"query": "query: ", "passage": "passage: "}
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": None}))
    assert read_spec(folder).prompts == {}


@pytest.mark.parametrize(
    ("breaks", "says"),
    [
        (lambda f: (f / "onnx" / "model.onnx").unlink(), "holds no onnx/model.onnx"),
        (lambda f: (f / "tokenizer.json").unlink(), "holds no tokenizer.json"),
        (lambda f: (f / "modules.json").unlink(), "modules.json is missing"),
        (lambda f: (f / "modules.json").write_text("{"), "cannot be read"),
        (
            lambda f: (f / "modules.json").write_text(
                json.dumps(
                    [
                        {"path": "", "type": "sentence_transformers.models.Transformer"},
                        {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                        {"path": "2_Dense", "type": "sentence_transformers.models.Dense"},
                    ]
                )
            ),
            "only Transformer, Pooling and Normalize",
        ),
        (
            lambda f: edit(f / "1_Pooling" / "config.json", pooling_mode_cls_token=True),
            "exactly one pooling mode",
        ),
        (
            lambda f: (f / "config_sentence_transformers.json").write_text(
                json.dumps({"prompts": {"query": 3}})
            ),
            "prompts must map names to texts",
        ),
    ],
)
def test_what_is_refused(folder: Path, breaks: object, says: str) -> None:
    breaks(folder)  # type: ignore[operator]
    with pytest.raises(EncoderFolderError, match=says):
        read_spec(folder)
    assert not is_complete(folder)
