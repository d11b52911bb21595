"""The conversation cache through the real sidecar: greedy replies are the same with the cache
on and off, and the cache is really used (X-Cached-Tokens, /metrics), never across scopes.

Each scenario runs one script against two sidecars on the same model, one with the cache and one
without (PROMPT_CACHE_MB=0), and compares every reply. On `tiny` the default mode runs (the
next turn continues after every cached token); on `small`, where a reply's tokens computed one at
a time differ from a fresh prefill's in the last bits and greedy decoding flips at near ties,
PROMPT_CACHE_EXACT=true runs, which reuses only what a fresh prefill computes bit for bit. The
prompt is read in chunks of 16 (PREFILL_CHUNK), so the chunk-aligned reuse of regenerated and
edited turns shows on short test prompts.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.run import services
from scripts.run.services import Service
from tests.sidecar import reference
from tests.sidecar.support import request_line
from tests.support.engines import EXIT, faulty, paced
from tests.support.kernels import rows_exact_in_batches

CHUNK = "16"
# Contracts of the Generator path (one onnxruntime-genai Generator per entry: an entry costs
# its generator's whole length, outgrows it, and a spare is made while loading); the batched
# path, the default on a CPU, keeps KV slots instead
# (tests/sidecar/model/batch/test_sidecar_batch.py).
# The Generator path still serves the GPU, decoders the batched path does not know, and drafts.
GENERATOR_ROWS = "1"  # DECODE_BATCH_ROWS of a sidecar on the Generator path
USER_TURNS = [
    "Tell me about the weather in Paris today, and what I should wear outside.",
    "And what about tomorrow morning, when I go running along the river?",
    "Thanks. Could you also suggest a good place for lunch near the station?",
    "One more thing: is the museum open on Mondays, and how long does a visit take?",
]


@dataclass
class Reply:
    text: str
    cached: int
    prompt_tokens: int


def ask(
    service: Service,
    messages: list[dict[str, str]],
    *,
    max_new: int = 24,
    scope: str | None = None,
) -> Reply:
    body: dict[str, Any] = {"messages": messages, "max_new_tokens": max_new}
    if scope is not None:
        body["cache_scope"] = scope
    response = httpx.post(service.url + "/predict", json=body, timeout=120)
    assert response.status_code == 200, response.text
    headers = response.headers
    return Reply(response.text, int(headers["x-cached-tokens"]), int(headers["x-prompt-tokens"]))


def converse(
    service: Service, turns: list[str], *, max_new: int = 24, scope: str | None = None
) -> list[Reply]:
    """A chat as a page has it: each turn resends the history with the server's own replies."""
    history: list[dict[str, str]] = []
    replies = []
    for user in turns:
        history.append({"role": "user", "content": user})
        reply = ask(service, history, max_new=max_new, scope=scope)
        history.append({"role": "assistant", "content": reply.text})
        replies.append(reply)
    return replies


def history_of(turns: list[str], replies: list[Reply]) -> list[dict[str, str]]:
    history = []
    for user, reply in zip(turns, replies, strict=True):
        history += [{"role": "user", "content": user}, {"role": "assistant", "content": reply.text}]
    return history


def same_replies(
    pair: tuple[Service, Service],
    on: list[list[dict[str, str]]],
    off: list[list[dict[str, str]]],
    max_new: int = 24,
) -> None:
    """The cached side's conversations (`on`, each a history with the server's replies) are
    the uncached side's: to the bit where this CPU's kernels are exact in batches; elsewhere
    (tests/support/kernels.py) the two may part at a near tie, so each reply is checked
    against the reference given its own history (reference.assert_agrees)."""
    if rows_exact_in_batches():
        assert on == off
        return
    model = MODELS[pair[0].url]
    for history in (*on, *off):
        for i, message in enumerate(history):
            if message["role"] == "assistant":
                reference.assert_agrees(message["content"], model, history[:i], max_new)


MODELS: dict[str, Path] = {}  # each pair's model, by its services' URLs


def metric(service: Service, name: str) -> float:
    text = httpx.get(service.url + "/metrics", timeout=10).text
    match = re.search(rf"^sidecar_{name} (\S+)$", text, re.M)
    assert match, name
    return float(match.group(1))


