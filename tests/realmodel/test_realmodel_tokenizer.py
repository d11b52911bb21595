"""The tokenizer rebuilt from the GGUF, as onnxruntime-genai reads it: the model's own greedy
replies survive a decode/encode round trip (what lets the conversation cache reuse a reply),
and it splits text as the Hugging Face `tokenizers` library does with the same file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.ipc import Generate

pytestmark = pytest.mark.realmodel

QUESTIONS = [
    "What is the capital of France?",
    "List three primary colors as a numbered list.",
    "Write a Python function that adds two numbers.",
    "How many days are in a week?",
    "Describe the ocean in two sentences.",
]
TEXTS = [
    "The capital of France is Paris.",
    "In 2024, 1,234,567 people paid $89.99 each (about 12%).",
    "def add(a, b):\n    return a + b\n\n\tindented\r\nline",
    "Café naïve — 😀 中文字符 Привет   many   spaces",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "don't won't I'm you're they'll",
]


@pytest.fixture(scope="module")
def engine(smollm2_dir: Path) -> Iterator[Any]:
    from sidecar.model.engine import Engine

    yield Engine(smollm2_dir)


def greedy_ids(engine: Any, question: str, max_new: int = 64) -> list[int]:
    """The token ids the model generates for `question`, greedily, its end token left out."""
    import onnxruntime_genai as og

    prompt = engine.prompts.fit(((("user", question),)), max_new, engine.max_length)
    params = og.GeneratorParams(engine.model)
    params.set_search_options(max_length=len(prompt.ids) + max_new, do_sample=False)
    generator = og.Generator(engine.model, params)
    generator.append_tokens(prompt.ids)
    ids: list[int] = []
    while not generator.is_done() and len(ids) < max_new:
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        if token in engine.eos_ids:
            break
        ids.append(token)
    return ids


@pytest.mark.parametrize("question", QUESTIONS)
def test_greedy_replies_round_trip(engine: Any, question: str) -> None:
    ids = greedy_ids(engine, question)
    assert len(ids) > 3
    text = engine.tokenizer.decode(ids)
    assert [int(i) for i in engine.tokenizer.encode(text)] == ids, text


@pytest.mark.parametrize("text", TEXTS)
def test_onnxruntime_genai_splits_as_tokenizers_does(
    engine: Any, smollm2_dir: Path, text: str
) -> None:
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    expected = reference.encode(text, add_special_tokens=False).ids
    assert [int(i) for i in engine.tokenizer.encode(text)] == expected
    # Decoding leaves special tokens out, in both.
    assert (
        engine.tokenizer.decode(expected)
        == reference.decode(expected)
        == text.replace("<|im_start|>", "").replace("<|im_end|>", "")
    )


def test_digits_are_single_tokens(engine: Any) -> None:
    """SmolLM2's pre-tokenizer (`smollm`) splits every digit: 2024 is four tokens."""
    ids = [int(i) for i in engine.tokenizer.encode("2024")]
    assert [engine.tokenizer.decode([i]) for i in ids] == ["2", "0", "2", "4"]


def test_a_reply_through_the_engine_is_the_decoded_ids(engine: Any) -> None:
    """The sidecar's streaming decoder gives the same text as decoding the ids at once."""
    question = QUESTIONS[1]
    generation = engine.start(Generate("t", (("user", question),), 64), cached=False)
    pieces = []
    while generation.finish is None:
        piece = generation.step()
        if piece is not None:
            pieces.append(piece)
    generation.release(reusable=False)
    assert "".join(pieces) == engine.tokenizer.decode(greedy_ids(engine, question))
