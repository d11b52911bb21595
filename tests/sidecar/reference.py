"""The reply a raw onnxruntime-genai loop gives, in this process: what the sidecar must match."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from sidecar.model.engine import og  # the sidecar's import: telemetry off first


@dataclass
class Reference:
    tokens: list[int]
    pieces: list[str]  # what the tokenizer stream returned for each token ('' = incomplete)
    eos: bool

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@cache
def _load(model_dir: str) -> tuple[Any, Any, frozenset[int]]:
    config = json.loads((Path(model_dir) / "genai_config.json").read_text())
    model = og.Model(model_dir)
    return model, og.Tokenizer(model), frozenset(config["model"]["eos_token_id"])


def prompt_ids(model_dir: Path, messages: list[dict[str, str]]) -> list[int]:
    _, tokenizer, _ = _load(str(model_dir))
    text = tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True)
    return [int(i) for i in tokenizer.encode(text)]


def generate(
    model_dir: Path, messages: list[dict[str, str]], max_new_tokens: int, **search: Any
) -> Reference:
    """Greedy unless `search` says otherwise (same options as the sidecar passes)."""
    model, tokenizer, eos_ids = _load(str(model_dir))
    ids = prompt_ids(model_dir, messages)
    params = og.GeneratorParams(model)
    params.set_search_options(
        max_length=len(ids) + max_new_tokens, **(search or {"do_sample": False})
    )
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    stream = tokenizer.create_stream()
    tokens: list[int] = []
    pieces: list[str] = []
    while len(tokens) < max_new_tokens:
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        tokens.append(token)
        if token in eos_ids:
            return Reference(tokens, pieces, eos=True)
        pieces.append(stream.decode(token))
    return Reference(tokens, pieces, eos=False)


LONG_REPLY_CANDIDATES = (
    "Continue the list: apples, pears,",
    "Write a long poem about the sea.",
    "hello world",
    "Please write an essay.",
    "Bonjour, ça va ?",
    "What is the capital of France?",
)


@cache
def long_reply_prompt(model_dir: Path, min_tokens: int) -> str:
    """A user message whose greedy reply has no EOS within `min_tokens` tokens."""
    for prompt in LONG_REPLY_CANDIDATES:
        if not generate(model_dir, [{"role": "user", "content": prompt}], min_tokens).eos:
            return prompt
    raise AssertionError(f"no candidate prompt gives {min_tokens} tokens without EOS")