def sidecar(
    model: Path,
    tmp: pytest.TempPathFactory,
    env: dict[str, str] | None = None,
    **settings: str,
) -> Any:
    log = tmp.mktemp("logs") / "sidecar.log"
    return services.sidecar(model, log, env={"PREFILL_CHUNK": CHUNK, **(env or {}), **settings})


@pytest.fixture(scope="module")
def tiny_pair(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Service, Service]]:
    with (
        sidecar(tiny_model_dir, tmp_path_factory) as on,
        sidecar(tiny_model_dir, tmp_path_factory, PROMPT_CACHE_MB="0") as off,
    ):
        MODELS[on.url] = MODELS[off.url] = tiny_model_dir
        yield on, off


@pytest.fixture(scope="module")
def small_pair(
    small_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Service, Service]]:
    with (
        sidecar(small_model_dir, tmp_path_factory, PROMPT_CACHE_EXACT="true") as on,
        sidecar(small_model_dir, tmp_path_factory, PROMPT_CACHE_MB="0") as off,
    ):
        MODELS[on.url] = MODELS[off.url] = small_model_dir
        yield on, off


@pytest.fixture(params=["tiny", "small"])
def pair(request: pytest.FixtureRequest) -> tuple[Service, Service]:
    pair: tuple[Service, Service] = request.getfixturevalue(f"{request.param}_pair")
    return pair


def test_a_continued_conversation_reads_only_what_is_new(pair: tuple[Service, Service]) -> None:
    on, off = pair
    cached = converse(on, USER_TURNS, scope="continue")
    fresh = converse(off, USER_TURNS, scope="continue")
    same_replies(pair, [history_of(USER_TURNS, cached)], [history_of(USER_TURNS, fresh)])
    if rows_exact_in_batches():  # else the histories may differ from where the replies part
        assert [r.prompt_tokens for r in cached] == [r.prompt_tokens for r in fresh]
    assert cached[0].cached == 0 and all(r.cached == 0 for r in fresh)
    for before, now in itertools.pairwise(cached):
        assert 0 < now.cached < now.prompt_tokens
        assert now.cached >= before.prompt_tokens // 2  # at least the earlier prompt's bulk


def test_a_reply_cut_by_its_length_limit_is_continued_correctly(
    pair: tuple[Service, Service],
) -> None:
    """The last token of a length-stopped reply is in the sequence but not in the KV cache."""
    on, off = pair
    for service in pair:
        finish = httpx.post(
            service.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": USER_TURNS[0]}], "max_tokens": 5},
            timeout=60,
        ).json()["choices"][0]["finish_reason"]
        assert finish == "length"
    cached = converse(on, USER_TURNS[:3], max_new=5, scope="cut")
    fresh = converse(off, USER_TURNS[:3], max_new=5)
    turns = USER_TURNS[:3]
    same_replies(pair, [history_of(turns, cached)], [history_of(turns, fresh)], 5)
    assert all(r.cached > 0 for r in cached[1:])


def test_a_regenerated_reply_is_the_same_reply(pair: tuple[Service, Service]) -> None:
    on, off = pair
    history = [{"role": "user", "content": USER_TURNS[0]}]
    first = ask(on, history, scope="regenerate")
    again = ask(on, history, scope="regenerate")
    fresh = ask(off, history)
    same_replies(pair, [history_of(USER_TURNS[:1], [first]), history_of(USER_TURNS[:1], [again])],
                 [history_of(USER_TURNS[:1], [fresh])] * 2)  # fmt: skip
    assert again.cached > 0 and again.cached % int(CHUNK) == 0  # whole prefill chunks


def test_an_edited_earlier_message_reuses_what_comes_before_it(
    pair: tuple[Service, Service],
) -> None:
    on, off = pair
    converse(on, USER_TURNS[:3], scope="edit")
    edited = [USER_TURNS[0], USER_TURNS[1].replace("running", "cycling"), USER_TURNS[2]]
    cached = converse(on, edited, scope="edit")
    same_replies(pair, [history_of(edited, cached)], [history_of(edited, converse(off, edited))])
    assert cached[0].cached > 0  # the unchanged first turn
    assert cached[1].cached < cached[1].prompt_tokens  # the edit is read again


