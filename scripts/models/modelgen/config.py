"""The model's shape (with the presets) and the files that describe it: genai_config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.models.modelgen.vocab import PHI3_VOCAB, special_ids

FILENAME = "phi3-mini-4k-instruct-cpu-int4-rtn-block-32-acc-level-4.onnx"


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    context: int

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads


KV_CACHE_TYPES = ("fp32", "int8_per_tensor", "int8_per_channel")
BLOCK_SIZES = (16, 32, 64, 128, 256)  # MatMulNBits' block sizes (the builder's block_size)


@dataclass(frozen=True)
class Variant:
    """How the weights and caches are stored: the official builder's options of the same names.
    The default is the published Phi-3 int4 CPU model."""

    block_size: int = 32  # int4 block of every MatMulNBits (the builder's block_size)
    int4_embedding: bool = False  # GatherBlockQuantized instead of an fp32 Gather
    prune_lm_head: bool = False  # logits of the last position only
    kv_cache: str = "fp32"  # the builder's kv_cache_quant_scheme (fp32: none)

    def __post_init__(self) -> None:
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block size {self.block_size} is not one of {BLOCK_SIZES}")
        if self.kv_cache not in KV_CACHE_TYPES:
            raise ValueError(f"KV cache type {self.kv_cache!r} is not one of {KV_CACHE_TYPES}")

    @property
    def quantized_kv(self) -> bool:
        return self.kv_cache != "fp32"


PRESETS = {
    "tiny": Shape(64, 2, 4, 4, 128, 1024, 4096),
    "small": Shape(512, 8, 8, 8, 1536, 8192, 4096),
    "phi3-mini": Shape(3072, 32, 32, 32, 8192, PHI3_VOCAB, 4096),
}

# Prompts (user messages, rendered with the chat template, no system message, greedy search)
# whose replies on the `tiny` preset with the default seed are known; tests/models checks them.
EOS_PROMPT = "How."  # " sc谢 tj hd" (4 tokens, one CJK), then <|end|>
LONG_PROMPT = "Hello"  # no <|end|> within 256 tokens; Arabic, CJK, Hangul, accents


def genai_config(shape: Shape, variant: Variant | None = None) -> dict[str, Any]:
    ids = special_ids(shape.vocab)
    # A quantized KV cache cannot share one buffer for past and present on the CPU (the
    # builder turns sharing off for it too).
    share_buffer = not (variant and variant.quantized_kv)
    return {
        "model": {
            "bos_token_id": 1,
            "context_length": shape.context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": FILENAME,
                "head_size": shape.head_size,
                "hidden_size": shape.hidden,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": shape.heads,
                "num_hidden_layers": shape.layers,
                "num_key_value_heads": shape.kv_heads,
            },
            "eos_token_id": [ids["<|endoftext|>"], ids["<|assistant|>"], ids["<|end|>"]],
            "pad_token_id": ids["<|endoftext|>"],
            "type": "phi3",
            "vocab_size": shape.vocab,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": shape.context,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": share_buffer,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }


def dump_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=4, ensure_ascii=False) + "\n")
