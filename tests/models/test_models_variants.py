"""make_model.py's variants (the official builder's options of the same names) through the real
onnxruntime-genai 0.18 and the real sidecar.

Each variant's folder is served by a sidecar process; its greedy reply over HTTP must be the
reply a raw onnxruntime-genai loop gives on that folder, and, where the variant computes the
same numbers (a pruned LM head), the default folder's reply too. Another block size holds the
same weights, but accuracy level 4 quantizes the activations to int8 per block, so the
random model's many near ties flip after a few tokens (measured: the first 2 to 48 tokens
agree); its quality is measured on a real model (docs/benchmarks/variants.md). The int8 KV cache is
measured by the sidecar itself: a token costs a quarter of the fp32 cache's bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import onnx
import pytest

from scripts.models import make_model

from scripts.run import services
from tests.sidecar import reference

MAX_NEW = 24
PROMPTS = (make_model.LONG_PROMPT, "Hi", "What is the capital of France?")
# flags, whether the greedy tokens must equal the default folder's
VARIANTS = {
    "block-16": (["--block-size", "16"], False),
    "block-64": (["--block-size", "64"], False),
    "pruned-lm-head": (["--prune-lm-head"], True),
    "int4-embedding": (["--int4-embedding"], False),
    "kv-int8-per-tensor": (["--kv-cache", "int8_per_tensor"], False),
    "kv-int8-per-channel": (["--kv-cache", "int8_per_channel"], False),
    "all": (["--block-size", "64", "--int4-embedding", "--prune-lm-head", "--kv-cache",
             "int8_per_channel"], False),
}  # fmt: skip


def build(tmp: pytest.TempPathFactory, name: str, flags: list[str], preset: str = "tiny") -> Path:
    out = tmp.mktemp("variants") / name
    assert make_model.main(["--preset", preset, "--out", str(out), *flags]) == 0
    return out


def graph(folder: Path) -> onnx.GraphProto:
    return onnx.load(str(folder / make_model.FILENAME), load_external_data=False).graph


def attributes(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def metric(service: services.Service, name: str) -> float:
    text = httpx.get(service.url + "/metrics", timeout=10).text
    match = re.search(rf"^sidecar_{name} (\S+)$", text, re.M)
    assert match, name
    return float(match.group(1))


@pytest.fixture(scope="module")
def default_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-default.log"
    with services.sidecar(tiny_model_dir, log) as service:
        served(service, PROMPTS[0])  # the KV bytes a token are reported with the first reply
        yield service


def served(service: services.Service, prompt: str) -> str:
    body = {"messages": [{"role": "user", "content": prompt}], "max_new_tokens": MAX_NEW}
    response = httpx.post(service.url + "/predict", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.text


@pytest.mark.parametrize("name", VARIANTS)
def test_the_sidecar_serves_each_variant(
    name: str,
    tiny_model_dir: Path,
    default_sidecar: services.Service,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    flags, same_as_default = VARIANTS[name]
    folder = build(tmp_path_factory, name, flags)
    log = tmp_path_factory.mktemp("logs") / f"sidecar-{name}.log"
    with services.sidecar(folder, log) as service:
        for prompt in PROMPTS:
            messages = [{"role": "user", "content": prompt}]
            expected = reference.generate(folder, messages, MAX_NEW)
            text = served(service, prompt)
            reference.assert_agrees(text, folder, messages, MAX_NEW)
            assert text.strip()
            if same_as_default:
                assert (
                    expected.tokens == reference.generate(tiny_model_dir, messages, MAX_NEW).tokens
                )
                assert text == served(default_sidecar, prompt)
        # The next turn continues the cached generator (rewound into its KV cache).
        history = [
            {"role": "user", "content": PROMPTS[0]},
            {"role": "assistant", "content": served(service, PROMPTS[0])},
            {"role": "user", "content": PROMPTS[1]},
        ]
        response = httpx.post(
            service.url + "/predict",
            json={"messages": history, "max_new_tokens": MAX_NEW},
            timeout=120,
        )
        assert response.status_code == 200 and int(response.headers["x-cached-tokens"]) > 0
        reference.assert_agrees(response.text, folder, history, MAX_NEW)
        per_token = metric(service, "kv_bytes_per_token")
    fp32_per_token = metric(default_sidecar, "kv_bytes_per_token")
    shape = make_model.PRESETS["tiny"]
    assert fp32_per_token == 2 * shape.layers * shape.kv_heads * shape.head_size * 4
    assert per_token == fp32_per_token / (4 if "--kv-cache" in flags else 1)


def test_block_size_is_every_matmuls_and_the_weights_shrink(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = build(tmp_path_factory, "block-64-graph", ["--block-size", "64"])
    nodes = [n for n in graph(folder).node if n.op_type == "MatMulNBits"]
    assert nodes and all(attributes(n)["block_size"] == 64 for n in nodes)
    data = f"{make_model.FILENAME}.data"
    # Half as many fp32 scales; the packed nibbles are the same bytes.
    assert (folder / data).stat().st_size < (tiny_model_dir / data).stat().st_size


def test_int4_embedding_is_a_gather_block_quantized_of_an_eighth_the_size(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = build(tmp_path_factory, "int4-embedding-graph", ["--int4-embedding"])
    (gather,) = [n for n in graph(folder).node if n.name.startswith("/model/embed_tokens/")]
    assert gather.op_type == "GatherBlockQuantized"
    assert attributes(gather) == {"gather_axis": 0, "quantize_axis": 1, "block_size": 32, "bits": 4}
    sizes = {t.name: t for t in graph(folder).initializer}
    shape = make_model.PRESETS["tiny"]
    assert list(sizes["model.embed_tokens.weight_Q4"].dims) == [shape.vocab, shape.hidden // 2]
    assert "model.embed_tokens.weight" not in sizes


def test_int8_kv_cache_is_int8_with_scales_and_no_shared_buffer(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder = build(tmp_path_factory, "kv-graph", ["--kv-cache", "int8_per_channel"])
    g = graph(folder)
    kv = [i for i in g.input if i.name.startswith("past_key_values.")]
    assert kv and all(i.type.tensor_type.elem_type == onnx.TensorProto.INT8 for i in kv)
    attention = [n for n in g.node if n.op_type == "GroupQueryAttention"]
    for node in attention:
        assert attributes(node)["k_quant_type"] == b"PER_CHANNEL"
        assert attributes(node)["kv_cache_bit_width"] == 8
        assert node.input[12].endswith("k_scale") and node.input[13].endswith("v_scale")
    config = (folder / "genai_config.json").read_text()
    assert '"past_present_share_buffer": false' in config


def test_block_128_on_small_holds_the_same_weights(
    small_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The phi3-mini shapes' candidate block (128) needs sizes `tiny` lacks: `small` has them.
    Same weights: the replies start alike (a wrong layout would be noise from the first
    token); the near ties after that are the activations' quantization (module docstring)."""
    folder = build(tmp_path_factory, "small-block-128", ["--block-size", "128"], preset="small")
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        tokens = reference.generate(folder, messages, MAX_NEW).tokens
        assert tokens[:2] == reference.generate(small_model_dir, messages, MAX_NEW).tokens[:2]


def test_block_size_must_divide_the_shapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        make_model.main(["--preset", "tiny", "--out", str(tmp_path), "--block-size", "128"])
    assert exit_info.value.code == 2
    assert "multiples of the block size 128" in capsys.readouterr().err
