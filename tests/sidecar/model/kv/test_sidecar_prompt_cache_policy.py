"""model/kv/prompt_cache.py's books, without a model: which entry is lent and how much of it,
how much room a new generator gets, what is evicted, what a lease decides and why. The real
engine's side (rewinds, appends, the replies) is tested through the sidecar in
test_sidecar_prompt_cache.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from sidecar.ipc import Generate, Guidance
from sidecar.model.kv.prompt_cache import GROWTH_TOKENS, REASONS, Entry, PromptCache

KB = 1024


class Tokens:
    """Stands in for a generator: get_sequence(0) is all the cache reads of it."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = list(ids)

    def get_sequence(self, index: int) -> list[int]:
        return self.ids


def cache(budget_tokens: int = 100_000, *, exact: bool = False, chunk: int = 4) -> PromptCache:
    return PromptCache(budget_tokens * KB, KB, 4096, chunk, exact)


def kept(
    pool: PromptCache,
    prompt: list[int],
    reply: list[int],
    *,
    scope: str | None = None,
    capacity: int = 500,
    guidance: Guidance | None = None,
) -> Entry:
    """An idle entry as a finished request leaves it: the prompt prefilled, the reply after it,
    its last token not yet fed."""
    entry = Entry(Tokens(prompt + reply), None, capacity, scope, False, capacity * KB)
    entry.guidance = guidance
    pool.adopt(entry)
    entry.prefilled(0, len(prompt), pool.chunk)
    entry.kv_len = len(prompt) + max(0, len(reply) - 1)
    pool.give_back(entry, reusable=True)
    return entry


PROMPT = list(range(100, 122))  # 22 tokens
REPLY = list(range(500, 510))


def test_the_next_turn_continues_into_the_reply() -> None:
    pool = cache()
    entry = kept(pool, PROMPT, REPLY)
    next_turn = PROMPT + REPLY + [900, 901, 902]
    lent = pool.lend(None, False, next_turn, 50)
    assert lent == (entry, len(PROMPT) + len(REPLY) - 1)  # the unfed last token is re-read
    assert entry.lent and pool.lend(None, False, next_turn, 50) is None  # lent once at a time


def test_exact_mode_reuses_whole_prefilled_chunks_only() -> None:
    pool = cache(exact=True)
    entry = kept(pool, PROMPT, REPLY)
    assert pool.lend(None, False, PROMPT + REPLY + [900], 50) == (entry, 20)  # 22 -> 20


def test_a_next_turn_with_another_reply_reuses_the_whole_earlier_prompt() -> None:
    """The client resends a reply other than the one generated (edited, or re-tokenized
    otherwise from its first token): still the next turn, not an edit inside the prompt."""
    pool = cache()
    entry = kept(pool, PROMPT, REPLY)
    assert pool.lend(None, False, [*PROMPT, 777, 778], 50) == (entry, len(PROMPT))
    pool = cache(exact=True)
    entry = kept(pool, PROMPT, REPLY)
    assert pool.lend(None, False, [*PROMPT, 777, 778], 50) == (entry, 20)  # whole chunks


def test_a_regenerated_turn_reuses_whole_chunks_in_either_mode() -> None:
    for exact in (False, True):
        pool = cache(exact=exact)
        entry = kept(pool, PROMPT, REPLY)
        assert pool.lend(None, False, PROMPT, 50) == (entry, 20)


def test_scope_and_sampling_mode_must_match() -> None:
    pool = cache()
    kept(pool, PROMPT, REPLY, scope="alice")
    assert pool.lend("bob", False, [*PROMPT, 1], 50) is None
    assert pool.lend(None, False, [*PROMPT, 1], 50) is None
    assert pool.lend("alice", True, [*PROMPT, 1], 50) is None  # sampling: another generator
    assert pool.lend("alice", False, [*PROMPT, 1], 50) is not None


