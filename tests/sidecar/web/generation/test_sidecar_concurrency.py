"""Concurrent requests: independent replies, a bounded number at once, a fair (FIFO) queue,
and 503 + Retry-After when the queue is full."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from scripts.run.services import Service
from sidecar.web.generation.admission import Admission, QueueFull
from tests.sidecar import reference
from tests.sidecar.support import (
    assert_error,
    metrics,
    predict,
    request_line,
    request_lines,
)

# --- the admission queue itself ---------------------------------------------------------------


def test_admission_serves_waiters_in_arrival_order() -> None:
    async def scenario() -> list[int]:
        admission = Admission(slots=1, queue_size=3)
        await admission.acquire()
        order: list[int] = []

        async def waiter(i: int) -> None:
            await admission.acquire()
            order.append(i)
            admission.release()

        tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
        await asyncio.sleep(0)
        assert (admission.active, admission.waiting) == (1, 3)
        with pytest.raises(QueueFull):
            await admission.acquire()
        admission.release()
        await asyncio.gather(*tasks)
        assert (admission.active, admission.waiting) == (0, 0)
        return order

    assert asyncio.run(scenario()) == [0, 1, 2]


def test_a_waiter_that_gives_up_leaves_no_hole() -> None:
    async def scenario() -> None:
        admission = Admission(slots=1, queue_size=2)
        await admission.acquire()
        first = asyncio.create_task(admission.acquire())
        second = asyncio.create_task(admission.acquire())
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.sleep(0)
        assert admission.waiting == 1
        admission.release()
        await second  # the slot went to the next in line
        assert (admission.active, admission.waiting) == (1, 0)
        admission.release()
        assert admission.try_acquire()

    asyncio.run(scenario())


# --- through the real service ------------------------------------------------------------------

PROMPTS = ["Write a long poem about the sea.", "Bonjour, ça va ?", "こんにちは", "hello world"]


def test_simultaneous_greedy_replies_equal_the_replies_one_at_a_time(
    parallel_service: Service, tiny_model_dir: Path
) -> None:
    bodies = [{"input_text": p, "max_new_tokens": 300} for p in PROMPTS]
    alone = [predict(parallel_service.url, body).text for body in bodies]
    barrier = threading.Barrier(len(bodies))

    def together(body: dict[str, object]) -> str:
        barrier.wait()
        return predict(parallel_service.url, body).text

    for _ in range(3):
        with ThreadPoolExecutor(len(bodies)) as pool:
            assert list(pool.map(together, bodies)) == alone
    expected = [
        reference.generate(tiny_model_dir, [{"role": "user", "content": p}], 300).text
        for p in PROMPTS
    ]
    assert alone == expected


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_a_full_queue_answers_503_and_the_queue_is_fifo(small_service: Service) -> None:
    """MAX_CONCURRENCY=1, QUEUE_SIZE=2: one runs, two wait in order, the fourth is refused."""
    url = small_service.url
    long_prompt = {"input_text": "The quick brown fox jumps over the lazy dog. " * 300}
    finished: list[str] = []

    def queued(name: str) -> None:
        headers = {"x-request-id": name}
        body = {"input_text": "Hi", "max_new_tokens": 3}
        response = httpx.post(url + "/predict", json=body, headers=headers, timeout=120)
        assert response.status_code == 200
        finished.append(name)

    with httpx.stream("POST", url + "/predict", json=long_prompt, timeout=120) as running:
        assert running.status_code == 200  # its prefill holds the only slot for a while
        threads = []
        for position, name in enumerate(["queued-first", "queued-second"], start=1):
            threads.append(threading.Thread(target=queued, args=(name,)))
            threads[-1].start()
            wait_until(lambda n=position: metrics(url)["sidecar_queue_depth"] == n)  # type: ignore[misc]
        refused = predict(url, {"input_text": "Hi"})
        assert_error(refused, 503, "overloaded")
        assert int(refused.headers["retry-after"]) > 0
    for thread in threads:
        thread.join()
    assert sorted(finished) == ["queued-first", "queued-second"]
    # One at a time, in arrival order: the log lines are written as requests end.
    request_line(small_service, "queued-second")
    ids = [line["request_id"] for line in request_lines(small_service)]
    assert ids.index("queued-first") < ids.index("queued-second")


def test_requests_that_share_an_x_request_id_do_not_mix(parallel_service: Service) -> None:
    bodies = [{"input_text": p, "max_new_tokens": 200} for p in PROMPTS[:2]]
    alone = [predict(parallel_service.url, body).text for body in bodies]
    barrier = threading.Barrier(len(bodies))

    def together(body: dict[str, object]) -> str:
        barrier.wait()
        headers = {"x-request-id": "same-id"}
        url = parallel_service.url + "/predict"
        return httpx.post(url, json=body, headers=headers, timeout=60).text

    with ThreadPoolExecutor(len(bodies)) as pool:
        assert list(pool.map(together, bodies)) == alone
