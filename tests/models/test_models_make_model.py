"""scripts/models/make_model.py: files, shapes and determinism, without onnxruntime-genai."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import onnx
import pytest

from scripts.models import make_model

SCRIPT = Path(make_model.__file__)
PHI3_DATA_BYTES = 2_722_861_056  # Microsoft's phi3-mini-4k-instruct-cpu-int4-...onnx.data


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="module")
def phi3_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("phi3") / "model"
    result = run("--preset", "phi3-mini", "--out", str(out), "--graph-only")
    assert result.returncode == 0, result.stderr
    assert f"{PHI3_DATA_BYTES:,}" in result.stdout
    return out


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_same_arguments_give_byte_identical_files(tiny_model_dir: Path, tmp_path: Path) -> None:
    make_model.make_model(make_model.PRESETS["tiny"], tmp_path / "again")
    assert files(tmp_path / "again") == files(tiny_model_dir)
    make_model.make_model(make_model.PRESETS["tiny"], tmp_path / "other", seed=1)
    data = f"{make_model.FILENAME}.data"
    assert files(tmp_path / "other")[data] != files(tiny_model_dir)[data]


def test_tiny_folder_has_the_published_file_names(tiny_model_dir: Path) -> None:
    names = {p.name for p in tiny_model_dir.iterdir()}
    assert names == {
        "genai_config.json",
        make_model.FILENAME,
        f"{make_model.FILENAME}.data",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
    }


def test_phi3_mini_config_matches_the_published_one(phi3_graph: Path) -> None:
    config = json.loads((phi3_graph / "genai_config.json").read_text())
    model, decoder = config["model"], config["model"]["decoder"]
    assert (model["type"], model["vocab_size"], model["context_length"]) == ("phi3", 32064, 4096)
    assert (model["bos_token_id"], model["pad_token_id"]) == (1, 32000)
    assert model["eos_token_id"] == [32000, 32001, 32007]
    assert decoder["filename"] == make_model.FILENAME
    assert (decoder["hidden_size"], decoder["head_size"], decoder["num_hidden_layers"]) == (
        3072,
        96,
        32,
    )
    assert (decoder["num_attention_heads"], decoder["num_key_value_heads"]) == (32, 32)
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert decoder["outputs"]["present_value_names"] == "present.%d.value"
    assert config["search"]["past_present_share_buffer"] is True
    assert config["search"]["max_length"] == 4096


def test_phi3_mini_weights_are_exactly_the_published_size(phi3_graph: Path) -> None:
    assert not (phi3_graph / f"{make_model.FILENAME}.data").exists()
    graph = onnx.load(str(phi3_graph / make_model.FILENAME), load_external_data=False).graph
    spans = []
    for tensor in graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {entry.key: entry.value for entry in tensor.external_data}
            spans.append((int(info["offset"]), int(info["length"])))
    spans.sort()
    assert spans[0][0] == 0
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(spans))  # no gaps
    assert spans[-1][0] + spans[-1][1] == PHI3_DATA_BYTES


def test_phi3_mini_graph_uses_the_official_operators(phi3_graph: Path) -> None:
    graph = onnx.load(str(phi3_graph / make_model.FILENAME), load_external_data=False).graph
    ops = Counter(node.op_type for node in graph.node)
    assert ops["MatMulNBits"] == 32 * 5 + 1  # qkv, o, gate, up, down per layer; LM head
    assert ops["GroupQueryAttention"] == 32
    assert ops["SkipSimplifiedLayerNormalization"] == 2 * 32  # 63 in layers + the final norm
    assert ops["SimplifiedLayerNormalization"] == 1
    for node in graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "MatMulNBits":
            assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (4, 32, 4)
        if node.op_type == "GroupQueryAttention":
            assert (attrs["num_heads"], attrs["kv_num_heads"], attrs["do_rotary"]) == (32, 32, 1)
    n_by_name = {
        n.name: onnx.helper.get_attribute_value(n.attribute[1])
        for n in graph.node
        if n.op_type == "MatMulNBits"
    }
    assert n_by_name["/model/layers.0/attn/qkv_proj/MatMul"] == 3 * 3072
    assert n_by_name["/lm_head/MatMul"] == 32064
    names = [i.name for i in graph.input]
    assert names[:2] == ["input_ids", "attention_mask"] and "past_key_values.31.value" in names
    outputs = [o.name for o in graph.output]
    assert outputs[0] == "logits" and "present.31.key" in outputs
    assert all(i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for i in graph.input[2:])


def test_phi3_mini_tokenizer_has_phi3_ids(phi3_graph: Path) -> None:
    tokenizer = json.loads((phi3_graph / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    assert len(vocab) == 32064 and sorted(vocab.values()) == list(range(32064))
    expected = {"<unk>": 0, "<s>": 1, "</s>": 2, "<|endoftext|>": 32000, "<|assistant|>": 32001}
    expected |= {"<|system|>": 32006, "<|end|>": 32007, "<|user|>": 32010}
    assert {token: vocab[token] for token in expected} == expected
    config = json.loads((phi3_graph / "tokenizer_config.json").read_text())
    assert "<|assistant|>\n" in config["chat_template"]


def test_small_vocabularies_put_the_specials_at_the_end() -> None:
    ids = make_model.special_ids(1024)
    assert ids["<|endoftext|>"] == 1013 and ids["<|end|>"] == 1020 and ids["<|user|>"] == 1023


def test_flags_override_the_preset(tmp_path: Path) -> None:
    flags = ["--hidden-size", "128", "--layers", "3", "--heads", "8", "--kv-heads", "2"]
    flags += ["--intermediate-size", "256", "--vocab-size", "2048", "--context-length", "1024"]
    result = run("--preset", "tiny", "--out", str(tmp_path), "--graph-only", *flags)
    assert result.returncode == 0, result.stderr
    model = json.loads((tmp_path / "genai_config.json").read_text())["model"]
    decoder = model["decoder"]
    assert (decoder["hidden_size"], decoder["num_hidden_layers"], decoder["head_size"]) == (
        128,
        3,
        16,
    )
    assert (decoder["num_attention_heads"], decoder["num_key_value_heads"]) == (8, 2)
    assert (model["vocab_size"], model["context_length"]) == (2048, 1024)


@pytest.mark.parametrize(
    "flags",
    [
        ["--heads", "5"],
        ["--kv-heads", "3"],
        ["--intermediate-size", "100"],
        ["--vocab-size", "200"],
        ["--preset", "huge"],
    ],
)
def test_bad_shapes_are_refused(tmp_path: Path, flags: list[str]) -> None:
    result = run("--out", str(tmp_path), *flags)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert not (tmp_path / make_model.FILENAME).exists()


def test_the_script_says_what_it_wrote(tmp_path: Path) -> None:
    result = run("--preset", "tiny", "--out", str(tmp_path / "m"))
    assert result.returncode == 0
    assert str(tmp_path / "m") in result.stdout and " s" in result.stdout
