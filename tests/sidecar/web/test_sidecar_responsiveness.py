"""The HTTP side stays responsive while the model computes: /healthz answers many times during
one long prefill (the model worker is another process, so the GIL it holds stalls nothing).

No absolute latency is asserted (the machine may be busy); the bound is relative to the
prefill's own duration. python -m scripts.bench health-latency measures the p99 figure."""

from __future__ import annotations

import threading
import time

import httpx

from scripts.run.services import Service

LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 300  # ~3300 tokens


def test_healthz_answers_many_times_during_one_long_prefill(small_service: Service) -> None:
    url = small_service.url
    marks: dict[str, float] = {}
    done = threading.Event()

    def long_request() -> None:
        body = {"input_text": LONG_PROMPT, "max_new_tokens": 50}
        try:
            with httpx.stream("POST", url + "/predict", json=body, timeout=120) as response:
                marks["started"] = time.monotonic()  # headers: the prefill begins now
                for _ in response.iter_raw():
                    marks.setdefault("first_token", time.monotonic())
        finally:
            done.set()

    thread = threading.Thread(target=long_request)
    probes: list[tuple[float, float]] = []  # (sent at, latency)
    with httpx.Client(timeout=30) as client:
        thread.start()
        while not done.is_set():
            sent = time.monotonic()
            assert client.get(url + "/healthz").status_code == 200
            probes.append((sent, time.monotonic() - sent))
            time.sleep(0.005)
    thread.join()
    start, end = marks["started"], marks["first_token"]
    prefill = end - start
    assert prefill > 0.3, "the prefill was too short for this test to mean anything"
    during = [latency for sent, latency in probes if sent >= start and sent + latency <= end]
    assert len(during) >= 10, (len(during), prefill)
    assert max(during) < prefill / 4, (max(during), prefill)
