"""A hand-made GGUF written with `gguf`'s own writer: a two-layer llama with a byte-level BPE,
each weight in a known type, for the converter's tests (no download)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from numpy.typing import NDArray

from scripts.models.realmodel.hf_folder import permute

Q = gguf.GGMLQuantizationType
HIDDEN, FFN, HEADS, KV_HEADS, LAYERS = 64, 96, 4, 2, 2
HEAD_DIM = HIDDEN // HEADS
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
USER_DEFINED = ("<tool>",)
# "1 2" is a merge the `smollm` pre-tokenizer must never reach: it splits digits first.
MERGES = (("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w"), ("1", "2"))
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def vocabulary() -> list[str]:
    return [*SPECIALS, *USER_DEFINED, *byte_alphabet(), *(a + b for a, b in MERGES)]


@dataclass
class Handmade:
    path: Path
    weights: dict[str, NDArray[np.float32]]  # the Hugging Face weights before quantization
    stored: dict[str, NDArray[np.float32]]  # what the GGUF holds, dequantized by `gguf`


def write_gguf(path: Path, seed: int = 0, *, pre: str = "smollm", arch: str = "llama") -> Handmade:
    rng = np.random.default_rng(seed)
    tokens = vocabulary()
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    kinds = {t: 3 for t in SPECIALS} | {t: 4 for t in USER_DEFINED}
    writer.add_token_types([kinds.get(t, 1) for t in tokens])
    writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template(TEMPLATE)

    weights: dict[str, NDArray[np.float32]] = {}
    stored: dict[str, NDArray[np.float32]] = {}

    def add(name: str, hf: NDArray[np.float32], kind: Q, heads: int = 0) -> None:
        weights[name] = hf
        data = permute(hf, heads) if heads else hf
        if kind in (Q.Q4_1, Q.Q8_0):
            raw = gguf.quants.quantize(data, kind)
            writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=kind)
            stored[name] = gguf.quants.dequantize(raw, kind).reshape(data.shape)
        elif kind == Q.F16:
            writer.add_tensor(name, data.astype(np.float16))
            stored[name] = data.astype(np.float16).astype(np.float32)
        else:
            writer.add_tensor(name, data)
            stored[name] = data

    def matrix(rows: int, columns: int) -> NDArray[np.float32]:
        return rng.standard_normal((rows, columns)).astype(np.float32) * 0.05

    add("token_embd.weight", matrix(len(tokens), HIDDEN), Q.Q8_0)
    for layer in range(LAYERS):
        blk = f"blk.{layer}."
        add(blk + "attn_norm.weight", 1 + matrix(1, HIDDEN)[0], Q.F32)
        add(blk + "attn_q.weight", matrix(HIDDEN, HIDDEN), Q.Q4_1, HEADS)
        add(blk + "attn_k.weight", matrix(KV_HEADS * HEAD_DIM, HIDDEN), Q.Q4_1, KV_HEADS)
        add(blk + "attn_v.weight", matrix(KV_HEADS * HEAD_DIM, HIDDEN), Q.F16)
        add(blk + "attn_output.weight", matrix(HIDDEN, HIDDEN), Q.Q8_0)
        add(blk + "ffn_norm.weight", 1 + matrix(1, HIDDEN)[0], Q.F32)
        add(blk + "ffn_gate.weight", matrix(FFN, HIDDEN), Q.Q4_1)
        add(blk + "ffn_up.weight", matrix(FFN, HIDDEN), Q.Q4_1)
        add(blk + "ffn_down.weight", matrix(HIDDEN, FFN), Q.Q4_1)
    add("output_norm.weight", 1 + matrix(1, HIDDEN)[0], Q.F32)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Handmade(path, weights, stored)
