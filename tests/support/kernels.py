"""Whether this CPU's int4 kernels give a row the same bits alone and in a batch: measured,
never read from /proc/cpuinfo.

onnxruntime's MLAS picks its MatMulNBits kernels by CPU. With accuracy level 4 (int8
activations, the published Phi-3 folder's and the generated models'), an AVX-512 VNNI CPU
computes a row identically whether it is the only row of the call (M = 1) or one of several.
An AVX2-only CPU has a one-row kernel of its own (MLAS's "m1" kernels) that sums in another
order than the many-row kernel: the same row differs in its last bits, and a generated
model's logits drift apart by up to ~0.1 within 40 tokens of decode (docs/models.md, "Exact
replies and the CPU"). No session option chooses the kernel. So the properties "greedy replies
batched = alone" and "cached = uncached" hold to the bit on the first class of CPU only; on
the second, the tests check what holds there instead (tests/sidecar/reference.py:
`assert_agrees`): the same tokens until a choice the drift can decide.

The probe is one MatMulNBits node of the generated models' kind (block 32, accuracy level 4,
no zero points), run on one row and on the same row beside another.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
K, N, BLOCK = 256, 64, 32


@cache
def rows_exact_in_batches() -> bool:
    """True where a row's int4 MatMul result is the same alone and in a batch of two."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    blocks = K // BLOCK
    weights = rng.integers(0, 256, size=(N, blocks, BLOCK // 2), dtype=np.uint8)
    scales = (rng.random(N * blocks, dtype=np.float32) * 0.02).astype(np.float32)
    node = helper.make_node(
        "MatMulNBits",
        ["A", "B", "S"],
        ["Y"],
        domain="com.microsoft",
        K=K,
        N=N,
        bits=4,
        block_size=BLOCK,
        accuracy_level=4,
    )
    graph = helper.make_graph(
        [node],
        "probe",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
        [
            helper.make_tensor("B", TensorProto.UINT8, weights.shape, weights.tobytes(), raw=True),
            helper.make_tensor("S", TensorProto.FLOAT, scales.shape, scales),
        ],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 9
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    rows = rng.standard_normal((2, K), dtype=np.float32)
    alone = session.run(None, {"A": rows[:1]})[0][0]
    together = session.run(None, {"A": rows})[0][0]
    return bool(np.array_equal(alone, together))
