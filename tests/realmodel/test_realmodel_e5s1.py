"""The multilingual encoder's converter on a hand-made E5S1 file (tests/realmodel/handmade_e5s1.py):
the file read as its format says, the Q4_0 blocks, the tokenizer rebuilt from its vocabulary and
normalisation table, and the ONNX graph against BERT written out in numpy. No download: the real
file's build is test_realmodel_multilingual.py's."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from scripts.models.realmodel import dequant, unigram_tokenizer
from scripts.models.realmodel.bert_graph import write_bert_graph
from scripts.models.realmodel.build import BuildError
from scripts.models.realmodel.e5s1 import E5S1Error, read_e5s1
from scripts.models.realmodel.unigram_tokenizer import (
    build_tokenizer,
    check_normalizer,
    normalizer,
)
from tests.realmodel import handmade_e5s1
from tests.realmodel.handmade_e5s1 import HEADS, HIDDEN, LAYERS, PIECES

# The codepoints the tokenizer tests look at (the build looks at all 1,114,112): ASCII and
# Latin-1, some NFKC changes (ligatures, fullwidth forms), the table's own exceptions.
CODEPOINTS = [*range(0x300), 0x2581, 0xFB01, 0xFF21, 0xFF5E, 0x200B, *range(0xFDD0, 0xFDD4)]


def nfkc_table(codepoints: list[int]) -> dict[int, str]:
    """What NFKC makes of each codepoint that it changes: the bulk of XLM-R's table."""
    from tokenizers import normalizers

    nfkc = normalizers.NFKC()
    table = {cp: nfkc.normalize_str(chr(cp)) for cp in codepoints}
    return {cp: out for cp, out in table.items() if out != chr(cp)}


# XLM-R's table differs from NFKC as the real one does: controls removed, tab, zero-width space
# and U+2581 made spaces, the fullwidth tilde kept as it is.
TABLE = nfkc_table(CODEPOINTS) | {0x01: "", 0x7F: "", 0x09: " ", 0x200B: " ", 0x2581: " "}
TABLE[0xFF5E] = "\uff5e"


