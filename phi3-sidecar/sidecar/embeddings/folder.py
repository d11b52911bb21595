"""What an encoder folder holds, read from its own sentence-transformers configuration.

The folder is a sentence-transformers model folder (the layout of its Hugging Face repository)
with the ONNX export beside it:

- `onnx/model.onnx` (or `model.onnx`): inputs `input_ids`, `attention_mask` and optionally
  `token_type_ids`; the first output is the tokens' hidden states `[batch, tokens, width]`;
- `tokenizer.json` (the `tokenizers` library's file: normalizer, WordPiece, [CLS] ... [SEP]);
- `modules.json`: Transformer, then Pooling (its folder's `config.json` says CLS, mean, max or
  mean-sqrt-len), then optionally Normalize. Other modules (Dense, ...) are refused at load
  rather than skipped: the vectors would be wrong;
- `sentence_bert_config.json` `max_seq_length`: the tokens one input may have (else
  `tokenizer_config.json`'s `model_max_length`, capped by `config.json`'s
  `max_position_embeddings`);
- `config_sentence_transformers.json` `prompts` (optional): the text the model was trained to
  read before a query or a passage (`{"query": "query: ", "passage": "passage: "}` for the e5
  family), which sentence-transformers writes before a text when asked by the prompt's name.
  The sidecar writes one when a request names it (`input_type`, web/embeddings/api.py).
  Its `default_prompt_name` is not applied: a request without `input_type` is read as sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Pooling = Literal["cls", "mean", "max", "mean_sqrt_len"]
ONNX_NAMES = ("onnx/model.onnx", "model.onnx")
_MODULE = "sentence_transformers.models."
_POOLING_KEYS: dict[str, Pooling] = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
}


class EncoderFolderError(Exception):
    """The folder is not an encoder this sidecar can serve; str() is one sentence."""


@dataclass(frozen=True)
class EncoderSpec:
    folder: Path
    onnx: Path
    tokenizer: Path
    pooling: Pooling
    normalize: bool
    max_tokens: int  # tokens one input may have, [CLS] and [SEP] included
    dimensions: int  # the width of a vector
    # Prompt name ("query", "passage") -> the text written before an input of that kind
    prompts: Mapping[str, str] = field(default_factory=dict)


def read_spec(folder: Path, *, graph: bool = True) -> EncoderSpec:
    """The folder's encoder; `graph` False: its sentence-transformers configuration only (a
    folder not exported yet, as scripts/models/make_real_model.py reads it)."""
    if not folder.is_dir():
        raise EncoderFolderError(f"{folder} is not a folder")
    onnx = next((folder / n for n in ONNX_NAMES if (folder / n).is_file()), None)
    if onnx is None and graph:
        raise EncoderFolderError(f"{folder} holds no {' or '.join(ONNX_NAMES)}")
    tokenizer = folder / "tokenizer.json"
    if not tokenizer.is_file():
        raise EncoderFolderError(f"{folder} holds no tokenizer.json")
    modules = _json(folder / "modules.json")
    if not isinstance(modules, list):
        raise EncoderFolderError(f"{folder}/modules.json is not a list of modules")
    kinds = [str(m.get("type", "")).removeprefix(_MODULE) for m in modules if isinstance(m, dict)]
    unknown = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if unknown or kinds[:2] != ["Transformer", "Pooling"]:
        raise EncoderFolderError(
            f"{folder}/modules.json: only Transformer, Pooling and Normalize are served "
            f"(found {', '.join(kinds) or 'none'})"
        )
    pooling_dir = folder / str(modules[1].get("path") or "1_Pooling")
    pooling_config = _json(pooling_dir / "config.json")
    modes = [mode for key, mode in _POOLING_KEYS.items() if pooling_config.get(key)]
    if len(modes) != 1:
        raise EncoderFolderError(
            f"{pooling_dir}/config.json: exactly one pooling mode is served (found {modes})"
        )
    config = _json_or_empty(folder / "config.json")
    width = pooling_config.get("word_embedding_dimension") or config.get("hidden_size")
    if not isinstance(width, int) or width < 1:
        raise EncoderFolderError(f"{folder}: no vector width (word_embedding_dimension)")
    return EncoderSpec(
        folder=folder,
        onnx=onnx or folder / ONNX_NAMES[0],
        tokenizer=tokenizer,
        pooling=modes[0],
        normalize="Normalize" in kinds,
        max_tokens=_max_tokens(folder, config),
        dimensions=width,
        prompts=_prompts(folder),
    )


def _max_tokens(folder: Path, config: dict[str, Any]) -> int:
    positions = config.get("max_position_embeddings")
    limit = _json_or_empty(folder / "sentence_bert_config.json").get("max_seq_length")
    if not isinstance(limit, int):
        limit = _json_or_empty(folder / "tokenizer_config.json").get("model_max_length")
    if not isinstance(limit, int) or limit > 1_000_000:  # transformers' "no limit" sentinel
        limit = positions
    if isinstance(positions, int):
        limit = min(limit, positions) if isinstance(limit, int) else positions
    if not isinstance(limit, int) or limit < 2:
        raise EncoderFolderError(f"{folder}: no token limit (sentence_bert_config.json)")
    return limit


def _prompts(folder: Path) -> dict[str, str]:
    prompts = _json_or_empty(folder / "config_sentence_transformers.json").get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise EncoderFolderError(
            f"{folder}/config_sentence_transformers.json: prompts must map names to texts"
        )
    return {name: text for name, text in prompts.items() if text}


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EncoderFolderError(f"{path} is missing") from None
    except (OSError, ValueError) as error:
        raise EncoderFolderError(f"{path} cannot be read: {type(error).__name__}") from None


def _json_or_empty(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = _json(path)
    return data if isinstance(data, dict) else {}


def is_complete(folder: Path) -> bool:
    """Whether the folder looks servable (for the download: nothing to fetch)."""
    try:
        read_spec(folder)
    except EncoderFolderError:
        return False
    return True
