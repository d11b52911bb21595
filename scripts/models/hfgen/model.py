"""Write a tiny random Hugging Face model folder of one family: config.json,
generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
special_tokens_map.json, as the family's published repository lays them out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scripts.models.hfgen.families import TINY, Family
from scripts.models.hfgen.tokenizer import build_tokenizer


def make_hf_model(family: Family, out: Path, seed: int = 0) -> Path:
    """Write the folder (created); same family and seed, same files. Returns `out`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    data = build_tokenizer(family.style, family.merges, family.leading, family.specials, family.bos)
    _dump(out / "tokenizer.json", data)
    ids = {entry["content"]: entry["id"] for entry in data["added_tokens"]}
    vocab_size = max(max(data["model"]["vocab"].values()), *ids.values()) + 1
    vocab_size += -vocab_size % 16  # padded, as the published vocabularies are

    def id_of(token: str | None) -> int | None:
        return None if token is None else ids[token]

    config = AutoConfig.for_model(
        family.model_type,
        **(TINY | family.config),
        vocab_size=vocab_size,
        bos_token_id=id_of(family.bos),
        eos_token_id=_one_or_list([ids[t] for t in family.config_eos]),
        pad_token_id=id_of(family.pad),
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        for token in {family.end_of_turn, *family.generation_eos}:
            head[ids[token]] *= family.eot_boost
    model.generation_config.eos_token_id = _one_or_list([ids[t] for t in family.generation_eos])
    model.generation_config.bos_token_id = id_of(family.bos)
    model.save_pretrained(out)
    _dump(out / "tokenizer_config.json", _tokenizer_config(family, data))
    specials_map = {
        key: value
        for key, value in {
            "bos_token": family.bos,
            "eos_token": family.eos,
            "pad_token": family.pad,
            "unk_token": family.unk,
        }.items()
        if value is not None
    }
    _dump(out / "special_tokens_map.json", specials_map)
    return out


def added_tokens_decoder(tokenizer_json: dict[str, Any]) -> dict[str, Any]:
    """tokenizer_config.json's `added_tokens_decoder` for the added tokens of a tokenizer.json."""
    return {
        str(entry["id"]): {
            "content": entry["content"],
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": entry["special"],
        }
        for entry in tokenizer_json["added_tokens"]
    }


def _tokenizer_config(family: Family, data: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "added_tokens_decoder": added_tokens_decoder(data),
        "bos_token": family.bos,
        "chat_template": family.chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": family.eos,
        "model_max_length": family.config["max_position_embeddings"],
        "pad_token": family.pad,
        "tokenizer_class": family.tokenizer_class,
        "unk_token": family.unk,
        **family.extra_tokenizer_config,
    }
    if family.add_bos_token is not None:
        config |= {"add_bos_token": family.add_bos_token, "add_eos_token": False}
    return config


def _one_or_list(ids: list[int]) -> int | list[int]:
    return ids[0] if len(ids) == 1 else ids


def _dump(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
