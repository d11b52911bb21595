"""Moving cached keys (model/kv/rotary.py): the rotary tables read from the real tiny model's
graph, a move that matches the model's own rotation at the new position, a move of 0 that is a
copy, and the graphs whose attention cannot take moved keys refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sidecar.model.batch.decoder import BatchDecoder, read_spec
from sidecar.model.kv import rotary
from sidecar.model.kv.rotary import NotRotatable


@pytest.fixture(scope="module")
def decoder(tiny_model_dir: Path) -> BatchDecoder:
    spec = read_spec(json.loads((tiny_model_dir / "genai_config.json").read_text()))
    return BatchDecoder(tiny_model_dir, spec, {}, 2, 3, 256)


@pytest.fixture(scope="module")
def tables(tiny_model_dir: Path, decoder: BatchDecoder) -> rotary.Rotary:
    return rotary.read(tiny_model_dir, decoder.spec.filename, decoder.spec.head_size)


def test_the_tables_are_the_graphs_own(
    tiny_model_dir: Path, decoder: BatchDecoder, tables: rotary.Rotary
) -> None:
    model = onnx.load(str(tiny_model_dir / decoder.spec.filename))
    stored = {t.name: t for t in model.graph.initializer}
    cos = numpy_helper.to_array(stored["cos_cache"], base_dir=str(tiny_model_dir))
    sin = numpy_helper.to_array(stored["sin_cache"], base_dir=str(tiny_model_dir))
    assert np.array_equal(tables.cos, cos.astype(np.float64))
    assert np.array_equal(tables.sin, sin.astype(np.float64))
    assert tables.interleaved is False


def keys_at(decoder: BatchDecoder, slot: int, before: int, ids: list[int]) -> np.ndarray:
    """Layer 0's keys of `ids` read after `before` filler tokens (layer 0's keys depend on the
    token and its position only)."""
    decoder.pool.free(slot)
    decoder.run(slot, np.array([[1] * before]), [0])
    decoder.run(slot, np.array([ids]), [before])
    return decoder.pool.keys[0][slot, :, before : before + len(ids)].copy()


@pytest.mark.parametrize(("start", "end"), [(10, 40), (40, 10), (3, 200)])
def test_a_move_is_the_models_own_rotation_there(
    decoder: BatchDecoder, tables: rotary.Rotary, start: int, end: int
) -> None:
    ids = [5, 17, 99, 3, 250, 41, 8, 77]
    read_there = keys_at(decoder, 1, end, ids)
    moved = np.empty_like(read_there)
    tables.move(keys_at(decoder, 0, start, ids), end - start, moved)
    assert not np.allclose(keys_at(decoder, 0, start, ids), read_there)
    np.testing.assert_allclose(moved, read_there, atol=1e-5)


def test_a_move_of_nothing_copies_bit_for_bit_and_there_and_back_stays_close(
    decoder: BatchDecoder, tables: rotary.Rotary
) -> None:
    keys = np.random.default_rng(7).standard_normal((4, 12, decoder.spec.head_size))
    keys = keys.astype(np.float32)
    same = np.empty_like(keys)
    tables.move(keys, 0, same)
    assert np.array_equal(same, keys)
    there, back = np.empty_like(keys), np.empty_like(keys)
    tables.move(keys, 1000, there)
    tables.move(there, -1000, back)
    np.testing.assert_allclose(back, keys, atol=1e-5)
    in_place = keys.copy()
    tables.move(in_place, 1000, in_place)  # out may be the keys themselves
    assert np.array_equal(in_place, there)
    with pytest.raises(ValueError, match="past the model's tables"):
        tables.move(keys, tables.positions, there)


def graph_file(
    folder: Path, *, do_rotary: int = 1, stored: bool = True, linear: bool = True
) -> Path:
    """A one-node decoder graph: GroupQueryAttention over tables as the builder writes them."""
    positions, pairs = 16, 4
    angle = np.arange(positions)[:, None] * (0.5 ** np.arange(pairs))[None, :]
    if not linear:
        angle = angle**1.5  # not one rotation per position
    inputs = ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total_len", "cos", "sin"]
    node = helper.make_node(
        "GroupQueryAttention",
        inputs,
        ["out", "present_key", "present_value"],
        domain="com.microsoft",
        num_heads=2,
        kv_num_heads=1,
        do_rotary=do_rotary,
        rotary_interleaved=0,
        local_window_size=-1,
    )
    made = [
        numpy_helper.from_array(np.cos(angle).astype(np.float32), "cos"),
        numpy_helper.from_array(np.sin(angle).astype(np.float32), "sin"),
    ]
    nodes = [node]
    if not stored:  # computed in the graph (as LongRoPE picks one of two tables)
        nodes = [helper.make_node("Identity", ["cos_table"], ["cos"]), *nodes]
        made[0].name = "cos_table"
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("qkv", TensorProto.FLOAT, None)], [], made
    )
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_a_graph_built_like_the_exports_is_read(tmp_path: Path) -> None:
    graph_file(tmp_path)
    tables = rotary.read(tmp_path, "model.onnx", 8)
    assert tables.positions == 16 and tables.pairs == 4


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"do_rotary": 0}, "does not rotate keys in the op"),
        ({"stored": False}, "computed in the graph"),
        ({"linear": False}, "not one rotation per position"),
    ],
)
def test_attention_that_cannot_take_moved_keys_is_refused_with_the_reason(
    tmp_path: Path, options: dict[str, object], reason: str
) -> None:
    graph_file(tmp_path, **options)  # type: ignore[arg-type]
    with pytest.raises(NotRotatable, match=reason):
        rotary.read(tmp_path, "model.onnx", 8)


def test_a_file_that_is_no_graph_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"\xff" * 64)
    with pytest.raises(NotRotatable, match="cannot be read"):
        rotary.read(tmp_path, "model.onnx", 8)
    (tmp_path / "model.onnx").write_bytes(b"")
    with pytest.raises(NotRotatable, match="cannot be read"):
        rotary.read(tmp_path, "model.onnx", 8)
    plain = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [], [])
    onnx.save(helper.make_model(plain), str(tmp_path / "model.onnx"))
    with pytest.raises(NotRotatable, match="no GroupQueryAttention"):
        rotary.read(tmp_path, "model.onnx", 8)
