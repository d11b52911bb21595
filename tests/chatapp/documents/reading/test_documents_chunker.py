"""Passages never exceed the encoder's limit, and keep their headings, pages and tables."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from chatapp.documents.reading.blocks import Block
from chatapp.documents.reading.chunker import LONG_CHARS, chunk
from chatapp.documents.reading.formats import Limits, read
from chatapp.documents.reading.tokens import ByteBound, EncoderTokens, TokenCounter, counter_for

FILES = Path(__file__).parents[1] / "files"


@pytest.fixture
def wordpiece(wordpiece_dir: Path) -> EncoderTokens:
    return EncoderTokens(wordpiece_dir)


def test_the_tokenizer_counts_whole_texts_with_special_tokens(wordpiece: EncoderTokens) -> None:
    assert wordpiece.count("") == 2  # [CLS] [SEP]
    long = "the kettle boils " * 40
    assert wordpiece.count(long) > 100  # its truncation at 16 is undone
    assert isinstance(counter_for(None), ByteBound)
    assert ByteBound().count("é") == 4


def test_the_tokenizer_is_read_when_it_arrives(wordpiece_dir: Path, tmp_path: Path) -> None:
    """On App Service the app may start before its sidecar has downloaded the encoder into the
    /home they share: EMBED_TOKENIZER naming a folder not there yet is no crash; counts are the
    safe bound until tokenizer.json appears, then the encoder's own."""
    folder = tmp_path / "all-minilm-l6-v2"
    counter = counter_for(str(folder))
    assert isinstance(counter, EncoderTokens) and not counter.loaded
    text = "the kettle boils " * 10
    assert counter.count(text) == ByteBound().count(text)
    folder.mkdir()
    shutil.copy(wordpiece_dir / "tokenizer.json", folder / "tokenizer.json")
    assert counter.count(text) == EncoderTokens(wordpiece_dir).count(text) < ByteBound().count(text)
    assert counter.loaded
    assert EncoderTokens(folder / "tokenizer.json").count(text) == counter.count(text)


@pytest.mark.parametrize("limit", [24, 64, 256])
@pytest.mark.parametrize("counter_name", ["wordpiece", "bytes"])
def test_no_passage_exceeds_the_limit(
    limit: int, counter_name: str, wordpiece: EncoderTokens
) -> None:
    counter: TokenCounter = wordpiece if counter_name == "wordpiece" else ByteBound()
    rng = random.Random(limit)
    vocabulary = ["kettle", "boils", "citric", "acid.", "water,", "Ωmega", "x" * 300, "tea!"]
    blocks = [Block("heading", "Descaling the kettle in hard water", level=1)]
    for _ in range(30):
        words = [rng.choice(vocabulary) for _ in range(rng.randint(1, 120))]
        blocks.append(Block("text", " ".join(words)))
    table = "\n".join(["Setting | Temperature"] + [f"tea {i} | {i} C" for i in range(60)])
    blocks.append(Block("table", table))
    chunks = chunk(blocks, counter, limit)
    assert chunks
    for passage in chunks:
        assert passage.tokens == counter.count(passage.embedded) <= limit
        assert "Descaling the kettle in hard water".startswith(passage.heading)
    text = " ".join(c.text for c in chunks).replace("\n", " ")
    # Nothing is lost: every word of every block is in some passage, in order.
    assert text.split().count("kettle") == sum(b.text.split().count("kettle") for b in blocks[1:])


def test_a_table_that_fits_stays_whole(wordpiece: EncoderTokens) -> None:
    _, blocks = read((FILES / "guide.md").read_bytes(), "guide.md", None, Limits(10**6, 10))
    table = "Setting | Temperature\nGreen tea | 80 C\nBlack tea | 100 C"
    chunks = chunk(blocks, wordpiece, 64)
    assert [c for c in chunks if table in c.text]
    assert all(c.tokens <= 64 for c in chunks)


def test_a_table_too_large_repeats_its_header(wordpiece: EncoderTokens) -> None:
    rows = [f"green tea {i} | {i} c" for i in range(40)]
    table = Block("table", "\n".join(["setting | temperature", *rows]))
    chunks = chunk([table], wordpiece, 48)
    assert len(chunks) > 2
    assert all(c.text.startswith("setting | temperature\n") for c in chunks)
    assert sum(c.text.count("green tea") for c in chunks) == 40


def test_heading_paths_and_pages(wordpiece: EncoderTokens) -> None:
    blocks = [
        Block("heading", "Manual", level=1, page=1),
        Block("text", "the kettle boils water", page=1),
        Block("heading", "Descaling", level=2, page=1),
        Block("text", "citric acid once a month", page=1),
        Block("text", "the warranty lasts months", page=2),
        Block("heading", "Warranty", level=1, page=3),
        Block("text", "receipt date", page=3),
    ]
    chunks = chunk(blocks, wordpiece, 128)
    assert [(c.heading, c.page, c.text) for c in chunks] == [
        ("Manual", 1, "the kettle boils water"),
        ("Manual › Descaling", 1, "citric acid once a month"),
        ("Manual › Descaling", 2, "the warranty lasts months"),
        ("Warranty", 3, "receipt date"),
    ]
    assert [c.ordinal for c in chunks] == [0, 1, 2, 3]
    assert chunks[1].embedded == "Manual › Descaling\n\ncitric acid once a month"


def test_a_huge_heading_is_cut_to_leave_room_for_text() -> None:
    blocks = [Block("heading", "h" * 500, level=1), Block("text", "body")]
    chunks = chunk(blocks, ByteBound(), 64)
    assert chunks[0].text == "body"
    assert chunks[0].tokens <= 64


def test_the_encoder_folder_s_limit_lowers_the_setting(tmp_path: Path) -> None:
    from chatapp.documents.reading.tokens import encoder_limit, passage_tokens

    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 256}')
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 64}')
    assert encoder_limit(tmp_path) == 64  # as the sidecar caps it
    assert passage_tokens(str(tmp_path), 256) == 64
    assert passage_tokens(str(tmp_path), 32) == 32
    assert passage_tokens(None, 256) == 256
    (tmp_path / "config.json").unlink()
    assert encoder_limit(tmp_path / "tokenizer.json") == 256


class Counting:
    """A counter that adds up the characters it was asked to count: the cutter's work."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.characters = 0

    def count(self, text: str) -> int:
        self.characters += len(text)
        return self.counter.count(text)


@pytest.mark.parametrize("counter_name", ["wordpiece", "bytes"])
@pytest.mark.parametrize("unit", ["a,", "QmFzZTY0"])
def test_text_without_whitespace_is_cut_in_linear_work(
    counter_name: str, unit: str, wordpiece: EncoderTokens
) -> None:
    """A base64 `.log` or `a,a,a,...` is one word: the cutter searched the rest of that word for
    every piece (64 KB took 133 s). Its work now grows with the text, not with its square."""
    work = []
    for size in (16_000, 64_000):
        counter = Counting(wordpiece if counter_name == "wordpiece" else ByteBound())
        text = (unit * size)[:size]
        passages = chunk([Block("text", text)], counter, 64)
        # Every character kept, in order (a passage joins its pieces with spaces).
        assert "".join(p.text for p in passages).replace(" ", "") == text
        assert all(p.tokens <= 64 and len(p.text) <= 64 * LONG_CHARS for p in passages)
        work.append(counter.characters / size)
    assert work[1] < 1.5 * work[0] + 5, work  # per character: about the same at 4x the size
    assert work[1] < 60, work