def test_two_interleaved_conversations_keep_their_own_caches(
    pair: tuple[Service, Service],
) -> None:
    on, off = pair
    a_turns, b_turns = USER_TURNS[:3], [t.upper() for t in USER_TURNS[:3]]
    histories: dict[str, dict[str, list[dict[str, str]]]] = {"on": {}, "off": {}}
    replies: dict[str, list[Reply]] = {"on": [], "off": []}
    for turn in range(3):
        for name, turns in (("a", a_turns), ("b", b_turns)):
            for side, service in (("on", on), ("off", off)):
                history = histories[side].setdefault(name, [])
                history.append({"role": "user", "content": turns[turn]})
                reply = ask(service, history)  # unscoped: both share the pool
                history.append({"role": "assistant", "content": reply.text})
                replies[side].append(reply)
    same_replies(pair, list(histories["on"].values()), list(histories["off"].values()))
    # Each conversation's turns 2 and 3 continue its own previous prompt (at least its whole
    # prefill chunks; the other conversation shares only the template's first tokens).
    on_replies = replies["on"]
    for earlier, later in zip(on_replies, on_replies[2:], strict=False):
        assert later.cached >= earlier.prompt_tokens // int(CHUNK) * int(CHUNK) > 0


def test_two_scopes_never_share_a_prefix(tiny_pair: tuple[Service, Service]) -> None:
    on, _ = tiny_pair
    history = [{"role": "user", "content": USER_TURNS[3]}]
    ask(on, history, scope="alice")
    assert ask(on, history, scope="bob").cached == 0
    assert ask(on, history).cached == 0  # nor does the unscoped pool
    assert ask(on, history, scope="alice").cached > 0


