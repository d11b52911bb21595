"""Convert a generated onnxruntime-genai Phi-3 model folder into a GGUF file for llama.cpp.

    python -m scripts.bench.peers.gguf_model --model models/generated-phi3-mini --out FILE.gguf

The GGUF holds the *same* model, not just the same shapes: llama.cpp's `phi3` architecture
(fused `attn_qkv`, `ffn_up` holding gate then up, NeoX rope over the whole head, RMS norms),
and every matrix the ONNX model quantizes taken over block by block. MatMulNBits' int4 format
(nibbles with zero point 8, one fp32 scale per block of 32) is Q4_0's (the same nibbles, one
fp16 scale per block of 32) up to the order of the nibbles in a block and the scale's width,
so each weight is (q - 8) * scale in both files, the scale rounded to fp16. Token embedding and
output follow what `llama-quantize ... Q4_0` does (llama.cpp's src/llama-quant.cpp): the token
embedding (fp32 in the ONNX file) becomes Q4_0, the output matrix Q6_K (Q8_0 when its rows are
not whole 256-weight super-blocks, as on the tiny preset); the norms stay fp32.
`--output-type q4_0` keeps the output at 4 bits instead, as the ONNX model has it.

The tokenizer is the model's own vocabulary (tokenizer.json) as a `gpt2`-type BPE with its
merges, GPT-2's pre-tokenizer and Phi-3's special tokens as control tokens, and the chat
template of tokenizer_config.json: the same text tokenizes to the same ids in both engines.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scripts.models.modelgen.graph import EPS, ROPE_THETA

BLOCK = 32  # MatMulNBits block size and Q4_0's
Q4_0_BYTES = 18  # per block of 32: fp16 scale + 16 bytes of nibbles
QK_K = 256  # Q6_K super-block
Q6_K_BYTES = 210  # per super-block: 128 low nibbles, 64 high bits, 16 int8 scales, fp16 scale
ROWS = 1024  # rows converted at once: memory stays bounded on Phi-3-mini's 32064 x 3072
OUTPUT_TYPES = ("q6_k", "q4_0")


@dataclass(frozen=True)
class Source:
    """The initializers of an ONNX model whose data lives in one external file, memory-mapped."""

    tensors: dict[str, tuple[list[int], Any, int]]  # name -> (dims, numpy dtype, offset)
    data: np.memmap

    @classmethod
    def open(cls, model_dir: Path, filename: str) -> Source:
        import onnx

        model = onnx.load(str(model_dir / filename), load_external_data=False)
        dtypes = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.UINT8: np.uint8}
        tensors: dict[str, tuple[list[int], Any, int]] = {}
        location = ""
        for init in model.graph.initializer:
            if init.data_location != onnx.TensorProto.EXTERNAL:
                continue
            where = {entry.key: entry.value for entry in init.external_data}
            location = where["location"]
            tensors[init.name] = (list(init.dims), dtypes[init.data_type], int(where["offset"]))
        data = np.memmap(model_dir / location, dtype=np.uint8, mode="r")
        return cls(tensors, data)

    def array(self, name: str) -> np.ndarray:
        dims, dtype, offset = self.tensors[name]
        count = int(np.prod(dims))
        size = count * np.dtype(dtype).itemsize
        return self.data[offset : offset + size].view(dtype).reshape(dims)

    def matmul(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A MatMulNBits weight: packed nibbles [N, K/32, 16] and scales [N, K/32]."""
        return self.array(f"{name}.weight_Q4"), self.array(f"{name}.weight_scales")