def test_another_conversations_short_shared_prefix_is_not_taken_from_the_unscoped_pool() -> None:
    pool = cache()
    kept(pool, PROMPT, REPLY)
    stranger = PROMPT[:8] + list(range(2000, 2030))  # shares the template's first tokens
    assert pool.lend(None, False, stranger, 50) is None
    # Within a scope (one conversation or client) the best match is always lent.
    pool = cache()
    kept(pool, PROMPT, REPLY, scope="s")
    assert pool.lend("s", False, stranger, 50) is not None


def test_an_entry_too_small_for_the_request_is_not_lent() -> None:
    pool = cache()
    kept(pool, PROMPT, REPLY, capacity=60)
    assert pool.lend(None, False, PROMPT + REPLY + [1], 61) is None


def test_room_to_grow_within_the_context_and_the_budget() -> None:
    assert cache().capacity_for(100) == 1280  # 100 + 1024, rounded up to 256
    assert cache().capacity_for(3000) == 4096  # + half, capped by the context
    assert cache(budget_tokens=700).capacity_for(100) == 700  # capped by the budget
    assert cache(budget_tokens=50).capacity_for(100) == 100  # cannot be cached: exactly
    assert PromptCache(0, KB, 4096).capacity_for(100) == 100  # cache off
    assert GROWTH_TOKENS == 1024


def test_least_recently_used_idle_entries_make_room() -> None:
    pool = cache(budget_tokens=1000)
    old = kept(pool, [1, 2, 3, 4, 5], [6], capacity=400)
    new = kept(pool, [7, 8, 9, 10, 11], [12], capacity=400)
    pool.make_room(400)
    assert pool.entries == [new] and pool.evictions == 1
    assert old not in pool.entries


def test_a_miss_that_must_evict_reuses_a_generator_it_would_evict() -> None:
    pool = cache(budget_tokens=1000)
    old = kept(pool, [1, 2, 3, 4, 5], [6], capacity=400, scope="a")
    new = kept(pool, [7, 8, 9, 10, 11], [12], capacity=400)
    recycled = pool.recycle("b", False, 400, 300)
    assert recycled is old and old.lent and old.cache_scope == "b"
    assert (old.kv_len, old.prompt_end, old.exact_end) == (0, 0, 0)  # its tokens are gone
    assert pool.entries == [old, new] and pool.evictions == 1  # its conversation counts as evicted
    assert pool.lend(None, False, [7, 8, 9, 10, 11, 12, 13], 50) is not None  # `new` is intact


def test_nothing_is_reused_when_the_new_generator_fits() -> None:
    pool = cache(budget_tokens=1000)
    kept(pool, [1, 2, 3, 4, 5], [6], capacity=400)
    assert pool.recycle(None, False, 600, 300) is None
    assert pool.evictions == 0


def test_only_a_generator_of_the_same_mode_with_room_among_those_evicted_is_reused() -> None:
    pool = cache(budget_tokens=1000)
    kept(pool, [1, 2, 3, 4, 5], [6], capacity=200)
    sampling = Entry(Tokens([7, 8, 9]), None, 400, None, True, 400 * KB)
    pool.adopt(sampling)
    pool.give_back(sampling, reusable=True)
    recent = kept(pool, [20, 21, 22, 23], [24], capacity=400)
    # 200 must go for 200 more to fit: only the small one, too small for 300 tokens.
    assert pool.recycle(None, False, 200, 300) is None
    # 600 more: the small one and `sampling` would go; neither fits a greedy 300-token request.
    assert pool.recycle(None, False, 600, 300) is None
    # All three would go for 1000: the first that qualifies, least recently used first.
    assert pool.recycle(None, False, 1000, 300) is recent
    assert pool.recycle(None, True, 1000, 300) is sampling
    assert pool.evictions == 2 and len(pool.entries) == 3


def test_a_lent_entry_is_never_evicted() -> None:
    pool = cache(budget_tokens=1000)
    entry = kept(pool, [1, 2, 3, 4, 5], [6], capacity=800)
    assert pool.lend(None, False, [1, 2, 3, 4, 5, 6, 7], 10) is not None
    pool.make_room(800)
    assert pool.entries == [entry]


