"""The generated `tiny` model through the real onnxruntime-genai 0.18.0, as the sidecar uses it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest

from sidecar.model.engine import og  # the sidecar's import: telemetry off first

from scripts.models import make_model

Model = tuple[Any, Any, list[int]]  # og.Model, og.Tokenizer, the EOS ids from genai_config.json


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> Iterator[Model]:
    config = json.loads((tiny_model_dir / "genai_config.json").read_text())
    model = og.Model(str(tiny_model_dir))
    yield model, og.Tokenizer(model), config["model"]["eos_token_id"]


def chat(tokenizer: Any, *turns: tuple[str, str]) -> str:
    messages = [{"role": role, "content": content} for role, content in turns]
    return str(tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True))


def greedy(tiny: Model, user: str, max_new: int) -> tuple[list[int], str, bool]:
    """New tokens, the text a tokenizer stream made of them, and whether the generator is done."""
    model, tokenizer, _ = tiny
    prompt = tokenizer.encode(chat(tokenizer, ("user", user)))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + max_new)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    stream = tokenizer.create_stream()
    tokens: list[int] = []
    text = ""
    while not generator.is_done():
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        tokens.append(token)
        text += stream.decode(token)
    return tokens, text, len(tokens) < max_new


def test_greedy_generation_streams_32_tokens(tiny: Model) -> None:
    tokens, text, ended = greedy(tiny, make_model.LONG_PROMPT, 32)
    assert len(tokens) == 32 and not ended
    assert text == tiny[1].decode(tokens)  # the stream loses nothing
    assert text.strip() and "\ufffd" not in text
    assert greedy(tiny, make_model.LONG_PROMPT, 32)[0] == tokens  # greedy is deterministic


def test_eos_prompt_ends_within_a_few_tokens(tiny: Model) -> None:
    tokens, text, ended = greedy(tiny, make_model.EOS_PROMPT, 32)
    assert ended and tokens[-1] in tiny[2]
    assert 2 <= len(tokens) <= 8 and text.strip()


def test_long_prompt_reply_has_multibyte_characters(tiny: Model) -> None:
    _, text, ended = greedy(tiny, make_model.LONG_PROMPT, 64)
    assert not ended
    assert any(len(ch.encode()) > 1 for ch in text) and "\ufffd" not in text


def test_chat_template_renders_phi3_markers(tiny: Model) -> None:
    turns = [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "Why?")]
    assert chat(tiny[1], *turns) == (
        "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n"
        "<|assistant|>\nHello!<|end|>\n<|user|>\nWhy?<|end|>\n<|assistant|>\n"
    )


@pytest.mark.parametrize(
    "text",
    [
        "Café naïve façade — déjà vu",
        "Emoji 😀🎉 and a family 👩‍👩‍👧 and flags 🇫🇷",
        "中文，日本語のテキスト，한국어",
        "שלום עולם, مرحبا بالعالم",
        "tabs\tand\nnewlines  and  spaces ",
    ],
)
def test_utf8_round_trips(tiny: Model, text: str) -> None:
    tokenizer = tiny[1]
    tokens = tokenizer.encode(text)
    assert tokenizer.decode(tokens) == text
    stream = tokenizer.create_stream()
    assert "".join(stream.decode(int(t)) for t in tokens) == text


def test_encode_adds_no_bos_and_parses_special_token_strings(tiny: Model) -> None:
    """Facts the sidecar's prompt builder relies on (it must neutralise markers in user text)."""
    tokenizer = tiny[1]
    ids = make_model.special_ids(make_model.PRESETS["tiny"].vocab)
    assert list(tokenizer.encode("<|end|>")) == [ids["<|end|>"]]  # text becomes the marker
    assert int(tokenizer.encode("Hi")[0]) != 1  # no <s> in front
    assert tokenizer.decode([ids["<|user|>"], *tokenizer.encode("Hi")]) == "Hi"  # specials skipped


def test_pruned_lm_head_gives_the_same_replies(tiny: Model, tmp_path: Path) -> None:
    """--prune-lm-head (the builder's prune_lm_head: logits of the last position only) loads in
    onnxruntime-genai, says so in its graph, and generates exactly the unpruned model's tokens."""
    pruned_dir = tmp_path / "pruned"
    assert make_model.main(["--preset", "tiny", "--out", str(pruned_dir), "--prune-lm-head"]) == 0
    graph = onnx.load(str(pruned_dir / make_model.FILENAME), load_external_data=False)
    assert "/lm_head/prune/Gather" in [n.name for n in graph.graph.node]
    (logits,) = [o for o in graph.graph.output if o.name == "logits"]
    assert logits.type.tensor_type.shape.dim[1].dim_value == 1
    model = og.Model(str(pruned_dir))
    pruned = (model, og.Tokenizer(model), tiny[2])
    for prompt in (make_model.LONG_PROMPT, "Hi"):
        assert greedy(pruned, prompt, 24)[0] == greedy(tiny, prompt, 24)[0]
