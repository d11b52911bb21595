"""A GGUF llama model as a Hugging Face folder: config.json (LlamaForCausalLM),
model.safetensors (float32) and generation_config.json; tokenizer.py writes the tokenizer.

llama.cpp's converter permutes the rows of each head of the q and k projections: Hugging Face's
llama rotates the two halves of a head (rotate_half), ggml's rope rotates adjacent pairs, so it
interleaves the halves (row i of the first half goes to 2i, of the second to 2i + 1). Reading
them back, the interleaving is undone (`unpermute`), per head: 9 heads for q, 3 (the KV heads)
for k in SmolLM2-135M. Without it the model loads and talks nonsense.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from scripts.models.realmodel.gguf_file import GgufError, GgufModel

LAYER = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")
# GGUF name (per layer) -> Hugging Face name under model.layers.N.
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def permute(weights: NDArray[np.float32], heads: int) -> NDArray[np.float32]:
    """llama.cpp's permutation of a q or k projection (rows: heads x head_dim)."""
    rows = weights.shape[0]
    return np.ascontiguousarray(
        weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def unpermute(weights: NDArray[np.float32], heads: int) -> NDArray[np.float32]:
    """The inverse of `permute`: Hugging Face's row order back."""
    rows = weights.shape[0]
    if rows % (2 * heads):
        raise GgufError(f"{rows} rows are not {heads} heads of an even size")
    return np.ascontiguousarray(
        weights.reshape(heads, rows // heads // 2, 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def llama_config(model: GgufModel) -> dict[str, Any]:
    """config.json of the GGUF's llama model (tied embeddings when it has no output.weight)."""
    arch = model.get("general.architecture")
    if arch != "llama":
        raise GgufError(f"architecture {arch!r} is not supported (only llama)")
    heads = int(model.get("llama.attention.head_count"))
    hidden = int(model.get("llama.embedding_length"))
    vocab = len(model.get("tokenizer.ggml.tokens"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(model.get("llama.feed_forward_length")),
        "num_hidden_layers": int(model.get("llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(model.metadata.get("llama.attention.head_count_kv", heads)),
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": int(model.get("llama.context_length")),
        "rms_norm_eps": float(model.get("llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(model.metadata.get("llama.rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in model.tensors,
        "bos_token_id": _id(model, "bos"),
        "eos_token_id": _id(model, "eos"),
        "pad_token_id": _id(model, "padding"),
        "torch_dtype": "float32",
        "use_cache": True,
    }


def hf_tensors(model: GgufModel, config: dict[str, Any]) -> dict[str, NDArray[np.float32]]:
    """Every tensor under its Hugging Face name, q and k rows in Hugging Face's order."""
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out: dict[str, NDArray[np.float32]] = {}
    for name, weights in model.tensors.items():
        if name in TOP_NAMES:
            out[TOP_NAMES[name]] = weights
            continue
        match = LAYER.match(name)
        if match is None or match[2] not in LAYER_NAMES:
            raise GgufError(f"tensor {name} has no place in a llama model")
        layer, part = match[1], match[2]
        if part in heads:
            weights = unpermute(weights, heads[part])
        out[f"model.layers.{layer}.{LAYER_NAMES[part]}.weight"] = weights
    return out


def generation_config(config: dict[str, Any], end_of_turn: int | None) -> dict[str, Any]:
    eos = [config["eos_token_id"]]
    if end_of_turn is not None and end_of_turn not in eos:
        eos.append(end_of_turn)
    return {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": eos[0] if len(eos) == 1 else eos,
        "pad_token_id": config["pad_token_id"],
    }


def write_weights(folder: Path, model: GgufModel) -> dict[str, Any]:
    """config.json, model.safetensors and generation_config.json; returns the config."""
    from safetensors.numpy import save_file

    config = llama_config(model)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(hf_tensors(model, config), str(folder / "model.safetensors"), {"format": "pt"})
    dump(folder / "config.json", config)
    return config


def dump(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _id(model: GgufModel, which: str) -> int | None:
    value = model.metadata.get(f"tokenizer.ggml.{which}_token_id")
    return None if value is None else int(value)
