"""tokenizer.json and tokenizer_config.json rebuilt from a GGUF's vocabulary.

A `gpt2`-model GGUF holds a byte-level BPE: every token (in id order), its type, and the merges
as "left right" strings. Tokens of type CONTROL become special added tokens (<|im_start|>, ...),
USER_DEFINED ones plain added tokens, so text never splits them. The pre-tokenizer is not in
the file, only its name (`tokenizer.ggml.pre`): each name this converter knows maps to the
Hugging Face pre-tokenizer llama.cpp took it from. SmolLM2's `smollm` splits every digit on its
own, then applies GPT-2's byte-level split.
"""

from __future__ import annotations

import json
from typing import Any

from scripts.models.hfgen.model import added_tokens_decoder
from scripts.models.realmodel.gguf_file import GgufError, GgufModel

NORMAL, CONTROL, USER_DEFINED = 1, 3, 4
PRE_TOKENIZERS = ("smollm", "gpt-2")


def _pre_tokenizer(name: str) -> Any:
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if name == "gpt-2":
        return byte_level
    raise GgufError(f"pre-tokenizer {name!r} is not supported (only {', '.join(PRE_TOKENIZERS)})")


def build_tokenizer(model: GgufModel) -> dict[str, Any]:
    """tokenizer.json's content."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    kind = model.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GgufError(f"tokenizer model {kind!r} is not supported (only gpt2, byte-level BPE)")
    tokens: list[str] = list(model.get("tokenizer.ggml.tokens"))
    types: list[int] = [int(t) for t in model.get("tokenizer.ggml.token_type")]
    merges = [tuple(m.split(" ", 1)) for m in model.get("tokenizer.ggml.merges")]
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GgufError("the GGUF's vocabulary repeats a token")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(str(model.get("tokenizer.ggml.pre")))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    added = [
        (t, kind == CONTROL)
        for t, kind in zip(tokens, types, strict=True)
        if kind in (CONTROL, USER_DEFINED)
    ]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, s in added if s])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, s in added if not s])
    data: dict[str, Any] = json.loads(tok.to_str())
    return data


def tokenizer_config(model: GgufModel, data: dict[str, Any]) -> dict[str, Any]:
    """tokenizer_config.json's content: the added tokens, the special ones by name, the chat
    template."""
    tokens: list[str] = list(model.get("tokenizer.ggml.tokens"))

    def token(which: str) -> str | None:
        index = model.metadata.get(f"tokenizer.ggml.{which}_token_id")
        return None if index is None else tokens[int(index)]

    return {
        "added_tokens_decoder": added_tokens_decoder(data),
        "add_bos_token": bool(model.metadata.get("tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "bos_token": token("bos"),
        "chat_template": model.get("tokenizer.chat_template"),
        "clean_up_tokenization_spaces": False,
        "eos_token": token("eos"),
        "model_max_length": int(model.get("llama.context_length")),
        "pad_token": token("padding"),
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": token("unknown"),
    }


def end_of_turn_id(model: GgufModel) -> int | None:
    """The id of <|im_end|> or <|eot_id|>-like tokens the template closes a turn with, if the
    GGUF names one (tokenizer.ggml.eot_token_id), else the ChatML end if it is a control token."""
    named = model.metadata.get("tokenizer.ggml.eot_token_id")
    if named is not None:
        return int(named)
    tokens: list[str] = list(model.get("tokenizer.ggml.tokens"))
    return tokens.index("<|im_end|>") if "<|im_end|>" in tokens else None
