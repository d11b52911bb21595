"""The reply a raw onnxruntime-genai loop gives, in this process: what the sidecar must match.

To the bit where this CPU's kernels give a row the same bits alone and in a batch
(tests/support/kernels.py); elsewhere (AVX2-only CPUs) `assert_agrees` checks what holds
there: the sidecar's reply is the reference's until a step whose choice the kernels' drift can
decide (the two highest logits closer than a few times the drift measured on this very prompt
between onnxruntime-genai's one-row and two-row decode).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.model.batch.sampling import penalize_repeats
from sidecar.model.engine import og  # the sidecar's import: telemetry off first
from tests.support.kernels import rows_exact_in_batches


@dataclass
class Reference:
    tokens: list[int]
    pieces: list[str]  # what the tokenizer stream returned for each token ('' = incomplete)
    eos: bool
    # Greedy only: at each step, the highest logit less the next one (after the penalty)
    margins: list[float] = field(default_factory=list)

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
    search = search or {"do_sample": False}
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + max_new_tokens, **search)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    stream = tokenizer.create_stream()
    greedy = not search.get("do_sample", False)
    penalty = float(search.get("repetition_penalty", 1.0))
    reference = Reference([], [], eos=False)
    while len(reference.tokens) < max_new_tokens:
        if greedy:
            logits = np.array(generator.get_logits(), dtype=np.float32).reshape(-1)
            if penalty != 1.0:
                logits = penalize_repeats(logits, [*ids, *reference.tokens], penalty)
            top_two = np.partition(logits, -2)[-2:]
            reference.margins.append(float(top_two[1] - top_two[0]))
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        reference.tokens.append(token)
        if token in eos_ids:
            reference.eos = True
            return reference
        reference.pieces.append(stream.decode(token))
    return reference


# The least a near tie may be: the sidecar's path differs from onnxruntime-genai's in more than
# the decode's row count (prompt chunks, threads, the KV's encoding), and on an AVX2-only CPU a
# generated model's reply was seen to part at a lead of 0.0012 where the measured drift was 0.
# A fiftieth of the generated models' spread of logits (about 0.93): about one step in ten
# of a random model's replies leads by less.
TIE_FLOOR = 0.02


@cache
def _drift(model_dir: str, messages: str, max_new_tokens: int, search: str) -> float:
    """The largest difference of a logit between onnxruntime-genai's decode of one row and of
    the same row beside a copy (the one-row and the many-row kernels), over the steps until
    their tokens part."""
    model, _, _ = _load(model_dir)
    ids = np.array(prompt_ids(Path(model_dir), json.loads(messages)), dtype=np.int32)
    runs = []
    for rows in (1, 2):
        params = og.GeneratorParams(model)
        params.set_search_options(
            max_length=len(ids) + max_new_tokens, batch_size=rows, **json.loads(search)
        )
        generator = og.Generator(model, params)
        generator.append_tokens(np.stack([ids] * rows))
        steps: list[tuple[np.ndarray, int]] = []
        while len(steps) < max_new_tokens and not generator.is_done():
            logits = np.array(generator.get_logits(), dtype=np.float32)[0].reshape(-1)
            generator.generate_next_token()
            steps.append((logits, int(generator.get_next_tokens()[0])))
        runs.append(steps)
    drift = 0.0
    for (one, token_one), (two, token_two) in zip(*runs, strict=False):
        drift = max(drift, float(np.abs(one - two).max()))
        if token_one != token_two:
            break
    return drift


def assert_agrees(
    reply: str,
    model_dir: Path,
    messages: list[dict[str, str]],
    max_new_tokens: int,
    *,
    cut: bool = False,
    **search: Any,
) -> None:
    """The sidecar's greedy `reply` is the reference's: to the bit where the kernels are exact
    in batches, else the same until a step whose two best choices the drift can swap. `cut`:
    the reply was stopped early (its user left), so only its beginning is compared."""
    reference = generate(model_dir, messages, max_new_tokens, **search)
    if cut and reference.text.startswith(reply):
        return
    if rows_exact_in_batches() or reply == reference.text:
        assert reply == reference.text
        return
    text = ""
    parted = len(reference.pieces)  # the reply goes on where the reference chose its EOS
    for step, piece in enumerate(reference.pieces):
        if not reply.startswith(text + piece):
            parted = step
            break
        text += piece
    assert parted < len(reference.margins), (reply, reference.text)
    first = parted  # a piece held back (an incomplete character) parts where its bytes began
    while first > 0 and reference.pieces[first - 1] == "":
        first -= 1
    search_json = json.dumps(search or {"do_sample": False}, sort_keys=True)
    drift = _drift(str(model_dir), json.dumps(messages), max_new_tokens, search_json)
    tie = max(3 * drift, TIE_FLOOR)
    margin = min(reference.margins[first : parted + 1])
    assert margin <= tie, (
        f"the reply parts from the reference at token {parted}, where its best choice led by "
        f"{margin:.4f}: more than {tie:.4f} (the kernels' drift on this prompt: {drift:.4f})"
        f"\nreply:     {reply!r}\nreference: {reference.text!r}"
    )


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
