"""The chat app in front of the real sidecar's OpenAI-compatible /v1 (UPSTREAM_API=openai), and
the default /predict mode's honest endings, through real processes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.models import make_model
from scripts.run import services
from tests.e2e import live
from tests.e2e.conftest import AppFactory
from tests.sidecar import reference
from tests.support.engines import paced

USER = [{"role": "user", "content": "Plan a short walk through the old town, please."}]


@pytest.fixture(scope="module")
def openai_app(
    sidecar_service: services.Service, start_app: AppFactory
) -> Iterator[services.Service]:
    with start_app(sidecar_service.url, UPSTREAM_API="openai") as app:
        yield app


def test_the_reply_is_the_sidecars_v1_reply(
    openai_app: services.Service, sidecar_service: services.Service
) -> None:
    body = {"messages": USER, "max_tokens": 24}
    direct = httpx.post(sidecar_service.url + "/v1/chat/completions", json=body, timeout=60)
    expected = direct.json()["choices"][0]
    objs = live.chat(openai_app.url, USER, max_new_tokens=24)
    assert live.text_of(objs) == expected["message"]["content"]
    done = objs[-1]
    assert done["done"] is True and done["finish_reason"] == expected["finish_reason"]
    assert done["prompt_tokens"] == direct.json()["usage"]["prompt_tokens"]


def test_the_conversation_scope_reaches_the_cache(openai_app: services.Service) -> None:
    first = live.chat(openai_app.url, USER, conversation_id="oa-walk")
    assert first[-1]["cached_tokens"] == 0
    messages = [*USER, {"role": "assistant", "content": live.text_of(first)}]
    messages += [{"role": "user", "content": "And where can we stop for coffee?"}]
    second = live.chat(openai_app.url, messages, conversation_id="oa-walk")
    assert 0 < second[-1]["cached_tokens"] < second[-1]["prompt_tokens"]


def test_health_names_the_served_model(openai_app: services.Service, tiny_model_dir: Path) -> None:
    body = httpx.get(openai_app.url + "/healthz", timeout=10).json()
    assert body["model"] == tiny_model_dir.name and body["sidecar"]["ready"]


def test_stop_cancels_through_v1(paced_sidecar: services.Service, start_app: AppFactory) -> None:
    with start_app(paced_sidecar.url, UPSTREAM_API="openai") as app:
        cancelled = live.metric(paced_sidecar, "sidecar_requests_total", outcome="cancelled")
        body = {"messages": [{"role": "user", "content": make_model.LONG_PROMPT}]}
        with httpx.stream("POST", app.url + "/chat", json=body, timeout=30) as response:
            assert live.first_delta(live.lines(response))
        live.wait_until(
            lambda: (
                live.metric(paced_sidecar, "sidecar_requests_total", outcome="cancelled")
                == cancelled + 1
            ),
            5,
            "the sidecar to cancel the generation",
        )


def test_predict_mode_says_why_a_reply_ended(live_app: services.Service) -> None:
    """The default /predict mode reads the sidecar's events: the done line has the reason."""
    objs = live.chat(live_app.url, USER, max_new_tokens=3, min_new_tokens=3)
    assert objs[-1]["finish_reason"] == "length"
    ended = [{"role": "user", "content": make_model.EOS_PROMPT}]  # the model ends it itself
    assert live.chat(live_app.url, ended, max_new_tokens=200)[-1]["finish_reason"] == "stop"


@pytest.fixture(scope="module")
def queued_openai_app(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, start_app: AppFactory
) -> Iterator[tuple[services.Service, services.Service]]:
    """The app (openai) before a sidecar that runs one reply at a time and reads prompts at
    1.5 s a chunk: a chat behind a long prompt waits, and its /v1 stream starts early."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-queued.log"
    env = paced(pace=0.0, prefill_pace=1.5)
    with (
        services.sidecar(tiny_model_dir, log, MAX_CONCURRENCY="1", env=env) as sidecar,
        start_app(sidecar.url, UPSTREAM_API="openai") as app,
    ):
        yield sidecar, app


def filler(model_dir: Path, tokens: int) -> str:
    text = "a b c d e f g h "
    while len(reference.prompt_ids(model_dir, [{"role": "user", "content": text}])) < tokens:
        text += "a b c d e f g h "
    return text


def test_a_chat_behind_a_long_prompt_through_v1(
    queued_openai_app: tuple[services.Service, services.Service], tiny_model_dir: Path
) -> None:
    """The sidecar's early start, keep-alive chunks and refusal event, read by the app: the
    queued chat is relayed whole with nothing empty in it, and a chat too long for the context
    is the page's context_overflow, as its 400 would be (not upstream_disconnected)."""
    sidecar, app = queued_openai_app
    blocker = {"messages": [{"role": "user", "content": filler(tiny_model_dir, 600)}]}
    running = threading.Thread(
        target=httpx.post,
        args=(sidecar.url + "/v1/chat/completions",),
        kwargs={"json": {**blocker, "max_tokens": 1}, "timeout": 120},
    )
    running.start()
    live.wait_until(
        lambda: live.metric(sidecar, "sidecar_active_generations") == 1, 30, "the blocker"
    )
    too_long = [{"role": "user", "content": filler(tiny_model_dir, 4200)}]
    results: dict[str, list[dict[str, Any]]] = {}
    refused = threading.Thread(
        target=lambda: results.setdefault("refused", live.chat(app.url, too_long))
    )
    refused.start()
    objs = live.chat(app.url, USER, max_new_tokens=24)
    refused.join(120)
    running.join(120)
    expected = reference.generate(tiny_model_dir, USER, 24)
    assert [o["delta"] for o in objs if "delta" in o] and all(o.get("delta") != "" for o in objs)
    assert live.text_of(objs) == expected.text
    assert objs[-1]["done"] is True
    assert results["refused"][-1]["error"]["type"] == "context_overflow"
