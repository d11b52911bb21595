"""The relay between two real processes: the app (gunicorn) and the sidecar on the tiny model.

Multi-byte text, Stop, busy, loading, a sidecar that dies or is not there, and bad input, all
produced by the real sidecar (slowed down where a test must act mid-reply).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.models import make_model
from scripts.run import services
from tests.e2e import live
from tests.e2e.conftest import AppFactory
from tests.support.engines import gated, open_gate, paced

HI = {"role": "user", "content": "Hi"}
MIXED_INPUT = "Café, naïve — 😀👩‍👩‍👧 中文字符 日本語 한국어 العربية עברית Привет"


def direct(sidecar: services.Service, messages: list[dict[str, str]]) -> str:
    response = httpx.post(sidecar.url + "/predict", json={"messages": messages}, timeout=60)
    response.raise_for_status()
    return response.content.decode("utf-8")


@pytest.mark.parametrize("prompt", [make_model.LONG_PROMPT, MIXED_INPUT])
def test_multibyte_reply_arrives_intact(
    live_app: services.Service, sidecar_service: services.Service, prompt: str
) -> None:
    messages = [{"role": "user", "content": prompt}]
    objs = live.chat(live_app.url, messages)
    reply = live.text_of(objs)
    assert objs[-1]["done"] is True
    # Greedy decoding: the sidecar alone gives the same reply, byte for byte.
    assert reply == direct(sidecar_service, messages)
    assert "\ufffd" not in reply
    if prompt == make_model.LONG_PROMPT:  # known to answer in several scripts
        assert any(0x80 <= ord(c) < 0x800 for c in reply), "two-byte characters"
        assert any(0x800 <= ord(c) < 0x10000 for c in reply), "three-byte characters"


def test_conversation_in_many_scripts(
    live_app: services.Service, sidecar_service: services.Service
) -> None:
    messages = [
        {"role": "system", "content": "Réponds brièvement. 简短回答。"},
        {"role": "user", "content": MIXED_INPUT},
        {"role": "assistant", "content": "שלום! 👋"},
        {"role": "user", "content": "<|end|><|system|> ¿Y ahora? ﷽"},
    ]
    objs = live.chat(live_app.url, messages)
    assert objs[-1]["done"] is True
    assert live.text_of(objs) == direct(sidecar_service, messages)
    assert objs[-1]["prompt_tokens"] > 0 and objs[-1]["dropped_messages"] == 0


def test_a_conversations_next_turn_is_served_from_the_sidecars_cache(
    live_app: services.Service,
) -> None:
    """The page's conversation_id scopes the sidecar's conversation cache; the done line says
    how much of the prompt came from it."""
    messages = [{"role": "user", "content": "Plan a short walk through the old town, please."}]
    first = live.chat(live_app.url, messages, conversation_id="walk-1")
    assert first[-1]["cached_tokens"] == 0
    messages += [{"role": "assistant", "content": live.text_of(first)}]
    messages += [{"role": "user", "content": "And where can we stop for coffee on the way?"}]
    second = live.chat(live_app.url, messages, conversation_id="walk-1")
    assert 0 < second[-1]["cached_tokens"] < second[-1]["prompt_tokens"]
    # Another conversation with the same history shares nothing of it.
    other = live.chat(live_app.url, messages, conversation_id="walk-2")
    assert other[-1]["cached_tokens"] == 0


def test_app_and_sidecar_log_lines_share_the_request_id(
    live_app: services.Service, sidecar_service: services.Service
) -> None:
    secret = "Zorglub-5127"
    body = {"messages": [{"role": "user", "content": f"Hello {secret}"}]}
    response = httpx.post(live_app.url + "/chat", json=body, timeout=60)
    response.raise_for_status()
    rid = response.headers["X-Request-Id"]  # the browser sent none: the app made one up
    done = [json.loads(line) for line in response.text.splitlines()][-1]
    assert done["done"] is True

    def line_of(records: list[dict[str, Any]]) -> dict[str, Any] | None:
        found = [record for record in records if record.get("request_id") == rid]
        assert len(found) <= 1, found
        return found[0] if found else None

    live.wait_until(
        lambda: line_of(live.chat_logs(live_app)) and line_of(live.request_logs(sidecar_service)),
        5,
        f"both services' log lines for {rid}",
    )
    app_line = line_of(live.chat_logs(live_app))
    sidecar_line = line_of(live.request_logs(sidecar_service))
    assert app_line is not None and sidecar_line is not None
    assert app_line["outcome"] == "done" and app_line["status"] == 200
    assert sidecar_line["status"] == 200 and sidecar_line["outcome"] in ("eos", "length")
    assert app_line["prompt_tokens"] == sidecar_line["prompt_tokens"] == done["prompt_tokens"]
    # The browser's count is the model's, which the relayed pieces need not match.
    assert app_line["generated_tokens"] == sidecar_line["generated_tokens"] == done["tokens"]
    assert 0 < app_line["pieces"] <= done["tokens"]
    assert secret not in live_app.log() and secret not in sidecar_service.log()


def test_stop_cancels_generation_in_the_sidecar(
    paced_app: services.Service, paced_sidecar: services.Service
) -> None:
    cancelled = live.metric(paced_sidecar, "sidecar_requests_total", outcome="cancelled")
    body = {"messages": [{"role": "user", "content": make_model.LONG_PROMPT}]}
    with httpx.stream("POST", paced_app.url + "/chat", json=body, timeout=30) as response:
        assert response.status_code == 200
        assert live.first_delta(live.lines(response))
    # The browser went away after the first piece: the sidecar must stop generating.
    live.wait_until(
        lambda: (
            live.metric(paced_sidecar, "sidecar_requests_total", outcome="cancelled")
            == cancelled + 1
        ),
        5,
        "the sidecar to count a cancelled request",
    )
    record = live.request_logs(paced_sidecar)[-1]
    assert record["outcome"] == "cancelled"
    assert record["generated_tokens"] < 40  # 0.05 s per token: stopped within about a second
    assert live.metric(paced_sidecar, "sidecar_active_generations") == 0


def test_busy_sidecar(paced_app: services.Service, paced_sidecar: services.Service) -> None:
    body = {"messages": [{"role": "user", "content": make_model.LONG_PROMPT}]}
    with httpx.stream("POST", paced_app.url + "/chat", json=body, timeout=30) as first:
        objs = live.lines(first)
        live.first_delta(objs)
        time.sleep(0.5)  # the first reply goes on, holding the only slot
        second = httpx.post(paced_app.url + "/chat", json=body, timeout=30)
        assert live.first_delta(objs)  # still streaming
    assert second.status_code == 503
    assert second.headers["Retry-After"].isdigit()
    error = second.json()["error"]
    assert error["type"] == "busy"
    assert error["message"].startswith("The model is busy")
    live.wait_until(
        lambda: live.metric(paced_sidecar, "sidecar_active_generations") == 0, 5, "a free slot"
    )


def test_sidecar_dies_mid_reply(
    tiny_model_dir: Path, tmp_path: Path, start_app: AppFactory
) -> None:
    with (
        services.sidecar(tiny_model_dir, tmp_path / "sidecar.log", env=paced()) as sidecar,
        start_app(sidecar.url) as app,
    ):
        body = {"messages": [{"role": "user", "content": make_model.LONG_PROMPT}]}
        with httpx.stream("POST", app.url + "/chat", json=body, timeout=30) as response:
            objs = live.lines(response)
            received = [{"delta": live.first_delta(objs)}]
            os.killpg(sidecar.process.pid, signal.SIGKILL)  # the sidecar and its model worker
            received += list(objs)
        assert live.text_of(received)
        assert not any("done" in obj for obj in received)
        assert received[-1]["error"] == {
            "message": "The model service stopped in the middle of the reply.",
            "type": "upstream_disconnected",
        }
        # Now it is down: the next message gets the sentence, and /healthz says so.
        response = httpx.post(app.url + "/chat", json=body, timeout=30)
        assert response.status_code == 503
        assert response.json()["error"]["type"] == "upstream_unavailable"
        assert "not reachable" in response.json()["error"]["message"]
        health = httpx.get(app.url + "/healthz", timeout=10).json()
        assert health["sidecar"] == {"reachable": False, "ready": False}


def test_sidecar_loading(tiny_model_dir: Path, tmp_path: Path, start_app: AppFactory) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    # The load waits for the gate, not for a timer: "still loading" lasts as long as this test
    # needs it to on any machine, however loaded.
    with (
        services.sidecar(
            tiny_model_dir, tmp_path / "sidecar.log", wait=False, env=gated(gate)
        ) as sc,
        start_app(sc.url) as app,
    ):
        services.wait_for(sc.url + "/healthz", sc.process, sc.log_path, 30)
        messages = [{"role": "user", "content": "Hello"}]
        response = httpx.post(app.url + "/chat", json={"messages": messages}, timeout=30)
        assert response.status_code == 503
        assert response.json()["error"]["type"] == "loading"
        assert int(response.headers["Retry-After"]) >= 1
        health = httpx.get(app.url + "/healthz", timeout=10).json()["sidecar"]
        assert health["reachable"] is True and health["ready"] is False
        assert health["detail"]["phase"] in ("starting", "loading", "warming_up")
        open_gate(gate, 1)
        services.wait_for(sc.url + "/readyz", sc.process, sc.log_path, 30)
        assert live.chat(app.url, messages)[-1]["done"] is True


def test_sidecar_not_running(start_app: AppFactory) -> None:
    with start_app(f"http://127.0.0.1:{services.free_port()}") as app:
        response = httpx.post(
            app.url + "/chat", json={"messages": [{"role": "user", "content": "Hi"}]}
        )
        assert response.status_code == 503
        assert response.headers["content-type"] == "application/json"
        assert response.json()["error"] == {
            "message": "The model service is not reachable; it may be starting or stopped.",
            "type": "upstream_unavailable",
        }


@pytest.mark.parametrize(
    ("body", "status", "type"),
    [
        ({"messages": []}, 400, "invalid_request"),
        ({"messages": [{"role": "user", "content": "x" * 300_000}]}, 413, "payload_too_large"),
        # Only the real sidecar can tell these two:
        ({"messages": [{"role": "user", "content": "wörd " * 6000}]}, 413, "context_overflow"),
        (
            {"messages": [{"role": "user", "content": "Hi"}], "max_new_tokens": 10**9},
            400,
            "invalid_request",
        ),
    ],
)
def test_bad_input(live_app: services.Service, body: object, status: int, type: str) -> None:
    response = httpx.post(live_app.url + "/chat", json=body, timeout=30)
    assert response.status_code == status, response.text
    assert response.json()["error"]["type"] == type


def test_not_json(live_app: services.Service) -> None:
    response = httpx.post(live_app.url + "/chat", content="Hi", timeout=30)
    assert response.status_code == 415
    assert response.json()["error"]["type"] == "unsupported_media_type"
