"""The conversation cache on real replies. SmolLM2's greedy replies survive a decode/encode
round trip (test_realmodel_tokenizer.py), so each turn of a conversation can continue after the
whole previous prompt and reply; and the default (non-exact) mode must not change what the
model says: greedy replies are compared turn by turn with a sidecar that has no cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scripts.run import services
from tests.e2e import live

pytestmark = pytest.mark.realmodel

CONVERSATIONS = {
    "paris": [
        "What is the capital of France?",
        "What is it famous for?",
        "Name one museum there.",
        "What can I see in that museum?",
        "Thanks! Summarize our chat in one sentence.",
    ],
    "cooking": [
        "How do I boil an egg?",
        "How long for a soft yolk?",
        "What can I eat it with?",
        "Is it a healthy breakfast?",
        "Give me one more breakfast idea.",
    ],
    "numbers": [
        "What is 2 + 2?",
        "And 10 times 3?",
        "How many days are in a week?",
        "How many hours are in a day?",
        "List the numbers from one to five.",
    ],
}
MAX_NEW = 32


@pytest.fixture(scope="module")
def uncached_sidecar(
    smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-smollm2-uncached.log"
    with services.sidecar(smollm2_dir, log, PROMPT_CACHE_MB="0") as service:
        yield service


def token_count(model_dir: Path, text: str) -> int:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def test_five_turns_through_the_app_each_reuse_the_whole_previous_turn(
    smollm2_app: services.Service, smollm2_dir: Path
) -> None:
    """Turn n+1's prompt starts with turn n's prompt and reply: all of it comes from the
    cache (a reply the length limit cut keeps its last token out of the KV cache)."""
    messages: list[dict[str, str]] = []
    previous: tuple[int, str] | None = None
    for turn, question in enumerate(CONVERSATIONS["paris"]):
        messages.append({"role": "user", "content": question})
        objs = live.chat(
            smollm2_app.url, messages, conversation_id="five-turns", max_new_tokens=MAX_NEW
        )
        done = objs[-1]
        assert done["done"] is True, objs
        reply = live.text_of(objs)
        if previous is None:
            assert done["cached_tokens"] == 0
        else:
            prompt_tokens, text = previous
            whole_turn = prompt_tokens + token_count(smollm2_dir, text)
            assert whole_turn - 1 <= done["cached_tokens"] < done["prompt_tokens"], (turn, done)
        previous = (done["prompt_tokens"], reply)
        messages.append({"role": "assistant", "content": reply})


def converse(sidecar: services.Service, questions: list[str], scope: str) -> list[tuple[str, int]]:
    """Each turn's greedy reply and its X-Cached-Tokens, the replies fed back as assistant
    turns."""
    messages: list[dict[str, str]] = []
    turns = []
    for question in questions:
        messages.append({"role": "user", "content": question})
        body = {"messages": messages, "max_new_tokens": MAX_NEW, "cache_scope": scope}
        response = httpx.post(sidecar.url + "/predict", json=body, timeout=120)
        assert response.status_code == 200, response.text
        turns.append((response.text, int(response.headers["x-cached-tokens"])))
        messages.append({"role": "assistant", "content": response.text})
    return turns


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_greedy_replies_are_the_same_with_the_cache_on_and_off(
    smollm2_sidecar: services.Service, uncached_sidecar: services.Service, name: str
) -> None:
    cached = converse(smollm2_sidecar, CONVERSATIONS[name], scope=f"same-{name}")
    uncached = converse(uncached_sidecar, CONVERSATIONS[name], scope=f"same-{name}")
    assert [text for text, _ in cached] == [text for text, _ in uncached]
    assert all(hits > 0 for _, hits in cached[1:]), cached  # the cache was really used
    assert all(hits == 0 for _, hits in uncached)