def test_the_unscoped_pool_can_be_turned_off(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # PROMPT_CACHE_UNSCOPED=false: no shared pool to learn others' prompts from (issue 25);
    # scoped conversations keep their cache.
    history = [{"role": "user", "content": USER_TURNS[2]}]
    with sidecar(tiny_model_dir, tmp_path_factory, PROMPT_CACHE_UNSCOPED="false") as service:
        ask(service, history)
        assert ask(service, history).cached == 0
        ask(service, history, scope="alice")
        assert ask(service, history, scope="alice").cached > 0


def test_openai_clients_scope_with_prompt_cache_key_and_see_cached_tokens(
    tiny_pair: tuple[Service, Service],
) -> None:
    on, _ = tiny_pair
    messages = [{"role": "user", "content": USER_TURNS[2]}]

    def usage(**extra: Any) -> dict[str, Any]:
        body = {"messages": messages, "max_tokens": 8, **extra}
        return dict(
            httpx.post(on.url + "/v1/chat/completions", json=body, timeout=60).json()["usage"]
        )

    assert usage(prompt_cache_key="k1")["prompt_tokens_details"]["cached_tokens"] == 0
    assert usage(prompt_cache_key="k2")["prompt_tokens_details"]["cached_tokens"] == 0
    assert usage(user="k1")["prompt_tokens_details"]["cached_tokens"] == 0  # a user is not a key
    hit = usage(prompt_cache_key="k1")
    assert 0 < hit["prompt_tokens_details"]["cached_tokens"] < hit["prompt_tokens"]
    # The streamed usage chunk says the same.
    body = {"messages": messages, "max_tokens": 8, "stream": True, "prompt_cache_key": "k1"}
    body["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", on.url + "/v1/chat/completions", json=body, timeout=60) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: {")]
    last = httpx.Response(200, content=events[-1].removeprefix("data: ")).json()
    assert last["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_eviction_under_a_tiny_budget(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """1 MiB holds one generator of the tiny model (1 KiB of K/V a token): a second
    conversation evicts the first (reusing its generator, rewound to nothing), whose next turn
    is read whole in the generator reused again, and replies do not change."""
    a, b = USER_TURNS[:2], [t.upper() for t in USER_TURNS[:2]]
    with (
        sidecar(
            tiny_model_dir, tmp_path_factory, PROMPT_CACHE_MB="1", DECODE_BATCH_ROWS=GENERATOR_ROWS
        ) as on,
        sidecar(tiny_model_dir, tmp_path_factory, PROMPT_CACHE_MB="0") as off,
    ):
        first = converse(on, a[:1], scope="a")[0]
        converse(on, b[:1], scope="b")
        assert metric(on, "prompt_cache_evictions_total") >= 1
        assert metric(on, "prompt_cache_entries") == 1
        assert 0 < metric(on, "prompt_cache_bytes") <= 2**20
        history = [{"role": "user", "content": a[0]}, {"role": "assistant", "content": first.text}]
        history += [{"role": "user", "content": a[1]}]
        second = ask(on, history, scope="a")
        assert second.cached == 0  # its turn 1 was evicted: read again
        assert [first.text, second.text] == [r.text for r in converse(off, a)]


def test_a_conversation_that_outgrows_its_generator_moves_to_a_bigger_one(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with (
        sidecar(tiny_model_dir, tmp_path_factory, DECODE_BATCH_ROWS=GENERATOR_ROWS) as on,
        sidecar(tiny_model_dir, tmp_path_factory, PROMPT_CACHE_MB="0") as off,
    ):
        # another conversation takes the spare generator (made for a whole default reply)
        ask(on, [{"role": "user", "content": USER_TURNS[3]}], max_new=4, scope="spare")
        outgrow(on, off)


def outgrow(on: Service, off: Service) -> None:
    history = [{"role": "user", "content": USER_TURNS[0]}]
    entries = metric(on, "prompt_cache_entries")
    first = ask(on, history, max_new=8, scope="grow")
    history += [{"role": "assistant", "content": first.text}]
    history += [{"role": "user", "content": USER_TURNS[1]}]
    # 2000 new tokens do not fit in the first generator (room: the request + 1024): a bigger
    # one reads the whole prompt, and the smaller one, now a prefix of it, is dropped.
    big = ask(on, history, max_new=2000, scope="grow")
    assert big.cached == 0 and big.text == ask(off, history, max_new=2000).text
    assert metric(on, "prompt_cache_entries") == entries + 1
    history += [{"role": "assistant", "content": big.text}]
    history += [{"role": "user", "content": USER_TURNS[2]}]
    assert ask(on, history, max_new=8, scope="grow").cached > big.prompt_tokens // 2


def test_max_concurrency_two_conversations_at_once(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Two conversations at once, token by token in turn: each continues its own generator
    (one in use is never lent to another request) and gets the uncached replies."""
    scripts = {"x": USER_TURNS, "y": [t.upper() for t in USER_TURNS]}
    results: dict[str, list[Reply]] = {}
    with (
        sidecar(tiny_model_dir, tmp_path_factory, MAX_CONCURRENCY="2") as on,
        sidecar(tiny_model_dir, tmp_path_factory, PROMPT_CACHE_MB="0") as off,
    ):
        expected = {name: converse(off, turns) for name, turns in scripts.items()}

        def run(name: str) -> None:
            results[name] = converse(on, scripts[name], scope=name)

        threads = [threading.Thread(target=run, args=(n,)) for n in scripts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        for name in scripts:
            assert [r.text for r in results[name]] == [r.text for r in expected[name]]
            assert all(r.cached > 0 for r in results[name][1:])
        assert metric(on, "prompt_cache_hits_total") == 6
        assert metric(on, "prompt_cache_entries") == 2


def test_a_stopped_reply_stays_cached(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The client leaves mid-reply; the next turn resends the part it saw and continues from
    the cache, with the reply an uncached sidecar gives to the same conversation."""
    with (
        sidecar(tiny_model_dir, tmp_path_factory, env=paced(0.02)) as on,
        sidecar(tiny_model_dir, tmp_path_factory, PROMPT_CACHE_MB="0") as off,
    ):
        history = [{"role": "user", "content": USER_TURNS[0]}]
        body = {"messages": history, "max_new_tokens": 400, "min_new_tokens": 400}
        seen = b""
        with httpx.stream("POST", on.url + "/predict", json=body, timeout=60) as response:
            for chunk in response.iter_raw():
                seen += chunk
                if len(seen) > 20:
                    break  # leaving the block closes the connection
        history += [{"role": "assistant", "content": seen.decode("utf-8", "ignore")}]
        history += [{"role": "user", "content": USER_TURNS[1]}]
        after = ask(on, history)
        assert after.cached > 0
        assert after.text == ask(off, history).text


def test_the_log_line_and_counters_report_the_cache(tiny_pair: tuple[Service, Service]) -> None:
    on, _ = tiny_pair
    hits, misses = metric(on, "prompt_cache_hits_total"), metric(on, "prompt_cache_misses_total")
    tokens = metric(on, "cached_prompt_tokens_total")
    replies = converse(on, USER_TURNS[:2], scope="counted")
    assert metric(on, "prompt_cache_hits_total") == hits + 1
    assert metric(on, "prompt_cache_misses_total") == misses + 1
    assert metric(on, "cached_prompt_tokens_total") == tokens + replies[1].cached
    lines = [line for line in on.log_lines() if '"msg": "request"' in line]
    assert f'"cached_tokens": {replies[1].cached}' in lines[-1]
    assert '"cached_tokens": 0' in lines[-2]


def test_a_worker_restart_empties_the_cache(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with sidecar(tiny_model_dir, tmp_path_factory, env=faulty()) as on:
        history = [{"role": "user", "content": USER_TURNS[0]}]
        first = ask(on, history, scope="restart")
        assert metric(on, "prompt_cache_entries") == 1
        crash = [{"role": "user", "content": f"{EXIT} now"}]
        with pytest.raises(httpx.RemoteProtocolError):  # the reply breaks off: the worker died
            httpx.post(on.url + "/predict", json={"messages": crash}, timeout=60)
        deadline = time.monotonic() + 60
        while httpx.get(on.url + "/readyz", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the worker did not come back"
            time.sleep(0.2)
        assert metric(on, "prompt_cache_entries") == 0
        assert metric(on, "prompt_cache_bytes") == 0
        history += [{"role": "assistant", "content": first.text}]
        history += [{"role": "user", "content": USER_TURNS[1]}]
        assert ask(on, history, scope="restart").cached == 0


def test_the_first_cached_reply_continues_the_generator_made_while_loading(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Loading makes one idle generator (the spare, sized for the default reply), so the first
    request does not allocate and zero-fill a KV cache of its own: after it the cache holds that
    one generator (its size, not the smaller one a 24-token reply would get), nothing was
    evicted, and its reply is the uncached one."""
    messages = [{"role": "user", "content": USER_TURNS[0]}]
    with (
        sidecar(tiny_model_dir, tmp_path_factory, DECODE_BATCH_ROWS=GENERATOR_ROWS) as on,
        sidecar(tiny_model_dir, tmp_path_factory, PROMPT_CACHE_MB="0") as off,
    ):
        made = [json.loads(line) for line in on.log_lines() if '"spare generator"' in line]
        assert len(made) == 1 and made[0]["capacity"] >= 1024 + 256
        first = ask(on, messages, scope="first")
        assert first.cached == 0
        assert metric(on, "prompt_cache_entries") == 1
        assert metric(on, "prompt_cache_bytes") == made[0]["bytes"]
        assert metric(on, "prompt_cache_evictions_total") == 0
        assert first.text == ask(off, messages).text
        second = ask(on, messages, scope="other")  # another scope: a generator of its own
        assert second.text == first.text and metric(on, "prompt_cache_entries") == 2


def test_the_log_line_says_why_a_turn_was_reused_or_not(
    tiny_pair: tuple[Service, Service],
) -> None:
    """cache_reason in the request's log line (kv.prompt_cache.REASONS): a new conversation is a
    miss (or takes the spare), its next turn reuses it, cache_prompt false declines, and a
    seeded sampling request starts fresh."""
    on, _ = tiny_pair
    scope = f"reason-{uuid.uuid4().hex}"
    history = [{"role": "user", "content": USER_TURNS[2]}]

    def reason(body: dict[str, Any], path: str = "/predict") -> str:
        request_id = uuid.uuid4().hex
        headers = {"x-request-id": request_id}
        response = httpx.post(on.url + path, json=body, headers=headers, timeout=120)
        assert response.status_code == 200, response.text
        return str(request_line(on, request_id)["cache_reason"])

    body = {"messages": history, "max_new_tokens": 8, "cache_scope": scope}
    assert reason(body) in {"miss", "spare", "recycled"}
    assert reason(body) == "reused"
    v1 = {"messages": history, "max_tokens": 8, "prompt_cache_key": scope, "cache_prompt": False}
    assert reason(v1, "/v1/chat/completions") == "declined"  # llama.cpp's field
    assert reason({**body, "temperature": 1.0, "seed": 3}) == "seeded"
