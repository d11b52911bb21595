"""scripts/bench/peers/gguf_model.py on the tiny and small presets: the GGUF llama.cpp is
compared on holds the ONNX model's own weights, shapes, vocabulary and template.

Needs only the `gguf` package (requirements-dev.txt); loading the file in llama.cpp itself is
tested in test_llamacpp.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from scripts.bench.peers import gguf_model
from scripts.models.modelgen.config import FILENAME
from tests.conftest import build_model

Q = gguf.GGMLQuantizationType


def read(path: Path) -> tuple[Any, dict[str, Any]]:
    reader = gguf.GGUFReader(str(path))
    return reader, {t.name: t for t in reader.tensors}


def dequantized(tensor: Any) -> np.ndarray:
    rows = tensor.data.shape[0]
    return gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(rows, -1)


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    gguf_model.convert(tiny_model_dir, out)
    return out


@pytest.fixture(scope="module")
def small_gguf(small_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "small.gguf"
    gguf_model.convert(small_model_dir, out)
    return out


def test_tensors_are_llama_cpp_phi3_with_q4_0_matrices(tiny_gguf: Path) -> None:
    _, tensors = read(tiny_gguf)
    # tiny: hidden 64, 2 layers, 4 heads of 16, intermediate 128, vocab 1024.
    expected = {"token_embd.weight": (Q.Q4_0, [64, 1024]), "output_norm.weight": (Q.F32, [64])}
    # Rows of 64 are no whole Q6_K super-block: llama-quantize then takes Q8_0, and so do we.
    expected["output.weight"] = (Q.Q8_0, [64, 1024])
    for i in range(2):
        expected |= {
            f"blk.{i}.attn_norm.weight": (Q.F32, [64]),
            f"blk.{i}.attn_qkv.weight": (Q.Q4_0, [64, 192]),
            f"blk.{i}.attn_output.weight": (Q.Q4_0, [64, 64]),
            f"blk.{i}.ffn_norm.weight": (Q.F32, [64]),
            f"blk.{i}.ffn_up.weight": (Q.Q4_0, [64, 256]),  # gate and up
            f"blk.{i}.ffn_down.weight": (Q.Q4_0, [128, 64]),
        }
    found = {name: (t.tensor_type, [int(d) for d in t.shape]) for name, t in tensors.items()}
    assert found == expected


def test_metadata_describes_the_onnx_model(tiny_gguf: Path, tiny_model_dir: Path) -> None:
    reader, _ = read(tiny_gguf)
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == "phi3"
    assert fields["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_Q4_0)
    expected = {
        "phi3.context_length": 4096,
        "phi3.embedding_length": 64,
        "phi3.feed_forward_length": 128,
        "phi3.block_count": 2,
        "phi3.attention.head_count": 4,
        "phi3.attention.head_count_kv": 4,
        "phi3.rope.dimension_count": 16,
        "phi3.rope.freq_base": pytest.approx(10000.0),
        "phi3.attention.layer_norm_rms_epsilon": pytest.approx(1e-5),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.add_bos_token": False,
    }
    assert {key: fields[key] for key in expected} == expected
    tokens = fields["tokenizer.ggml.tokens"]
    vocab = json.loads((tiny_model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(tokens) == 1024
    assert all(tokens[i] == text for text, i in vocab.items())
    ids = {t: i for i, t in enumerate(tokens)}
    assert fields["tokenizer.ggml.eos_token_id"] == ids["<|endoftext|>"]
    assert fields["tokenizer.ggml.eot_token_id"] == ids["<|end|>"]
    assert fields["tokenizer.ggml.bos_token_id"] == ids["<s>"]
    types = fields["tokenizer.ggml.token_type"]
    control = int(gguf.TokenType.CONTROL)
    assert {t for t, kind in zip(tokens, types, strict=True) if kind == control} >= {
        "<|user|>",
        "<|assistant|>",
        "<|end|>",
        "<|system|>",
    }
    assert types[3 + ord("a")] == types[300] == int(gguf.TokenType.NORMAL)  # a byte, a merge
    assert len(fields["tokenizer.ggml.merges"]) > 600
    template = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())["chat_template"]
    assert fields["tokenizer.chat_template"] == template


def test_matrices_are_the_onnx_weights_with_fp16_scales(
    small_gguf: Path, small_model_dir: Path
) -> None:
    src = gguf_model.Source.open(small_model_dir, FILENAME)
    _, tensors = read(small_gguf)

    def onnx(name: str) -> np.ndarray:
        return gguf_model.dequantize(*src.matmul(name))

    def same(a: np.ndarray, b: np.ndarray) -> None:
        # Identical nibbles; only the scale differs, rounded from fp32 to fp16.
        np.testing.assert_allclose(a, b, rtol=2**-10, atol=0)

    for i in (0, 7):
        layer = f"model.layers.{i}"
        same(
            dequantized(tensors[f"blk.{i}.attn_qkv.weight"]), onnx(f"{layer}.attn.qkv_proj.MatMul")
        )
        same(
            dequantized(tensors[f"blk.{i}.attn_output.weight"]), onnx(f"{layer}.attn.o_proj.MatMul")
        )
        gate_up = np.vstack(
            [onnx(f"{layer}.mlp.gate_proj.MatMul"), onnx(f"{layer}.mlp.up_proj.MatMul")]
        )
        same(dequantized(tensors[f"blk.{i}.ffn_up.weight"]), gate_up)
        same(
            dequantized(tensors[f"blk.{i}.ffn_down.weight"]), onnx(f"{layer}.mlp.down_proj.MatMul")
        )
        np.testing.assert_array_equal(
            tensors[f"blk.{i}.attn_norm.weight"].data, src.array(f"{layer}.input_layernorm.weight")
        )
    # The output matrix is requantized to Q6_K (hidden 512: whole super-blocks), as llama-quantize
    # does for a Q4_0 file: close, not identical.
    assert tensors["output.weight"].tensor_type == Q.Q6_K
    head, ours = onnx("lm_head.MatMul"), dequantized(tensors["output.weight"])
    assert np.sqrt(np.mean((head - ours) ** 2)) < 0.03 * np.sqrt(np.mean(head**2))
    # Muted tokens (LM head scale 0) stay muted.
    muted = np.abs(head).max(axis=1) == 0
    assert muted.any() and not np.abs(ours[muted]).any()
    # The token embedding (fp32 in ONNX) becomes Q4_0 with llama.cpp's reference quantizer.
    table = src.array("model.embed_tokens.weight")
    embd = dequantized(tensors["token_embd.weight"])
    assert np.sqrt(np.mean((table - embd) ** 2)) < 0.1 * np.sqrt(np.mean(table**2))


def test_q6_k_writer_round_trips_through_ggufs_reader() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    x[1, :16] = 0.0  # an all-zero sub-block
    back = gguf.quants.dequantize(gguf_model.q6_k_rows(x), Q.Q6_K).reshape(3, 512)
    assert np.abs(back - x).max() < 0.06 * np.abs(x).max()
    assert not back[1, :16].any()


def test_output_type_q4_0_keeps_the_onnx_lm_head(small_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "small-q4.gguf"
    gguf_model.convert(small_model_dir, out, output_type="q4_0")
    _, tensors = read(out)
    src = gguf_model.Source.open(small_model_dir, FILENAME)
    assert tensors["output.weight"].tensor_type == Q.Q4_0
    np.testing.assert_allclose(
        dequantized(tensors["output.weight"]),
        gguf_model.dequantize(*src.matmul("lm_head.MatMul")),
        rtol=2**-10,
    )


def test_ensure_converts_once(tmp_path: Path) -> None:
    model = build_model("tiny", tmp_path / "tiny")
    out = gguf_model.ensure(model)
    assert out == tmp_path / "tiny.Q4_0.gguf"
    stamp = out.stat().st_mtime_ns
    assert gguf_model.ensure(model) == out
    assert out.stat().st_mtime_ns == stamp
    assert not list(tmp_path.glob("*.partial"))
