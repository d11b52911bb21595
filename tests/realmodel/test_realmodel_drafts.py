"""Prompt-lookup drafts on the batched path (model/batch/drafts.py) on SmolLM2-135M-Instruct: a
grounded answer, a reply that copies its passage and a plain chat are the same greedy replies
with drafts on and off (SmolLM2's weights are fp32: a draft's verify call differs from one token
at a time in the last bits, so a reply may part at a near tie; these do not), and a reply that
copies its passage takes well over one token per model call."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.bench import prompt_lookup
from sidecar.model.engine import Engine

pytestmark = pytest.mark.realmodel

PROMPTS = {
    "grounded": prompt_lookup.QUOTE,
    "copies": prompt_lookup.COPY,
    "chat": prompt_lookup.CHAT,
}


def test_greedy_replies_are_the_same_with_drafts_on_and_off(smollm2_dir: Path) -> None:
    engines = {}
    for side, tokens in (("on", 4), ("off", 0)):
        engines[side] = Engine(
            smollm2_dir, decode_batch_rows=4, max_concurrency=4, prompt_lookup_tokens=tokens
        )
        engines[side].warm_up()
    for label, prompt in PROMPTS.items():
        on = prompt_lookup.run_alone(engines["on"], prompt, 96)
        off = prompt_lookup.run_alone(engines["off"], prompt, 96)
        assert on["text"] == off["text"], label
        if label == "copies":
            assert on["accepted"] > 0 and on["tokens"] / on["calls"] > 1.5
