"""The ONNX graph the official builder emits for Phi-3 int4 CPU, at any shape.

Gather embedding, SimplifiedLayerNorm / SkipSimplifiedLayerNorm, int4 MatMulNBits (block 32,
accuracy level 4), GroupQueryAttention with rotary caches, SiLU MLP and an int4 LM head; node,
input and output names follow the official model. A `Variant` makes what the builder's options
of the same names make: another block size, an int4 embedding (GatherBlockQuantized), a pruned
LM head, an int8 KV cache (GroupQueryAttention with k_scale and v_scale).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from scripts.models.modelgen.config import Shape, Variant
from scripts.models.modelgen.vocab import special_ids
from scripts.models.modelgen.weights import (
    ROWS_PER_CHUNK,
    DataFile,
    fp32,
    int4_matrix,
    lm_head_row_scales,
    quantize_int4_rows,
)

EPS = 1e-5
ROPE_THETA = 10000.0
MS_OPS = {
    "SkipSimplifiedLayerNormalization",
    "MatMulNBits",
    "GroupQueryAttention",
    "GatherBlockQuantized",
}
# The magnitude an int8 KV cache's scales cover (scale = KV_THRESHOLD / 128). K and V are
# projections with outputs of RMS about 1 (int4_matrix's scales), so it clips beyond 6 RMS; the
# generated model has no data to calibrate on, a real model is calibrated (export_model.py).
KV_THRESHOLD = 6.0


def rotary_caches(shape: Shape) -> tuple[np.ndarray, np.ndarray]:
    half = shape.head_size // 2
    inv_freq = 1.0 / ROPE_THETA ** (np.arange(half, dtype=np.float64) * 2 / shape.head_size)
    freqs = np.outer(np.arange(shape.context, dtype=np.float64), inv_freq)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


def build_graph(
    shape: Shape, data: DataFile, tokens: list[str], variant: Variant | None = None
) -> onnx.ModelProto:
    """The decoder graph. `variant.prune_lm_head`: the official builder's option of that name,
    which applies the LM head to the last position only (a prefill then computes one row of
    logits instead of one per prompt token); the published Phi-3 model does not have it."""
    variant = variant or Variant()
    prune_lm_head, block = variant.prune_lm_head, variant.block_size
    h, kv, hd = shape.hidden, shape.kv_heads, shape.head_size
    nodes: list[onnx.NodeProto] = []
    weights: list[TensorProto] = []

    def node(op: str, inputs: list[str], name: str, n_out: int = 1, **attrs: Any) -> list[str]:
        outs = [f"{name}/output_{i}" for i in range(n_out)]
        if name == "/lm_head/MatMul":
            outs = ["logits"]  # the graph output itself, as in the official model
        domain = "com.microsoft" if op in MS_OPS else ""
        nodes.append(helper.make_node(op, inputs, outs, name=name, domain=domain, **attrs))
        return outs

    def matmul(x: str, name: str, k: int, n: int, rows: np.ndarray | None = None) -> str:
        q, s = int4_matrix(data, name.replace("/", ".").lstrip("."), k, n, rows, block)
        weights.extend([q, s])
        attrs = {"K": k, "N": n, "bits": 4, "block_size": block, "accuracy_level": 4}
        return node("MatMulNBits", [x, q.name, s.name], name, **attrs)[0]

    def norm_weight(name: str) -> str:
        # Random signs: the int4 nibbles have mean -0.5, so every projection adds the same
        # offset to all its outputs; with all-ones norm weights that offset grows layer after
        # layer until a deep model (phi3-mini) repeats one token forever. Signs scramble it.
        signs = np.where(data.rng().random(h) < 0.5, -1.0, 1.0).astype(np.float32)
        weights.append(fp32(data, name, [h], lambda: [signs]))
        return name

    data.rng()
    stream = [data.seed, data.count]  # the embedding's random stream, replayable

    def embedding() -> Any:
        rng = np.random.default_rng(stream)
        for start in range(0, shape.vocab, ROWS_PER_CHUNK):
            rows = min(ROWS_PER_CHUNK, shape.vocab - start)
            yield rng.standard_normal((rows, h), dtype=np.float32)

    if variant.int4_embedding:  # the same rows, quantized: two tensors, so two passes
        q4 = data.tensor(
            "model.embed_tokens.weight_Q4",
            [shape.vocab, h // 2],
            TensorProto.UINT8,
            lambda: (quantize_int4_rows(rows, block)[0] for rows in embedding()),
        )
        q4_scales = fp32(
            data,
            "model.embed_tokens.weight_scales",
            [shape.vocab, h // block],
            lambda: (quantize_int4_rows(rows, block)[1] for rows in embedding()),
        )
        weights.extend([q4, q4_scales])
    else:
        weights.append(fp32(data, "model.embed_tokens.weight", [shape.vocab, h], embedding))
    cos, sin = rotary_caches(shape)
    weights.append(fp32(data, "cos_cache", list(cos.shape), lambda: [cos]))
    weights.append(fp32(data, "sin_cache", list(sin.shape), lambda: [sin]))

    # seqlens_k = sum(attention_mask) - 1 and total_sequence_length, as int32 for GQA.
    mask = "/model/attn_mask_reformat/attn_mask_subgraph"
    summed = node("ReduceSum", ["attention_mask", "one_1d"], f"{mask}/ReduceSum", keepdims=0)
    sub = node("Sub", [summed[0], "one_1d"], f"{mask}/Sub")
    seqlens = node("Cast", sub, f"{mask}/Sub/Cast", to=TensorProto.INT32)[0]
    mshape = node("Shape", ["attention_mask"], f"{mask}/Shape")
    total = node("Gather", [mshape[0], "one"], f"{mask}/Gather", axis=0)
    total_len = node("Cast", total, f"{mask}/Gather/Cast", to=TensorProto.INT32)[0]

    if variant.int4_embedding:
        x = node(
            "GatherBlockQuantized",
            ["model.embed_tokens.weight_Q4", "input_ids", "model.embed_tokens.weight_scales"],
            "/model/embed_tokens/GatherBlockQuantized",
            gather_axis=0,
            quantize_axis=1,
            block_size=block,
            bits=4,
        )[0]
    else:
        embed = ["model.embed_tokens.weight", "input_ids"]
        x = node("Gather", embed, "/model/embed_tokens/Gather")[0]
    kv_attrs: dict[str, Any] = {}
    if variant.quantized_kv:
        mode = "PER_CHANNEL" if variant.kv_cache.endswith("per_channel") else "PER_TENSOR"
        kv_attrs = {"k_quant_type": mode, "v_quant_type": mode, "kv_cache_bit_width": 8}
        scale_dims = [kv * hd] if mode == "PER_CHANNEL" else [1]
    residual, pending = x, ""  # pending: the previous layer's MLP output, not yet added
    for i in range(shape.layers):
        base = f"/model/layers.{i}"
        ln = norm_weight(f"model.layers.{i}.input_layernorm.weight")
        if pending:
            out = node(
                "SkipSimplifiedLayerNormalization",
                [pending, residual, ln],
                f"{base}/input_layernorm/SkipLayerNorm",
                n_out=4,
                epsilon=EPS,
            )
            x, residual = out[0], out[3]
        else:
            x = node(
                "SimplifiedLayerNormalization",
                [residual, ln],
                f"{base}/input_layernorm/LayerNorm",
                axis=-1,
                epsilon=EPS,
                stash_type=1,
            )[0]
        qkv = matmul(x, f"{base}/attn/qkv_proj/MatMul", h, h + 2 * kv * hd)
        attn = f"{base}/attn/GroupQueryAttention"
        gqa_inputs = [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        gqa_inputs += [seqlens, total_len, "cos_cache", "sin_cache"]
        if kv_attrs:  # position_ids, attention_bias, sinks unused; then k_scale, v_scale
            scales = [f"model.layers.{i}.attn.k_scale", f"model.layers.{i}.attn.v_scale"]
            for name in scales:
                value = np.full(scale_dims, KV_THRESHOLD / 128, np.float32)
                weights.append(fp32(data, name, scale_dims, lambda value=value: [value]))
            gqa_inputs += ["", "", "", *scales]
        nodes.append(
            helper.make_node(
                "GroupQueryAttention",
                gqa_inputs,
                [f"{attn}/output_0", f"present.{i}.key", f"present.{i}.value"],
                name=attn,
                domain="com.microsoft",
                num_heads=shape.heads,
                kv_num_heads=kv,
                scale=float(1 / np.sqrt(hd)),
                local_window_size=-1,
                softcap=0.0,
                do_rotary=1,
                rotary_interleaved=0,
                **kv_attrs,
            )
        )
        o = matmul(f"{attn}/output_0", f"{base}/attn/o_proj/MatMul", h, h)
        ln2 = norm_weight(f"model.layers.{i}.post_attention_layernorm.weight")
        out = node(
            "SkipSimplifiedLayerNormalization",
            [o, residual, ln2],
            f"{base}/post_attention_layernorm/SkipLayerNorm",
            n_out=4,
            epsilon=EPS,
        )
        x, residual = out[0], out[3]
        gate = matmul(x, f"{base}/mlp/gate_proj/MatMul", h, shape.intermediate)
        up = matmul(x, f"{base}/mlp/up_proj/MatMul", h, shape.intermediate)
        sig = node("Sigmoid", [gate], f"{base}/mlp/act_fn/Sigmoid")[0]
        act = node("Mul", [gate, sig], f"{base}/mlp/act_fn/Mul")[0]
        prod = node("Mul", [act, up], f"{base}/mlp/Mul")[0]
        pending = matmul(prod, f"{base}/mlp/down_proj/MatMul", shape.intermediate, h)

    final = norm_weight(f"model.layers.{shape.layers}.final_norm_layernorm.weight")
    out = node(
        "SkipSimplifiedLayerNormalization",
        [pending, residual, final],
        f"/model/layers.{shape.layers}/final_norm_layernorm/SkipLayerNorm",
        n_out=4,
        epsilon=EPS,
    )
    eos = special_ids(shape.vocab)["<|end|>"]
    hidden = out[0]
    if prune_lm_head:  # as the builder does it: Gather(axis=1, index -1), then Unsqueeze(1)
        last = node("Gather", [hidden, "minus_one"], "/lm_head/prune/Gather", axis=1)[0]
        hidden = node("Unsqueeze", [last, "one_1d"], "/lm_head/prune/Unsqueeze")[0]
    matmul(hidden, "/lm_head/MatMul", h, shape.vocab, lm_head_row_scales(tokens, eos))

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    kv_type = TensorProto.INT8 if variant.quantized_kv else f32
    past: list[str | int] = ["batch_size", kv, "past_sequence_length", hd]
    present: list[str | int] = ["batch_size", kv, "total_sequence_length", hd]
    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info(
            "attention_mask", i64, ["batch_size", "total_sequence_length"]
        ),
    ]
    logits_rows: str | int = 1 if prune_lm_head else "sequence_length"
    outputs = [
        helper.make_tensor_value_info("logits", f32, ["batch_size", logits_rows, shape.vocab])
    ]
    for i in range(shape.layers):
        for kind in ("key", "value"):
            past_name, present_name = f"past_key_values.{i}.{kind}", f"present.{i}.{kind}"
            inputs.append(helper.make_tensor_value_info(past_name, kv_type, past))
            outputs.append(helper.make_tensor_value_info(present_name, kv_type, present))
    constants = [
        helper.make_tensor("one_1d", i64, [1], [1]),
        helper.make_tensor("one", i64, [], [1]),
    ]
    if prune_lm_head:
        constants.append(helper.make_tensor("minus_one", i64, [], [-1]))
    graph = helper.make_graph(nodes, "main_graph", inputs, outputs, weights + constants)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="phi3-chat make_model")
    model.ir_version = 10
    return model
