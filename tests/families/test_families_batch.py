"""Batched decode (DECODE_BATCH_ROWS > 1) on each family's exported model: the direct
onnxruntime path takes the builder's decoder (it does not fall back to the Generator), and
four users at once get onnxruntime-genai's greedy replies, guided ones too (each family's
tokenizer.json as llguidance reads it, model/batch/guidance.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from scripts.run import services
from sidecar.model.engine import Engine
from tests.families.conftest import Exported
from tests.families.test_families_serve import CANDIDATES, MAX_NEW, reference
from tests.sidecar.model.batch.test_sidecar_batch_guidance import GRAMMARS, greedy
from tests.sidecar.support import predict

pytestmark = pytest.mark.families

USERS = CANDIDATES[:4]


@pytest.fixture(scope="module")
def batch_sidecar(
    exported: Exported, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / f"sidecar-batch-{exported.family.name}.log"
    with services.sidecar(
        exported.model_dir, log, MAX_CONCURRENCY="4", DECODE_BATCH_ROWS="4", PREFILL_CHUNK="16"
    ) as service:
        yield service


def test_four_users_at_once_get_the_generator_s_replies(
    exported: Exported, hf_tokenizer: Any, batch_sidecar: services.Service
) -> None:
    assert "batched decode is off" not in batch_sidecar.log()
    barrier = threading.Barrier(len(USERS))

    def ask(user: str) -> str:
        barrier.wait()
        body = {"messages": [{"role": "user", "content": user}], "max_new_tokens": MAX_NEW}
        response = predict(batch_sidecar.url, body, timeout=120)
        assert response.status_code == 200, response.text
        return response.text

    with ThreadPoolExecutor(len(USERS)) as pool:
        replies = list(pool.map(ask, USERS))
    assert replies == [reference(exported, hf_tokenizer, user).text for user in USERS]


def test_greedy_guided_replies_are_the_generator_s(exported: Exported) -> None:
    """Text, finish and token count for every grammar kind and the tool protocol's grammars
    (Qwen2's `<tool_call>` is an added token its tokenizer.json does not call special)."""
    batched = Engine(exported.model_dir, prefill_chunk=16, decode_batch_rows=4, max_concurrency=4)
    generator = Engine(exported.model_dir, prefill_chunk=16)
    assert batched.grammars is not None and batched.grammars.unavailable is None
    for name, guidance in GRAMMARS.items():
        for user in USERS[:2]:
            ours, theirs = greedy(batched, guidance, user), greedy(generator, guidance, user)
            assert ours == theirs, name
    assert not batched.generators.loaded
