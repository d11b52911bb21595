"""/metrics' histograms move with real requests, by API and outcome, and their labels stay
within fixed sets (no request id, no text)."""

from __future__ import annotations

import re
import threading

import httpx

from scripts.run.services import Service
from tests.sidecar.support import metrics, predict, request_line

MARKER = "gecko-marker-3307"
HISTOGRAMS = (
    "sidecar_time_to_first_token_seconds",
    "sidecar_inter_token_latency_seconds",
    "sidecar_request_duration_seconds",
    "sidecar_queue_wait_seconds",
    "sidecar_request_prompt_tokens",
    "sidecar_request_generated_tokens",
)
LABELS = {
    "api": {"predict", "v1"},
    # generation outcomes; "ok": a /v1/embeddings request (sidecar_embedding_requests)
    "outcome": {"eos", "stop", "length", "time_limit", "cancelled", "error", "rejected", "ok"},
    "le": None,  # bucket bounds
    "source": {"ram", "compact", "disk", "recomputed"},  # where prompt tokens came from
    "tier": {"compact", "disk"},  # where a restored conversation came from
    "check": {"byte_bound", "built"},  # how a refused request was ruled out (issue 46)
    # why a request's images were refused (web/images/decoding.py, the pipeline)
    "reason": {
        "invalid_image",
        "image_too_large",
        "too_many_images",
        "unsupported_image_url",
        "image_input_unsupported",
        "images_busy",  # IMAGE_MEMORY_MB full (web/images/memory.py)
    },
}


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def series(name: str, api: str, outcome: str, part: str) -> str:
    return f'{name}_{part}{{api="{api}",outcome="{outcome}"}}'


def test_a_reply_moves_every_histogram_of_its_api_and_outcome(sidecar_service: Service) -> None:
    url = sidecar_service.url
    before = metrics(url)
    response = predict(
        url, {"input_text": f"Hi {MARKER}", "max_new_tokens": 8, "min_new_tokens": 8}
    )
    line = request_line(sidecar_service, response.headers["x-request-id"])
    after = metrics(url)
    assert line["outcome"] == "length"
    for name in HISTOGRAMS:
        count = series(name, "predict", "length", "count")
        pieces = delta(before, after, count)
        if name == "sidecar_inter_token_latency_seconds":
            assert 1 <= pieces <= line["generated_tokens"] - 1, name  # gaps between pieces
        else:
            assert pieces == 1, name
        # Every observation falls in the +Inf bucket; the buckets are cumulative.
        inf = f'{name}_bucket{{api="predict",le="+Inf",outcome="length"}}'
        assert delta(before, after, inf) == pieces, name
    prompt = series("sidecar_request_prompt_tokens", "predict", "length", "sum")
    assert delta(before, after, prompt) == line["prompt_tokens"]
    generated = series("sidecar_request_generated_tokens", "predict", "length", "sum")
    assert delta(before, after, generated) == line["generated_tokens"] == 8
    ttft = series("sidecar_time_to_first_token_seconds", "predict", "length", "sum")
    assert abs(delta(before, after, ttft) - line["ttft_ms"] / 1000) < 1e-3
    wait = series("sidecar_queue_wait_seconds", "predict", "length", "sum")
    assert abs(delta(before, after, wait) - line["queue_wait_ms"] / 1000) < 1e-3


def test_the_openai_api_and_refusals_have_their_own_series(sidecar_service: Service) -> None:
    url = sidecar_service.url
    before = metrics(url)
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    assert httpx.post(url + "/v1/chat/completions", json=body, timeout=60).is_success
    assert predict(url, {"input_text": " "}).status_code == 422
    after = metrics(url)
    duration = "sidecar_request_duration_seconds"
    v1 = [n for n in after if n.startswith(duration + "_count") and 'api="v1"' in n]
    assert sum(delta(before, after, n) for n in v1) == 1
    assert delta(before, after, series(duration, "predict", "rejected", "count")) == 1
    # A refusal never reached the model: no time to first token, no sizes.
    ttft = series("sidecar_time_to_first_token_seconds", "predict", "rejected", "count")
    assert after.get(ttft, 0) == 0


def test_a_queued_request_waits_in_the_histogram(paced_small_service: Service) -> None:
    """One generation at a time: the second request's wait is counted, and it is the one its
    log line reports."""
    url = paced_small_service.url
    before = metrics(url)
    first_started = threading.Event()
    results: list[httpx.Response] = []

    def first() -> None:
        with httpx.stream(
            "POST", url + "/predict", json={"input_text": "Hi", "max_new_tokens": 10}, timeout=60
        ) as response:
            for _ in response.iter_raw():
                first_started.set()
            results.append(response)

    thread = threading.Thread(target=first)
    thread.start()
    assert first_started.wait(30)
    second = predict(url, {"input_text": "Hi", "max_new_tokens": 2})
    thread.join(60)
    waited = request_line(paced_small_service, second.headers["x-request-id"])["queue_wait_ms"]
    after = metrics(url)
    assert waited > 0
    counts = [n for n in after if n.startswith("sidecar_queue_wait_seconds_count")]
    assert sum(delta(before, after, n) for n in counts) == 2
    sums = [n for n in after if n.startswith("sidecar_queue_wait_seconds_sum")]
    assert sum(delta(before, after, n) for n in sums) >= waited / 1000 - 1e-3


def test_labels_come_from_fixed_sets(sidecar_service: Service) -> None:
    predict(sidecar_service.url, {"input_text": MARKER, "max_new_tokens": 2})
    text = httpx.get(sidecar_service.url + "/metrics", timeout=10).text
    assert MARKER not in text
    for labels in re.findall(r"\{([^}]*)\}", text):
        for name, value in re.findall(r'(\w+)="([^"]*)"', labels):
            assert name in LABELS, labels
            allowed = LABELS[name]
            assert allowed is None or value in allowed, labels
