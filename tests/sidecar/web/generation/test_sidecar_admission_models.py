"""One admission queue across models (generation/admission.py): the generations running are all
of one model; the first in line for another waits until they are over, and those behind it wait
behind it (first come, first served), so no model starves another."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.web.generation.admission import Admission, QueueFull


def test_another_model_waits_for_the_running_ones_and_keeps_its_place() -> None:
    async def scenario() -> list[str]:
        admission = Admission(slots=4, queue_size=8)
        order: list[str] = []
        assert admission.try_acquire("a") and admission.try_acquire("a")
        assert not admission.try_acquire("b")  # free slots, but another model runs

        async def take(model: str) -> None:
            await admission.acquire(model)
            order.append(model)

        b = asyncio.ensure_future(take("b"))
        await asyncio.sleep(0)
        a_behind = asyncio.ensure_future(take("a"))  # behind b: no jumping the line
        await asyncio.sleep(0)
        assert order == [] and admission.waiting == 2
        admission.release()
        await asyncio.sleep(0)
        assert order == []  # one of a's still runs
        admission.release()
        await asyncio.sleep(0)
        assert order == ["b"] and admission.active == 1
        admission.release()
        await asyncio.gather(b, a_behind)
        return order

    assert asyncio.run(scenario()) == ["b", "a"]


def test_one_model_is_served_as_before_and_the_line_stays_bounded() -> None:
    async def scenario() -> None:
        admission = Admission(slots=2, queue_size=1)
        assert admission.try_acquire() and admission.try_acquire()
        waiter = asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0)
        with pytest.raises(QueueFull):
            await admission.acquire()
        admission.release()
        await waiter
        assert admission.active == 2

    asyncio.run(scenario())


def test_one_that_gives_up_in_line_lets_the_next_through() -> None:
    async def scenario() -> None:
        admission = Admission(slots=2, queue_size=4)
        assert admission.try_acquire("a")
        b = asyncio.ensure_future(admission.acquire("b"))
        await asyncio.sleep(0)
        a = asyncio.ensure_future(admission.acquire("a"))
        await asyncio.sleep(0)
        assert not a.done()  # behind b
        b.cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert a.done() and admission.active == 2

    asyncio.run(scenario())