@pytest.fixture(autouse=True)
def few_codepoints(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(unigram_tokenizer, "_codepoints", lambda: CODEPOINTS)
    yield


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> handmade_e5s1.Handmade:
    return handmade_e5s1.write_e5s1(tmp_path_factory.mktemp("e5s1") / "tiny.bin", TABLE)


def test_q4_0_block_layout_by_hand() -> None:
    """ggml's block_q4_0: d (fp16), 16 bytes whose low nibbles are weights 0-15 and high
    nibbles weights 16-31; each weight is d * (q - 8)."""
    q = (np.arange(32) * 7) % 16
    block = struct.pack("<e", 0.25) + bytes(int(q[j]) | int(q[j + 16]) << 4 for j in range(16))
    got = dequant.q4_0(np.frombuffer(block, np.uint8))
    assert np.array_equal(got, (q - 8) * 0.25)
    integers, scales = dequant.q4_0_parts(np.frombuffer(block, np.uint8))
    assert integers.dtype == np.int8 and np.array_equal(integers[0], q - 8) and scales[0] == 0.25


def test_the_file_is_read_as_its_format_says(made: handmade_e5s1.Handmade) -> None:
    e5 = read_e5s1(made.path)
    assert (e5.hidden, e5.layers, e5.heads, e5.ffn) == (HIDDEN, LAYERS, HEADS, 128)
    assert (e5.rows, e5.positions, e5.token_types) == (handmade_e5s1.ROWS, 16, 2)
    assert e5.pieces == [p for p, _ in PIECES] and list(e5.scores) == [s for _, s in PIECES]
    assert (e5.bos, e5.eos, e5.pad, e5.unk) == (0, 2, 1, 3)
    assert e5.normalisation == TABLE
    for name, value in made.weights.items():
        assert np.array_equal(e5.weight(name), value), name
    integers, scales = e5.q4_parts("l0.fi.w")
    blocks = integers.reshape(128, HIDDEN // 32, 32) * scales[:, :, None]
    assert np.array_equal(blocks.reshape(128, HIDDEN), made.weights["l0.fi.w"])


@pytest.mark.parametrize(
    ("breaks", "says"),
    [
        (lambda data: b"GGUF" + data[4:], "does not start with"),
        (lambda data: data[:4] + struct.pack("<I", 2) + data[8:], "version 2"),
        (lambda data: data[:200], "ends at byte 200"),
        (lambda data: data[:-1], r"tensor l0.fo.b: type 0, bytes \d+\+256 of"),
    ],
)
def test_what_is_refused(
    made: handmade_e5s1.Handmade, tmp_path: Path, breaks: object, says: str
) -> None:
    broken = tmp_path / "broken.bin"
    broken.write_bytes(breaks(made.path.read_bytes()))  # type: ignore[operator]
    with pytest.raises(E5S1Error, match=says):
        read_e5s1(broken)


def test_the_normalizer_is_nfkc_and_the_table_s_differences() -> None:
    built = normalizer(TABLE)
    assert built.normalize_str("a\x01b\tc\u200bd") == "ab c d"
    assert built.normalize_str("\ufb01ne \uff21  \uff5e") == "fine A \uff5e"  # NFKC, tilde kept
    assert built.normalize_str("\ufdd0") == "\uff5e"  # a noncharacter stands in for it

    class Holder:
        pass

    holder = Holder()
    holder.normalizer = built  # type: ignore[attr-defined]
    assert check_normalizer(holder, TABLE) == len(CODEPOINTS) - 4  # all but the placeholders
    with pytest.raises(BuildError, match=r"U\+0061 becomes 'b'"):
        normalizer(TABLE | {ord("a"): "b"})


def test_the_tokenizer_splits_as_sentencepiece(made: handmade_e5s1.Handmade) -> None:
    tokenizer = build_tokenizer(read_e5s1(made.path))
    assert tokenizer.encode("the cats").tokens == ["<s>", "▁the", "▁cat", "s", "</s>"]
    assert tokenizer.encode("query: the").tokens == ["<s>", "▁query", ":", "▁the", "</s>"]
    assert tokenizer.encode("\tthe  ca\x01t").tokens == ["<s>", "▁the", "▁cat", "</s>"]
    assert tokenizer.encode("\ufb01sh x").ids == [0, 10, 11, 4, 3, 2]  # ▁fi sh ▁ <unk>
    assert tokenizer.encode("the\uff5e").ids == [0, 5, 14, 2]
    assert tokenizer.encode("the <mask>").ids == [0, 5, 15, 2]
    assert tokenizer.decode(tokenizer.encode("the cats").ids) == "the cats"


def bert(e5: handmade_e5s1.Handmade, ids: list[int]) -> NDArray[np.float32]:
    """BertModel's hidden states for one input, written out in numpy from the weights."""
    w = e5.weights
    erf = np.vectorize(math.erf)

    def norm(x: NDArray[np.float32], name: str) -> NDArray[np.float32]:
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-12) * w[name + ".w"] + w[name + ".b"]

    def linear(x: NDArray[np.float32], name: str) -> NDArray[np.float32]:
        return x @ w[name + ".w"].T + w[name + ".b"]

    x = w["emb.word"][ids] + w["emb.pos"][: len(ids)] + w["emb.type"][0]
    x = norm(x, "emb.ln")
    head = HIDDEN // HEADS
    for layer in range(LAYERS):
        p = f"l{layer}"
        q, k, v = (linear(x, f"{p}.{n}").reshape(len(ids), HEADS, head) for n in "qkv")
        scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(head)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        context = np.einsum("hqk,khd->qhd", weights, v).reshape(len(ids), HIDDEN)
        x = norm(x + linear(context, f"{p}.ao"), f"{p}.aln")
        inner = linear(x, f"{p}.fi")
        x = norm(x + linear(inner * 0.5 * (1 + erf(inner / math.sqrt(2))), f"{p}.fo"), f"{p}.oln")
    return x.astype(np.float32)


def test_the_graph_is_bert_on_the_file_s_weights(
    made: handmade_e5s1.Handmade, tmp_path: Path
) -> None:
    """Two inputs of different lengths in one batch: each one's hidden states are BertModel's
    on its own tokens (the padding masked), the word embeddings read from the int8 table."""
    import onnxruntime as ort

    path = tmp_path / "model.onnx"
    write_bert_graph(read_e5s1(made.path), path)
    inputs = [[0, 5, 6, 9, 2], [0, 13, 12, 2]]
    ids = np.array([inputs[0], [*inputs[1], 1]], dtype=np.int64)
    mask = np.array([[1] * 5, [1] * 4 + [0]], dtype=np.int64)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    (hidden,) = session.run(None, feeds)
    for row, one in enumerate(inputs):
        assert np.allclose(hidden[row, : len(one)], bert(made, one), atol=1e-4), row
