"""KV_MEMORY_MB on the Generator path (model/generator/memory.py): a generator made for one
reply reserves its bytes before it is made, the conversation cache's budget is set aside, a reply
that does not fit beside the running ones must wait (NoRoom), one alone always runs, and on a
device the bound holds only where KV_MEMORY_MB is set. The same through a real sidecar:
tests/sidecar/web/generation/test_sidecar_kv_memory_generator.py."""

from __future__ import annotations

import pytest

from sidecar.limits import MIB
from sidecar.model.generator.memory import GeneratorMemory
from sidecar.model.kv.tiers import NoRoom


def sized(bound: int, cache_budget: int = 0, max_length: int = 4096) -> tuple[GeneratorMemory, int]:
    memory = GeneratorMemory()
    context = memory.size(bound, 1024, cache_budget, max_length)
    return memory, context


def test_unbounded_until_sized() -> None:
    memory = GeneratorMemory()
    assert memory.reserve(10**12) == 0 and memory.reserve(10**12) == 0
    assert memory.memory.reserved_bytes == 0


def test_replies_reserve_until_the_bound_then_wait() -> None:
    memory, _ = sized(4 * MIB)
    first = memory.reserve(3 * MIB)
    assert memory.reserve(MIB) == MIB  # exactly the bound
    with pytest.raises(NoRoom):
        memory.reserve(1)
    assert memory.memory.waits == 1
    memory.release(first)
    assert memory.reserve(2 * MIB) == 2 * MIB
    assert memory.memory.stats() == {
        "kv_memory_bytes": 4 * MIB,
        "kv_reserved_bytes": 3 * MIB,
        "kv_waits": 1,
        "kv_pauses": 0,  # a generator's reservation is its whole length: it never grows
    }


def test_one_reply_alone_always_runs() -> None:
    memory, _ = sized(MIB)
    assert memory.reserve(5 * MIB) == 5 * MIB
    with pytest.raises(NoRoom):
        memory.reserve(1)


def test_the_caches_budget_is_set_aside() -> None:
    memory, _ = sized(4 * MIB, cache_budget=3 * MIB)
    memory.reserve(MIB)
    with pytest.raises(NoRoom):
        memory.reserve(1)
    # A budget as large as the bound leaves the running replies one at a time
    memory, _ = sized(4 * MIB, cache_budget=8 * MIB)
    memory.reserve(10)
    with pytest.raises(NoRoom):
        memory.reserve(10)


def test_the_context_is_capped_to_what_the_bound_holds() -> None:
    assert sized(MIB)[1] == 1024  # 1 KiB a token
    assert sized(64 * MIB, max_length=2048)[1] == 2048


def test_a_device_is_bounded_only_where_kv_memory_mb_is_set() -> None:
    memory = GeneratorMemory("cuda")
    assert memory.size(0, 1024, 0, 4096) == 4096
    assert not memory.bounded and memory.reserve(10**12) == 0
    assert memory.size(MIB, 1024, 0, 4096) == 1024
    assert memory.bounded


def test_on_the_cpu_the_default_comes_from_the_memory_limit() -> None:
    memory = GeneratorMemory()
    memory.size(0, 1024, 0, 4096)
    assert memory.bounded and memory.memory.bound_bytes >= 256 * MIB
