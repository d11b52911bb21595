"""The conversation cache is each API key's own (ipc.owned_scope, applied in
web/generation/pipeline.py): with two keys, key B naming key A's scope (`prompt_cache_key`, `user`,
/predict's `cache_scope`, or none: the unscoped pool) reuses nothing of A's, on every generation
route, so `cached_tokens` tells B nothing of what A sent; A still reuses its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.run import services
from scripts.run.services import Service
from sidecar import ipc
from tests.sidecar.model.kv.test_sidecar_kv_tiers import Chat, make_engine, to_disk
from tests.sidecar.support import words

KEYS = ("key-a", "key-b")


@pytest.fixture(scope="module")
def two_keys(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-two-keys.log"
    with services.sidecar(tiny_model_dir, log, API_KEY=",".join(KEYS)) as service:
        yield service


def post(service: Service, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    response = httpx.post(service.url + path, json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response


def chat(scope: dict[str, str]) -> Callable[[Service, str, str], int]:
    def send(service: Service, key: str, text: str) -> int:
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": 2, **scope}
        usage = post(service, key, "/v1/chat/completions", body).json()["usage"]
        return int(usage["prompt_tokens_details"]["cached_tokens"])

    return send


def completion(service: Service, key: str, text: str) -> int:
    body = {"prompt": text, "max_tokens": 2, "prompt_cache_key": "shared"}
    usage = post(service, key, "/v1/completions", body).json()["usage"]
    return int(usage["prompt_tokens_details"]["cached_tokens"])


def response(service: Service, key: str, text: str) -> int:
    body = {"input": text, "max_output_tokens": 2, "store": False, "prompt_cache_key": "shared"}
    usage = post(service, key, "/v1/responses", body).json()["usage"]
    return int(usage["input_tokens_details"]["cached_tokens"])


def predict(service: Service, key: str, text: str) -> int:
    body = {"messages": [{"role": "user", "content": text}], "max_new_tokens": 2}
    body["cache_scope"] = "shared"
    return int(post(service, key, "/predict", body).headers["x-cached-tokens"])


ROUTES = {
    "prompt_cache_key": chat({"prompt_cache_key": "shared"}),
    "user": chat({"user": "shared"}),
    "unscoped": chat({}),
    "completions": completion,
    "responses": response,
    "predict": predict,
}


@pytest.mark.parametrize("route", ROUTES)
def test_another_key_naming_the_same_scope_reuses_nothing(two_keys: Service, route: str) -> None:
    send = ROUTES[route]
    guesses = [f"{route} {seed} " + words(80, seed) for seed in range(4)]
    secret = guesses[2]
    assert send(two_keys, "key-a", secret) == 0
    # key B tries every guess in A's scope: none is told apart from the others
    assert [send(two_keys, "key-b", guess) for guess in guesses] == [0, 0, 0, 0]
    assert send(two_keys, "key-a", secret) > 0  # A's own entry is still there, and A reuses it


def test_owned_scopes_cannot_be_forged_into_a_pool() -> None:
    assert ipc.owned_scope("", "key:x") == "key:x"  # no API key: as the routes name it
    assert ipc.owned_scope("", None) is None
    pool = ipc.owned_scope("abc", None)
    assert pool == "owner:abc" and ipc.in_unscoped_pool(pool)
    for named in ("", "pool", "key:x", "owner:abc", "scope:owner:abc"):
        scope = ipc.owned_scope("abc", named)
        assert scope is not None and scope != pool and not ipc.in_unscoped_pool(scope)
        assert scope != ipc.owned_scope("abd", named)


def test_owners_stay_apart_on_disk_after_a_restart(tiny_model_dir: Path, tmp_path: Path) -> None:
    """In the worker, on the real engine: a conversation pushed to the disk tier, then a new
    engine on the same directory (a restart): another owner's same scope and words read
    everything again; its own owner's are restored from disk."""
    directory = tmp_path / "kv"
    owner_a, owner_b = "a" * 32, "b" * 32
    first = make_engine(tiny_model_dir, prompt_cache_dir=directory)
    chat = Chat(first, str(ipc.owned_scope(owner_a, "key:shared")), 0)
    chat.turn(0)
    to_disk(first)
    again = make_engine(tiny_model_dir, prompt_cache_dir=directory)
    other = Chat(again, str(ipc.owned_scope(owner_b, "key:shared")), 0)
    other.messages = list(chat.messages)  # the very conversation, its next turn
    guessed = other.turn(1)
    assert guessed.cached_tokens == 0 and guessed.restored.tier is None
    chat.engine = again
    own = chat.turn(1)
    assert own.restored.tier == "disk" and own.cached_tokens > 0


def test_an_owners_pool_follows_the_unscoped_rules(tiny_model_dir: Path) -> None:
    """PROMPT_CACHE_UNSCOPED=false turns every key's own pool off too."""
    engine = make_engine(tiny_model_dir, prompt_cache_unscoped=False)
    for _ in range(2):
        generation = Chat(engine, str(ipc.owned_scope("a" * 32, None)), 0).turn(0)
        assert generation.cached_tokens == 0
        assert generation.cache_reason == "unscoped_off"