def q4_0_rows(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MatMulNBits blocks as Q4_0 blocks, [N, K/32 * 18] bytes; the same nibbles.

    MatMulNBits packs elements 2j and 2j+1 of a block into byte j (low nibble first); Q4_0
    packs elements j and j+16. Both read a nibble q as (q - 8) * scale."""
    n, blocks, _ = packed.shape
    elements = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, blocks, BLOCK)
    qs = elements[..., :16] | (elements[..., 16:] << 4)
    d = scales.astype(np.float16).view(np.uint8).reshape(n, blocks, 2)
    return np.concatenate([d, qs], axis=-1).reshape(n, blocks * Q4_0_BYTES)


def dequantize(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MatMulNBits weights as fp32 [N, K]."""
    n, blocks, _ = packed.shape
    elements = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, blocks, BLOCK)
    return ((elements.astype(np.float32) - 8) * scales[..., None]).reshape(n, blocks * BLOCK)


def q6_k_rows(x: np.ndarray) -> np.ndarray:
    """fp32 [N, K] as Q6_K, [N, K/256 * 210] bytes (ggml's layout; the scales are chosen the
    simple way, as ggml's reference quantizer does without an importance matrix, minus its
    search for a slightly better scale)."""
    n, k = x.shape
    blocks = x.reshape(-1, QK_K // 16, 16).astype(np.float32)
    # Per 16: the value of largest magnitude maps to -32 (q in -32..31).
    big = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)[..., 0]
    sub = big / -32.0
    # Per 256: the sub-scale of largest magnitude maps to -128 (int8 scales).
    top = np.take_along_axis(sub, np.abs(sub).argmax(-1)[:, None], -1)
    d = (top / -128.0).astype(np.float16)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d == 0, 0, np.round(sub / d.astype(np.float32))).clip(-128, 127)
        eff = (d.astype(np.float32) * sc)[..., None]
        q = np.where(eff == 0, 0, np.round(blocks / eff)).clip(-32, 31)
    q = (q.astype(np.int16) + 32).astype(np.uint8).reshape(-1, 2, 128)  # two halves of 128
    low = (q & 0x0F).reshape(-1, 2, 2, 64)
    ql = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, 64 * 2)
    high = (q >> 4).reshape(-1, 2, 4, 32)
    qh = (high[:, :, 0] | high[:, :, 1] << 2 | high[:, :, 2] << 4 | high[:, :, 3] << 6).reshape(
        -1, 32 * 2
    )
    out = np.concatenate(
        [ql, qh, sc.astype(np.int8).view(np.uint8), d.view(np.uint8).reshape(-1, 2)], axis=-1
    )
    return out.reshape(n, k // QK_K * Q6_K_BYTES)


def from_float(x: np.ndarray, qtype: Any) -> np.ndarray:
    """fp32 [N, K] as Q4_0 or Q8_0, with llama.cpp's reference quantizers (gguf-py's port)."""
    from gguf import quants

    return quants.quantize(np.ascontiguousarray(x, dtype=np.float32), qtype)


@dataclass(frozen=True)
class Planned:
    name: str
    rows: int
    row_bytes: int
    qtype: Any  # gguf.GGMLQuantizationType
    chunks: Any  # () -> Iterator[np.ndarray], row chunks in order


def read_config(model_dir: Path) -> dict[str, Any]:
    config = json.loads((model_dir / "genai_config.json").read_text())
    model: dict[str, Any] = config["model"]
    if model.get("type") != "phi3":
        raise ValueError(f"{model_dir}: a phi3 model is needed, found {model.get('type')!r}")
    return model


def plan(model_dir: Path, output_type: str = "q6_k") -> tuple[dict[str, Any], list[Planned]]:
    """The GGUF tensors, in file order, each produced lazily from the memory-mapped ONNX data."""
    from gguf import GGMLQuantizationType as Q

    config = read_config(model_dir)
    decoder = config["decoder"]
    src = Source.open(model_dir, decoder["filename"])
    layers = decoder["num_hidden_layers"]
    hidden = decoder["hidden_size"]

    def matmul_q4_0(*names: str) -> Any:
        """One or more MatMulNBits weights stacked by rows (qkv is one already; gate + up)."""

        def chunks() -> Iterator[np.ndarray]:
            for name in names:
                packed, scales = src.matmul(name)
                for start in range(0, packed.shape[0], ROWS):
                    end = start + ROWS
                    yield q4_0_rows(packed[start:end], scales[start:end])

        return chunks

    def rows_of(name: str) -> int:
        return src.tensors[f"{name}.weight_Q4"][0][0]

    def norm(name: str, onnx_name: str) -> Planned:
        return Planned(name, 1, hidden * 4, Q.F32, lambda: iter([src.array(onnx_name).copy()]))

    def embedding() -> Iterator[np.ndarray]:
        table = src.array("model.embed_tokens.weight")
        for start in range(0, table.shape[0], ROWS):
            yield from_float(table[start : start + ROWS], Q.Q4_0)

    def output() -> Iterator[np.ndarray]:
        packed, scales = src.matmul("lm_head.MatMul")
        for start in range(0, packed.shape[0], ROWS):
            end = start + ROWS
            if out_type == Q.Q4_0:
                yield q4_0_rows(packed[start:end], scales[start:end])
            elif out_type == Q.Q6_K:
                yield q6_k_rows(dequantize(packed[start:end], scales[start:end]))
            else:
                yield from_float(dequantize(packed[start:end], scales[start:end]), out_type)

    q4_row = hidden // BLOCK * Q4_0_BYTES
    vocab = src.tensors["model.embed_tokens.weight"][0][0]
    # llama-quantize's choice for the output of a Q4_0 file: Q6_K, or Q8_0 where rows are not
    # whole Q6_K super-blocks (the tiny and small presets).
    if output_type == "q4_0":
        out_type, out_row = Q.Q4_0, q4_row
    elif hidden % QK_K == 0:
        out_type, out_row = Q.Q6_K, hidden // QK_K * Q6_K_BYTES
    else:
        out_type, out_row = Q.Q8_0, hidden // BLOCK * 34
    planned = [Planned("token_embd.weight", vocab, q4_row, Q.Q4_0, embedding)]
    intermediate = 0
    for i in range(layers):
        onnx, mlp, blk = f"model.layers.{i}", f"model.layers.{i}.mlp", f"blk.{i}"
        intermediate = rows_of(f"{mlp}.gate_proj.MatMul")
        qkv = f"{onnx}.attn.qkv_proj.MatMul"
        planned += [
            norm(f"{blk}.attn_norm.weight", f"{onnx}.input_layernorm.weight"),
            Planned(f"{blk}.attn_qkv.weight", rows_of(qkv), q4_row, Q.Q4_0, matmul_q4_0(qkv)),
            Planned(
                f"{blk}.attn_output.weight",
                hidden,
                q4_row,
                Q.Q4_0,
                matmul_q4_0(f"{onnx}.attn.o_proj.MatMul"),
            ),
            norm(f"{blk}.ffn_norm.weight", f"{onnx}.post_attention_layernorm.weight"),
            # llama.cpp's fused ffn_up: gate rows first (SwiGLU applies SiLU to the first half).
            Planned(
                f"{blk}.ffn_up.weight",
                2 * intermediate,
                q4_row,
                Q.Q4_0,
                matmul_q4_0(f"{mlp}.gate_proj.MatMul", f"{mlp}.up_proj.MatMul"),
            ),
            Planned(
                f"{blk}.ffn_down.weight",
                hidden,
                intermediate // BLOCK * Q4_0_BYTES,
                Q.Q4_0,
                matmul_q4_0(f"{mlp}.down_proj.MatMul"),
            ),
        ]
    final = f"model.layers.{layers}.final_norm_layernorm.weight"
    planned.append(norm("output_norm.weight", final))
    planned.append(Planned("output.weight", vocab, out_row, out_type, output))
    config["_intermediate"] = intermediate
    return config, planned


def vocabulary(model_dir: Path, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """Tokens in id order, their llama.cpp types, and the BPE merges as 'a b' strings."""
    from gguf import TokenType

    data = json.loads((model_dir / "tokenizer.json").read_text())
    bpe = data["model"]
    if bpe.get("type") != "BPE":
        raise ValueError(f"{model_dir}: a BPE tokenizer is needed")
    tokens = [""] * vocab_size
    for text, i in bpe["vocab"].items():
        tokens[i] = text
    special = {entry["id"] for entry in data.get("added_tokens", []) if entry.get("special")}
    for entry in data.get("added_tokens", []):
        tokens[entry["id"]] = entry["content"]
    if "" in tokens:
        raise ValueError(f"{model_dir}: token id {tokens.index('')} has no text")
    types = [TokenType.CONTROL if i in special else TokenType.NORMAL for i in range(vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in bpe["merges"]]
    return tokens, [int(t) for t in types], merges


def convert(model_dir: Path, out: Path, output_type: str = "q6_k") -> int:
    """Write the GGUF file (under a temporary name until complete); returns its size."""
    import gguf

    if output_type not in OUTPUT_TYPES:
        raise ValueError(f"output_type must be one of {OUTPUT_TYPES}")
    config, planned = plan(model_dir, output_type)
    decoder = config["decoder"]
    template = json.loads((model_dir / "tokenizer_config.json").read_text())["chat_template"]
    tokens, types, merges = vocabulary(model_dir, config["vocab_size"])
    ids = {t: i for i, t in enumerate(tokens)}

    partial = out.with_name(out.name + ".partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(partial), "phi3")
    writer.add_name(model_dir.name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(config["context_length"])
    writer.add_embedding_length(decoder["hidden_size"])
    writer.add_feed_forward_length(config["_intermediate"])
    writer.add_block_count(decoder["num_hidden_layers"])
    writer.add_head_count(decoder["num_attention_heads"])
    writer.add_head_count_kv(decoder["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_dimension_count(decoder["head_size"])
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # GPT-2's split regex: the tokenizer's ByteLevel one
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(ids["<s>"])
    writer.add_eos_token_id(ids["<|endoftext|>"])
    writer.add_eot_token_id(ids["<|end|>"])
    writer.add_unk_token_id(ids["<unk>"])
    writer.add_pad_token_id(ids["<|endoftext|>"])
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_chat_template(template)
    for p in planned:
        shape = [p.rows, p.row_bytes] if p.rows > 1 else [p.row_bytes]  # norms are vectors
        writer.add_tensor_info(p.name, shape, np.dtype(np.uint8), p.rows * p.row_bytes, p.qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for p in planned:
        data = np.concatenate([c.reshape(-1).view(np.uint8) for c in p.chunks()])
        writer.write_tensor_data(data)
    writer.close()
    partial.replace(out)
    return out.stat().st_size


def ensure(model_dir: Path, out_dir: Path | None = None) -> Path:
    """The GGUF of a model folder, converted unless a file newer than the model's weights and
    than this converter is there: beside the folder (in `out_dir` if given)."""
    out = (out_dir or model_dir.parent) / f"{model_dir.name}.Q4_0.gguf"
    sources = [*model_dir.glob("*.onnx*"), model_dir / "tokenizer.json", Path(__file__)]
    newest = max(path.stat().st_mtime for path in sources)
    if out.exists() and out.stat().st_mtime > newest:
        return out
    began = time.perf_counter()
    print(f"converting {model_dir} to {out} ...", flush=True)
    size = convert(model_dir, out)
    print(f"wrote {out} ({size:,} bytes) in {time.perf_counter() - began:.1f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="onnxruntime-genai model folder")
    parser.add_argument("--out", type=Path, required=True, help="GGUF file to write")
    parser.add_argument(
        "--output-type",
        choices=OUTPUT_TYPES,
        default="q6_k",
        help="the output (LM head) matrix: q6_k as llama-quantize Q4_0 does, or q4_0 as ONNX",
    )
    args = parser.parse_args(argv)
    began = time.perf_counter()
    size = convert(args.model, args.out, args.output_type)
    took = time.perf_counter() - began
    print(f"wrote {args.out} ({size:,} bytes) in {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
