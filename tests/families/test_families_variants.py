"""scripts/models/export_model.py's variant options on tiny Hugging Face models, through the
official builder: each folder loads in the real sidecar, which serves the reply a raw
onnxruntime-genai loop gives on it; the pruned LM head gives the default export's reply; the int8 KV
cache (calibrated by onnxruntime-genai's own tool) costs a quarter of the bytes a token."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import httpx
import onnx
import pytest

from scripts.run import services
from tests.families.conftest import Exported, _need_builder, _run
from tests.sidecar import reference

pytestmark = pytest.mark.families

PROMPTS = ("Hello", "What is the capital of France?")
MAX_NEW = 16


def export(tmp: pytest.TempPathFactory, family: str, *flags: str) -> Path:
    _need_builder()
    root = tmp.mktemp(f"variant-{family}")
    hf_dir, out = root / "hf", root / "model"
    _run("-m", "scripts.models.make_hf_model", "--family", family, "--out", str(hf_dir))
    cache = str(root / "cache")
    _run(
        "-m",
        "scripts.models.export_model",
        "--model",
        str(hf_dir),
        "--out",
        str(out),
        "--cache-dir",
        cache,
        *flags,
    )
    return out


def nodes(folder: Path) -> list[onnx.NodeProto]:
    return list(onnx.load(str(folder / "model.onnx"), load_external_data=False).graph.node)


def attributes(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def serve_and_check(folder: Path, tmp: pytest.TempPathFactory) -> int:
    """The sidecar's replies are the raw loop's; returns its KV bytes per token."""
    log = tmp.mktemp("logs") / f"sidecar-{folder.parent.name}.log"
    with services.sidecar(folder, log, MAX_CONCURRENCY="1") as service:
        for prompt in PROMPTS:
            messages = [{"role": "user", "content": prompt}]
            body = {"messages": messages, "max_new_tokens": MAX_NEW}
            response = httpx.post(service.url + "/predict", json=body, timeout=120)
            assert response.status_code == 200, response.text
            assert response.text == reference.generate(folder, messages, MAX_NEW).text
        metrics = httpx.get(service.url + "/metrics", timeout=10).text
    match = re.search(r"^sidecar_kv_bytes_per_token (\S+)$", metrics, re.M)
    assert match
    return int(float(match.group(1)))


def test_int8_kv_cache_int4_embedding_block_64_pruned(
    tmp_path_factory: pytest.TempPathFactory, export_family: Callable[[str], Exported]
) -> None:
    flags = ["--kv-cache", "int8_per_channel", "--int4-embedding", "--block-size", "64"]
    folder = export(tmp_path_factory, "phi3", *flags, "--prune-lm-head")
    graph = nodes(folder)
    ops = {n.op_type for n in graph}
    assert "GatherBlockQuantized" in ops and "Gather" not in {
        n.op_type for n in graph if n.name.startswith("/model/embed_tokens")
    }
    matmuls = [attributes(n) for n in graph if n.op_type == "MatMulNBits"]
    assert matmuls and all(a["block_size"] == 64 for a in matmuls)
    attention = [attributes(n) for n in graph if n.op_type == "GroupQueryAttention"]
    assert attention and all(a["kv_cache_bit_width"] == 8 for a in attention)
    scales = json.loads((folder / "kv_cache_scales.json").read_text())
    assert len(scales["scales"]["k_scales"]) == 2  # one per layer, per channel
    per_token = serve_and_check(folder, tmp_path_factory)
    default = export_family("phi3")
    assert per_token * 4 == serve_and_check(default.model_dir, tmp_path_factory)


def test_pruned_lm_head_gives_the_default_export_s_replies(
    tmp_path_factory: pytest.TempPathFactory, export_family: Callable[[str], Exported]
) -> None:
    folder = export(tmp_path_factory, "phi3", "--prune-lm-head")
    assert any(n.name.startswith("/lm_head/") and n.op_type == "Gather" for n in nodes(folder))
    default = export_family("phi3").model_dir
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        ours = reference.generate(folder, messages, MAX_NEW)
        assert ours.tokens == reference.generate(default, messages, MAX_NEW).tokens
    serve_and_check(folder, tmp_path_factory)


def test_shared_int4_embeddings_of_a_tied_model(tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = export(tmp_path_factory, "llama", "--int4-embedding", "--shared-embeddings")
    (gather,) = [n for n in nodes(folder) if n.op_type == "GatherBlockQuantized"]
    assert gather.input[0].startswith("/model/embed_tokens/Reshape")  # the LM head's weights
    serve_and_check(folder, tmp_path_factory)