def test_a_returned_entry_the_budget_cannot_hold_is_dropped() -> None:
    pool = cache(budget_tokens=1000)
    entry = Entry(Tokens([1, 2, 3]), None, 1200, None, False, 1200 * KB)
    pool.adopt(entry)
    pool.give_back(entry, reusable=True)
    assert pool.entries == [] and pool.stats().bytes == 0


def test_a_failed_generation_is_dropped_uncounted() -> None:
    pool = cache()
    entry = kept(pool, PROMPT, REPLY)
    assert pool.lend(None, False, [*PROMPT, 1], 50) is not None
    pool.give_back(entry, reusable=False)
    assert pool.entries == [] and pool.evictions == 0


@pytest.mark.parametrize("retokenized", [False, True])
def test_an_earlier_state_of_the_same_conversation_is_dropped(retokenized: bool) -> None:
    """A bigger generator took over the conversation (it outgrew the first): the first, whose
    whole prompt starts the new one, can no longer be the better match and goes."""
    pool = cache()
    first = kept(pool, PROMPT, REPLY, capacity=100)
    reply = [7777, *REPLY[1:]] if retokenized else REPLY
    bigger = kept(pool, PROMPT + reply + [900, 901], [42, 43], capacity=3000)
    assert pool.entries == [bigger] and first not in pool.entries
    other = kept(pool, [1, 2, 3, 4, 5, 6], [7])  # another conversation stays
    assert set(pool.entries) == {bigger, other}


def spare(pool: PromptCache, capacity: int, *, sampling: bool = False) -> Entry:
    """An idle generator that holds nothing, as the engine makes one while loading."""
    entry = Entry(Tokens([]), None, capacity, None, sampling, capacity * KB, spare=True)
    pool.adopt(entry)
    pool.give_back(entry, reusable=True)
    return entry


def test_the_spare_is_lent_to_the_first_miss_that_fits_it() -> None:
    pool = cache(budget_tokens=10_000)
    made = spare(pool, 2304)
    assert pool.lend("a", False, [1, 2, 3], 300) is None  # holds nothing to continue from
    assert pool.recycle("a", True, 2304, 300) is None  # another sampling mode
    assert pool.recycle("a", False, 3000, 2500) is None  # too small for that request
    assert pool.recycle("a", False, 2304, 300) is made
    assert made.lent and made.cache_scope == "a" and pool.evictions == 0 and pool.entries == [made]
    assert not made.spare  # lent once: an entry like any other from now on


GRAMMAR = Guidance("json_schema", '{"type": "object"}')


def test_entries_are_lent_only_to_the_same_guidance() -> None:
    """A generator keeps its grammar for life: guided and free-text requests, and requests of
    different grammars, never share one (lend, recycle, and the spare alike)."""
    pool = cache()
    plain = kept(pool, PROMPT, REPLY)
    guided = kept(pool, PROMPT, REPLY, guidance=GRAMMAR)
    next_turn = PROMPT + REPLY + [900]
    other = Guidance("json_schema", '{"type": "array"}')
    assert pool.lend(None, False, next_turn, 50, other) is None
    assert pool.lend(None, False, next_turn, 50, replace(GRAMMAR, ff_tokens=False)) is None
    lent = pool.lend(None, False, next_turn, 50, GRAMMAR)
    assert lent is not None and lent[0] is guided
    lent = pool.lend(None, False, next_turn, 50)
    assert lent is not None and lent[0] is plain


def test_a_guided_miss_recycles_only_a_generator_of_its_grammar() -> None:
    pool = cache(budget_tokens=1000)
    old = kept(pool, PROMPT, REPLY, capacity=800)
    assert pool.recycle("a", False, 800, 300, GRAMMAR) is None  # the unguided one is not taken
    old.guidance = GRAMMAR
    assert pool.recycle("a", False, 800, 300, GRAMMAR) is old


