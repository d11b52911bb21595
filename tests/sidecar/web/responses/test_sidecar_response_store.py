"""The stored responses' bound (web/responses/store.py): counted as the memory they really take
(measured here with tracemalloc), and fair between API keys: one key's flood evicts only its
own entries, never another key's held within its share; /metrics shows the store."""

from __future__ import annotations

import gc
import secrets
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.run import services
from scripts.run.services import Service
from sidecar.web.responses.store import Kept, ResponseStore, Stored, new_id
from tests.sidecar.support import metrics


def response(owner: str, text: str, scope: str | None = None) -> Stored:
    """A stored response shaped as responses/api.py's Draft keeps one (its fields, its output, the
    conversation with the reply), `text` as the user's words and the reply."""
    rid = new_id()
    item = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    message = {"type": "message", "id": "msg_" + secrets.token_hex(12), "role": "assistant"}
    body: dict[str, Any] = {
        "id": rid,
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "model": "phi3-mini",
        "output": [{**message, "status": "completed", "content": [item]}],
        "usage": {"input_tokens": 120, "output_tokens": 40, "total_tokens": 160},
        "metadata": {"topic": text[:20]},
        "text": {"format": {"type": "text"}},
        "tools": [],
        "store": True,
        "temperature": None,
        "prompt_cache_key": scope,
    }
    conversation = [
        {"role": "user", "content": text},
        {"role": "assistant", "content": text},
    ]
    return Stored(rid, owner, scope, body, conversation)


@pytest.mark.parametrize("words", [5, 200, 3000])
def test_the_count_is_the_memory_really_taken(words: int) -> None:
    """500 responses of each size: the store's count within 10% of what tracemalloc sees it
    allocate (kept as dicts and counted by JSON length, it took 6.4-7.8x its count)."""
    store = ResponseStore(budget_bytes=2**31)
    owner = "f" * 64
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(500):
            assert store.put(response(owner, f"word{n} " * words, scope="key:k"))
        gc.collect()
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = store.stats[1]
    assert 0.9 < counted / taken < 1.1, (counted, taken)


def test_what_is_kept_is_what_was_stored() -> None:
    store = ResponseStore(budget_bytes=2**20)
    original = response("a", "héllo ☃ \u2028 \x00", scope="user:u")
    assert store.put(original)
    back = store.continuing(original.id, "a", "user:u")
    assert back is not None
    assert back.response == original.response and back.conversation == original.conversation


def test_one_keys_flood_never_evicts_another_keys_share() -> None:
    one = Kept.of(response("x", "w " * 100)).nbytes
    store = ResponseStore(budget_bytes=one * 20, keys=2)  # a share: about 10 entries
    b_entries = [response("b", "w " * 100) for _ in range(6)]
    for stored in b_entries:
        assert store.put(stored)
    flood = [response("a", "w " * 100) for _ in range(500)]
    for stored in flood:
        assert store.put(stored)
    for stored in b_entries:  # within B's share: every one still there
        assert store.get(stored.id, "b") is not None
    assert store.get(flood[-1].id, "a") is not None  # A keeps its most recent
    assert store.get(flood[0].id, "a") is None  # and lost its oldest, to itself
    assert store.stats[1] <= store.budget_bytes
    assert store.owner_bytes("a") <= store.budget_bytes - store.owner_bytes("b")
    assert store.evictions >= 500 - 20


def test_free_room_is_used_and_taken_back_from_whoever_is_over_its_share() -> None:
    one = Kept.of(response("x", "w " * 100)).nbytes
    store = ResponseStore(budget_bytes=one * 20, keys=2)
    early = [response("a", "w " * 100) for _ in range(19)]
    for stored in early:
        assert store.put(stored)  # B stores nothing yet: A may use the room
    later = [response("b", "w " * 100) for _ in range(9)]
    for stored in later:
        assert store.put(stored)  # each evicts one of A's, A being over its share
    assert all(store.get(s.id, "b") is not None for s in later)
    assert sum(store.get(s.id, "a") is not None for s in early) >= 10
    # an entry larger than its key's share is kept only while it fits beside the others
    big = response("b", "w " * 5000)
    assert Kept.of(big).nbytes > store.share_bytes
    assert not store.put(big) and store.refused == 1
    assert all(store.get(s.id, "b") is not None for s in later)


KEYS = ("key-a", "key-b")


@pytest.fixture(scope="module")
def small_store(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-store.log"
    with services.sidecar(
        tiny_model_dir, log, API_KEY=",".join(KEYS), RESPONSE_STORE_MB="1"
    ) as service:
        yield service


def create(service: Service, key: str, **fields: Any) -> httpx.Response:
    body = {"input": "hello", "max_output_tokens": 1, **fields}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(service.url + "/v1/responses", json=body, headers=headers, timeout=60)


@pytest.mark.slow  # 160 requests
def test_over_http_a_flood_from_one_key_leaves_the_others_responses(small_store: Service) -> None:
    """Key B stores two responses; key A stores 1 MiB and more of them (16 x 512 characters of
    metadata each: OpenAI's limits); B's are still there, and /metrics counts the store."""
    kept = [create(small_store, "key-b").json()["id"] for _ in range(2)]
    metadata = {f"k{i}": "m" * 512 for i in range(16)}
    for _ in range(160):
        assert create(small_store, "key-a", metadata=metadata).status_code == 200
    for rid in kept:
        found = httpx.get(
            f"{small_store.url}/v1/responses/{rid}",
            headers={"Authorization": "Bearer key-b"},
            timeout=10,
        )
        assert found.status_code == 200
    counts = metrics(small_store.url)
    assert counts["sidecar_response_store_evictions_total"] > 0
    assert 0 < counts["sidecar_response_store_bytes"] <= 2**20
    assert counts["sidecar_response_store_entries"] >= 2


def test_random_puts_keep_every_share_and_the_budget() -> None:
    """Three keys storing at random sizes: the bytes never pass the budget, and a key's entry
    is only ever evicted while that key holds more than its share."""
    import random

    rng = random.Random(7)
    unit = Kept.of(response("x", "w")).nbytes
    store = ResponseStore(budget_bytes=unit * 60, keys=3)
    for _ in range(3000):
        owner = rng.choice("abc")
        before = {o: store.owner_bytes(o) for o in "abc"}
        evictions = store.evictions
        store.put(response(owner, "w " * rng.randrange(1, 400)))
        assert store.stats[1] <= store.budget_bytes
        if store.evictions > evictions:
            for other in set("abc") - {owner}:
                if store.owner_bytes(other) < before[other]:
                    assert before[other] > store.share_bytes
