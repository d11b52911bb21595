"""A /v1 stream starts before its reply does, and stays alive while it is silent (issue 37).

Clients that read with a timeout (App Service's tutorial FastAPI app: 30 s) got no byte while
their request waited in the queue, or while the worker read a long prompt: a streamed request
sent while one 200-token phi3-mini reply ran got its first byte after 44.9 s. Now a stream that
has not started within STREAM_START_AFTER_S (2 s) gets its 200, headers and role chunk at once,
and every stream sends an empty-content chunk after STREAM_KEEPALIVE_S (5 s) of silence; a
refusal after the early start is an error event. The worker here reads prompts slowly
(`paced(prefill_pace=...)`: a chunk of PREFILL_CHUNK tokens takes 1.5 s, as a long prompt on
phi3-mini and 2 vCPUs takes), which is what makes the waits long; nothing here measures time
except the tutorial app's own 30-second read timeout, the bound the issue asks for.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from scripts.models.make_model import LONG_PROMPT
from scripts.run import services
from tests.sidecar import reference
from tests.sidecar.support import metrics, request_line
from tests.sidecar.tutorial_apps import APPS, N_PREDICT, SYSTEM, Read, fastapi_app
from tests.support.engines import paced

PATH = "/v1/chat/completions"
PREFILL_PACE_S = 1.5  # per chunk of PREFILL_CHUNK (64) prompt tokens
# A filler whose 1,500-token prompt the tiny model answers in 150 tokens (it ends with EOS).
FILLER = "a b c d e f g h "


@pytest.fixture(scope="module")
def queued_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """One reply at a time (MAX_CONCURRENCY=1): the others wait in the queue."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-queued.log"
    env = paced(pace=0.0, prefill_pace=PREFILL_PACE_S)
    with services.sidecar(tiny_model_dir, log, MAX_CONCURRENCY="1", env=env) as service:
        yield service


@pytest.fixture(scope="module")
def crowded_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """The defaults (MAX_CONCURRENCY=4), tokens paced so that other replies run for a while."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-crowded.log"
    with services.sidecar(
        tiny_model_dir, log, env=paced(pace=0.02, prefill_pace=PREFILL_PACE_S)
    ) as service:
        yield service


def long_prompt(model_dir: Path, tokens: int) -> str:
    """A user message whose prompt (with the tutorial's system message) takes `tokens`."""
    text = FILLER
    while len(reference.prompt_ids(model_dir, messages(text))) < tokens:
        text += FILLER
    return text


def messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]


def gauge(service: services.Service, name: str) -> float:
    return metrics(service.url).get(f"sidecar_{name}", 0.0)


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Polls (a bound on a failure, not a measured time)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.05)