def test_the_spare_is_never_lent_to_a_guided_request() -> None:
    pool = cache(budget_tokens=10_000)
    made = spare(pool, 2304)
    assert pool.recycle("a", False, 2304, 300, GRAMMAR) is None  # it has no grammar
    assert made.spare and not made.lent


def test_a_returned_entry_drops_only_earlier_states_of_its_own_guidance() -> None:
    pool = cache()
    earlier = kept(pool, PROMPT, REPLY, guidance=GRAMMAR)
    kept(pool, PROMPT + REPLY + [900, 901], [42])  # unguided: the guided one stays
    assert earlier in pool.entries


def ask(prompt: list[int], scope: str | None = None, **fields: Any) -> tuple[Generate, list[int]]:
    """A request for `prompt` (the lease reads its scope, mode, seed and use_cache)."""
    return Generate("r", (("user", "hi"),), 10, cache_scope=scope, **fields), prompt


@pytest.mark.parametrize(
    ("fields", "unscoped", "budget_tokens", "reason"),
    [
        ({"use_cache": False}, True, 100_000, "declined"),
        ({}, False, 100_000, "unscoped_off"),
        ({}, True, 0, "off"),
        ({"temperature": 0.7, "seed": 1}, True, 100_000, "seeded"),
    ],
)
def test_a_lease_says_why_the_cache_was_not_asked(
    fields: dict[str, Any], unscoped: bool, budget_tokens: int, reason: str
) -> None:
    pool = cache(budget_tokens)
    pool.unscoped = unscoped
    kept(pool, PROMPT, REPLY)
    request, prompt = ask(PROMPT + REPLY + [900], **fields)
    lease = pool.lease(request, prompt, 50)
    assert (lease.reason, lease.fresh, lease.keep, lease.reused) == (reason, True, False, 0)
    assert lease.capacity == 50  # exactly the request: no room to grow for what is not kept
    assert reason in REASONS and not any(e.lent for e in pool.entries)


def test_a_lease_reuses_an_entry_and_keeps_its_books() -> None:
    pool = cache()
    entry = kept(pool, PROMPT, REPLY, scope="s")
    lease = pool.lease(*ask(PROMPT + REPLY + [900], "s"), 50)
    assert (lease.reason, lease.fresh, lease.entry) == ("reused", False, entry)
    assert lease.reused == len(PROMPT) + len(REPLY) - 1 and entry.lent
    lease.holds(lease.reused)
    lease.prefilled(len(PROMPT) + len(REPLY) + 1)
    assert entry.prompt_end == len(PROMPT) + len(REPLY) + 1
    lease.give_back(reusable=True)
    assert not entry.lent and pool.entries == [entry]


def test_a_fresh_lease_is_kept_only_when_the_budget_holds_it() -> None:
    pool = cache(budget_tokens=2000)
    kept(pool, PROMPT, REPLY, scope="other")
    lease = pool.lease(*ask([1, 2, 3], "s"), 100)
    assert (lease.reason, lease.fresh, lease.keep, lease.capacity) == ("miss", True, True, 1280)
    entry = lease.attach(Tokens([1, 2, 3]), None)
    assert entry in pool.entries and entry.cache_scope == "s" and entry.nbytes == 1280 * KB
    big = pool.lease(*ask([1, 2, 3], "t"), 3000)
    assert (big.reason, big.keep, big.capacity) == ("too_big", False, 3000)
    assert big.attach(Tokens([1, 2, 3]), None) not in pool.entries


def test_a_lease_takes_the_spare_or_a_generator_it_would_evict() -> None:
    pool = cache(budget_tokens=1000)
    made = spare(pool, 400)
    lease = pool.lease(*ask([1, 2, 3], "a"), 300)
    assert (lease.reason, lease.fresh, lease.entry) == ("spare", False, made)
    lease.give_back(reusable=True)
    kept(pool, [7, 8, 9], [10], capacity=400)
    lease = pool.lease(*ask([20, 21, 22], "b"), 300, grow=False)
    assert (lease.reason, lease.fresh, lease.reused) == ("recycled", False, 0)
    assert pool.evictions == 1