@contextlib.contextmanager
def running(
    service: services.Service, bodies: list[dict[str, Any]], path: str = PATH
) -> Iterator[None]:
    """These requests running (admitted: the worker has them) while the block runs; each must
    end with 200."""
    before = gauge(service, "active_generations")
    results: list[int] = []

    def send(body: dict[str, Any]) -> None:
        results.append(httpx.post(service.url + path, json=body, timeout=300).status_code)

    threads = [threading.Thread(target=send, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    wait_for(
        lambda: gauge(service, "active_generations") >= before + len(bodies),
        "the requests to run",
    )
    try:
        yield
    finally:
        for thread in threads:
            thread.join(300)
    assert results == [200] * len(bodies)


def blocker(model_dir: Path, prompt_tokens: int) -> dict[str, Any]:
    """A request whose prompt takes prompt_tokens / 64 * PREFILL_PACE_S seconds to read."""
    prompt = long_prompt(model_dir, prompt_tokens)
    return {"messages": messages(prompt), "max_tokens": 1, "cache_prompt": False}


def keepalives(read: Read) -> int:
    """The chunks that said nothing: delta {"content": ""}, no finish_reason."""
    count = 0
    for line in read.lines:
        if line.startswith("data: {"):
            choices = json.loads(line.removeprefix("data: "))["choices"]
            if choices and choices[0]["delta"] == {"content": ""}:
                count += choices[0]["finish_reason"] is None
    return count


def test_every_tutorial_app_reads_a_reply_that_waited_in_the_queue(
    queued_sidecar: services.Service, tiny_model_dir: Path
) -> None:
    """Behind a reply whose prompt takes 36 s to read, each app's request waits in the queue:
    its stream starts anyway, its empty chunks keep the FastAPI app's 30-second read timeout
    from firing, and each strict reader reads its whole reply. Before, the FastAPI app got no
    byte, not even the headers, for as long as the queue held it."""
    url = queued_sidecar.url + PATH
    with (
        running(queued_sidecar, [blocker(tiny_model_dir, 1500)]),
        concurrent.futures.ThreadPoolExecutor(len(APPS)) as pool,
    ):
        reads = {app: pool.submit(read, url, LONG_PROMPT) for app, read in APPS.items()}
        wait_for(lambda: gauge(queued_sidecar, "queue_depth") == len(APPS), "the queue")
        done = {app: future.result() for app, future in reads.items()}
    for app, read in done.items():
        expected = reference.generate(tiny_model_dir, messages(LONG_PROMPT), N_PREDICT[app])
        assert read.text == expected.text, app
        assert "x-prompt-tokens" not in read.headers  # started before the worker had it
        line = request_line(queued_sidecar, read.request_id)
        outcome = "eos" if expected.eos else "length"  # .NET asks for 150 tokens
        assert (line["status"], line["outcome"]) == (200, outcome), app
        assert line["queue_wait_ms"] > 0
    # A keepalive comes after STREAM_START_AFTER_S (2 s) and each STREAM_KEEPALIVE_S (5 s) of
    # silence: one is owed only to a wait longer than both. How long the FastAPI app's request
    # waited depends on when it arrived behind the blocker, which the machine's load decides
    # (a CI run saw it served before its first keepalive was due).
    waited_s = request_line(queued_sidecar, done["fastapi"].request_id)["queue_wait_ms"] / 1000
    if waited_s > 2.0 + 5.0 + 1.0:
        assert keepalives(done["fastapi"]) >= 1, waited_s


def test_the_fastapi_app_reads_its_long_prompt_while_three_others_run(
    crowded_sidecar: services.Service, tiny_model_dir: Path
) -> None:
    """Three replies run; the FastAPI app's own prompt is 1,500 tokens, read in 24 chunks of
    1.5 s between their tokens. Its stream started at once (the worker started it at once);
    before, nothing followed the role chunk until the first token, after the 30-second read
    timeout."""
    story = [{"role": "user", "content": "Tell me a story."}]
    others = [{"messages": story, "max_new_tokens": 300, "min_new_tokens": 300}] * 3
    prompt = long_prompt(tiny_model_dir, 1500)
    with running(crowded_sidecar, others, path="/predict"):
        read = fastapi_app(crowded_sidecar.url + PATH, prompt)
        # the three others were still running when the app's reply began: counted, not timed
        assert gauge(crowded_sidecar, "active_generations") >= 2
    expected = reference.generate(tiny_model_dir, messages(prompt), 2048)
    assert read.text == expected.text
    line = request_line(crowded_sidecar, read.request_id)
    assert line["prompt_tokens"] >= 1500 and line["outcome"] == "eos"
    assert keepalives(read) >= 1


def test_a_refusal_after_the_early_start_is_an_error_event(
    queued_sidecar: services.Service, tiny_model_dir: Path
) -> None:
    """A prompt too long for the context, queued: its stream has started, so the refusal is
    OpenAI's error event (the SDK raises it as an APIError), with no final chunk and no [DONE];
    the log line says what the 400 would have said."""
    too_long = {"messages": messages(long_prompt(tiny_model_dir, 4200)), "cache_prompt": False}
    url = queued_sidecar.url + PATH
    raw: list[str] = []

    def read_raw() -> httpx.Headers:
        with httpx.stream("POST", url, json={**too_long, "stream": True}, timeout=60) as r:
            assert r.status_code == 200
            raw.extend(r.iter_lines())
            return r.headers

    def read_with_sdk() -> openai.APIError:
        client = openai.OpenAI(base_url=queued_sidecar.url + "/v1", api_key="-", max_retries=0)
        with client, pytest.raises(openai.APIError) as caught:
            chat: Any = too_long["messages"]
            stream = client.chat.completions.create(model="any", messages=chat, stream=True)
            list(stream)
        return caught.value

    with (
        running(queued_sidecar, [blocker(tiny_model_dir, 600)]),
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        raw_read, sdk_read = pool.submit(read_raw), pool.submit(read_with_sdk)
        wait_for(lambda: gauge(queued_sidecar, "queue_depth") == 2, "the queue")
        headers, sdk_error = raw_read.result(), sdk_read.result()
    events = [line.removeprefix("data: ") for line in raw if line]
    assert all(line.startswith("data: ") for line in raw if line)
    first, *middle, last = (json.loads(event) for event in events)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(chunk["choices"][0]["delta"] == {"content": ""} for chunk in middle)
    error = last["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "context_length_exceeded")
    assert isinstance(error["limit_tokens"], int) and error["param"] is None
    line = request_line(queued_sidecar, headers["x-request-id"])
    assert (line["status"], line["outcome"]) == (200, "rejected")
    assert line["error_type"] == "context_length_exceeded"
    assert sdk_error.code == "context_length_exceeded"


def test_a_client_that_leaves_while_queued_leaves_the_queue(
    queued_sidecar: services.Service, tiny_model_dir: Path
) -> None:
    """After the early start the client's leaving is still watched: its request leaves the
    queue and never reaches the worker."""
    body = {"messages": messages(LONG_PROMPT), "stream": True}
    with running(queued_sidecar, [blocker(tiny_model_dir, 600)]):
        with httpx.stream("POST", queued_sidecar.url + PATH, json=body, timeout=60) as response:
            first = next(response.iter_lines())
            rid = response.headers["x-request-id"]
        assert json.loads(first.removeprefix("data: "))["choices"][0]["delta"]["role"]
        line = request_line(queued_sidecar, rid)
        assert (line["status"], line["outcome"]) == (200, "cancelled")
        assert "prompt_tokens" not in line and "queue_wait_ms" not in line  # never admitted
        assert gauge(queued_sidecar, "queue_depth") == 0
        assert gauge(queued_sidecar, "active_generations") == 1  # the blocker, unharmed


def test_predict_and_unstreamed_replies_wait_as_before(
    queued_sidecar: services.Service, tiny_model_dir: Path
) -> None:
    """/predict's text stream and a non-streamed completion have no early start and nothing
    in their bodies but the reply: they answer when the worker starts them."""
    question = messages(LONG_PROMPT)
    expected = reference.generate(tiny_model_dir, question, 40)
    url = queued_sidecar.url

    def predict() -> httpx.Response:
        body = {"messages": question, "max_new_tokens": 40}
        return httpx.post(url + "/predict", json=body, timeout=120)

    def completion() -> httpx.Response:
        body = {"messages": question, "max_tokens": 40}
        return httpx.post(url + PATH, json=body, timeout=120)

    with (
        running(queued_sidecar, [blocker(tiny_model_dir, 600)]),
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        futures = [pool.submit(predict), pool.submit(completion)]
        wait_for(lambda: gauge(queued_sidecar, "queue_depth") == 2, "the queue")
        text, whole = (future.result() for future in futures)
    assert text.status_code == whole.status_code == 200
    assert text.text == expected.text
    assert whole.json()["choices"][0]["message"]["content"] == expected.text
    assert "x-prompt-tokens" in text.headers and "x-prompt-tokens" in whole.headers
