"""The relay against a fake sidecar: the faults the real sidecar cannot produce on demand
(characters split across chunks, dying or stalling mid-reply, busy and loading refusals)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar, Handler

CONVERSATION = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Bonjour, ça va ? 😀"},
        {"role": "assistant", "content": "Oui."},
        {"role": "user", "content": "中文 and עברית"},
    ]
}
MIXED = "Café — naïve 😀👩‍👩‍👧 中文字符 العربية שלום 🇫🇷 end"


def lines(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 200
    assert response.mimetype == "application/x-ndjson"
    return list(fs.ndjson(response.get_data()))


def text_of(objs: list[dict[str, Any]]) -> str:
    return "".join(obj["delta"] for obj in objs if "delta" in obj)


def test_streams_deltas_then_done(client: FlaskClient, fake: FakeSidecar) -> None:
    fake.predict = lambda h: fs.reply(h, ["Hello", ", ", "world", "!"])
    objs = lines(client.post("/chat", json=CONVERSATION))
    assert [o["delta"] for o in objs if "delta" in o] == ["Hello", ", ", "world", "!"]
    done = objs[-1]
    assert done["done"] is True and done["tokens"] == 4
    assert done["ttft_ms"] >= 0 and done["tokens_per_s"] > 0
    assert fake.requests == [{**CONVERSATION, "cache_scope": fake.requests[0]["cache_scope"]}]


def test_sends_generation_options(make_app: Callable[..., Flask], fake: FakeSidecar) -> None:
    client = make_app(MAX_NEW_TOKENS=32).test_client()
    lines(client.post("/chat", json=CONVERSATION))
    lines(client.post("/chat", json={**CONVERSATION, "max_new_tokens": 5, "temperature": 0}))
    assert fake.requests[0]["max_new_tokens"] == 32
    assert fake.requests[1]["max_new_tokens"] == 5
    assert fake.requests[1]["temperature"] == 0.0
    lines(client.post("/chat", json={**CONVERSATION, "min_new_tokens": 40}))
    assert fake.requests[2]["min_new_tokens"] == 40
    assert fake.requests[2]["max_new_tokens"] == 40  # the default of 32 would undercut it


def test_a_temperature_below_the_floor_is_sent_as_greedy(
    client: FlaskClient, fake: FakeSidecar
) -> None:
    """No model service behind the app divides logits by 1.8e-307 (issue 38): below
    MIN_TEMPERATURE the chat is greedy, sent as 0; the floor itself is sent as it is."""
    for temperature in (5e-324, 1.8e-307, 9e-6, 1e-5, 0.7):
        lines(client.post("/chat", json={**CONVERSATION, "temperature": temperature}))
        expected = temperature if temperature >= 1e-5 else 0.0
        assert fake.requests[-1]["temperature"] == expected, temperature


def test_tokens_is_the_models_count_not_the_pieces(client: FlaskClient, fake: FakeSidecar) -> None:
    # A fast model's twelve tokens can reach the relay as one piece of text.
    fake.predict = lambda h: fs.reply(h, ["twelve tokens of text, at once"], tokens=12)
    done = lines(client.post("/chat", json=CONVERSATION))[-1]
    assert done["done"] is True and done["tokens"] == 12


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_events_split_across_chunks_mid_character(
    client: FlaskClient, fake: FakeSidecar, size: int
) -> None:
    fake.predict = lambda h: fs.reply(h, [MIXED[:7], MIXED[7:]], split=size)
    objs = lines(client.post("/chat", json=CONVERSATION))
    assert text_of(objs) == MIXED
    assert all("\ufffd" not in o["delta"] for o in objs if "delta" in o)
    assert objs[-1]["done"] is True and objs[-1]["tokens"] == 2


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_a_plain_text_sidecar_still_works(
    client: FlaskClient, fake: FakeSidecar, size: int
) -> None:
    """A sidecar from before events answers text/plain: the text, with characters split
    across chunks, and no counts."""
    data = MIXED.encode()
    fake.predict = lambda h: fs.plain(h, [data[i : i + size] for i in range(0, len(data), size)])
    objs = lines(client.post("/chat", json=CONVERSATION))
    assert text_of(objs) == MIXED
    assert all("\ufffd" not in o["delta"] for o in objs if "delta" in o)
    assert objs[-1]["done"] is True and "finish_reason" not in objs[-1]


def test_newlines_and_quotes_stay_inside_one_line(client: FlaskClient, fake: FakeSidecar) -> None:
    reply = 'line one\nline "two"\r\n\ttab \\ backslash \u2028 \u2029 \x85 \x0b end'
    fake.predict = lambda h: fs.reply(h, [reply])
    response = client.post("/chat", json=CONVERSATION)
    body = response.get_data(as_text=True)
    assert len(body.splitlines()) == 2  # one delta line, one done line, however one splits
    # NEL and VT are control characters: shown as U+FFFD and VT's control picture (wire.visible).
    assert text_of(lines(response)) == reply.replace("\x85", "\ufffd").replace("\x0b", "\u240b")


def test_sidecar_down(make_app: Callable[..., Flask], down_url: str) -> None:
    response = make_app(SIDECAR_URL=down_url).test_client().post("/chat", json=CONVERSATION)
    assert response.status_code == 503
    assert response.get_json()["error"] == {
        "message": "The model service is not reachable; it may be starting or stopped.",
        "type": "upstream_unavailable",
    }


def sidecar_error(type: str, message: str, **extra: str) -> dict[str, Any]:
    """The sidecar's error envelope (phi3-sidecar/sidecar/errors.py)."""
    return {"error": {"message": message, "type": type, **extra}}


@pytest.mark.parametrize(
    ("body", "type"),
    [
        (
            sidecar_error("not_ready", "the model is not ready (loading)", phase="loading"),
            "loading",
        ),
        (
            sidecar_error("not_ready", "the model is not ready (warming_up)", phase="warming_up"),
            "loading",
        ),
        (
            sidecar_error("not_ready", "the model is not ready", phase="restarting"),
            "restarting",
        ),
        (sidecar_error("overloaded", "too many requests are waiting"), "busy"),
        ({"detail": "queue full"}, "busy"),  # an unknown 503: retry as asked
    ],
)
def test_loading_and_busy_pass_retry_after(
    client: FlaskClient, fake: FakeSidecar, body: Any, type: str
) -> None:
    fake.predict = lambda h: fs.refuse(h, 503, body, {"Retry-After": "7"})
    response = client.post("/chat", json=CONVERSATION)
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "7"
    error = response.get_json()["error"]
    assert error["type"] == type
    assert "7 s" in error["message"]


def test_model_that_failed_to_load_is_not_retried(client: FlaskClient, fake: FakeSidecar) -> None:
    body = sidecar_error(
        "not_ready", "the model is not ready (failed: no genai_config.json)", phase="failed"
    )
    fake.predict = lambda h: fs.refuse(h, 503, body, {"Retry-After": "5"})
    response = client.post("/chat", json=CONVERSATION)
    assert response.status_code == 503
    assert "Retry-After" not in response.headers
    assert response.get_json()["error"]["type"] == "model_failed"


@pytest.mark.parametrize(
    ("kind", "type"),
    [("context_length_exceeded", "context_overflow"), ("body_too_large", "payload_too_large")],
)
def test_too_long(client: FlaskClient, fake: FakeSidecar, kind: str, type: str) -> None:
    fake.predict = lambda h: fs.refuse(h, 413, sidecar_error(kind, "too long"))
    response = client.post("/chat", json=CONVERSATION)
    assert response.status_code == 413
    assert response.get_json()["error"]["type"] == type


def test_sidecar_validation_message_is_passed_on(client: FlaskClient, fake: FakeSidecar) -> None:
    body = sidecar_error("invalid_request", "temperature: Input should be less than or equal to 2")
    fake.predict = lambda h: fs.refuse(h, 422, body)
    response = client.post("/chat", json=CONVERSATION)
    assert response.status_code == 400
    assert response.get_json()["error"] == {
        "message": "The model service refused the conversation "
        "(temperature: Input should be less than or equal to 2).",
        "type": "invalid_request",
    }


def test_sidecar_error_is_a_sentence_not_internals(client: FlaskClient, fake: FakeSidecar) -> None:
    fake.predict = lambda h: fs.refuse(h, 500, sidecar_error("internal_error", "Traceback: boom"))
    response = client.post("/chat", json=CONVERSATION)
    assert response.status_code == 502
    assert response.get_json()["error"] == {
        "message": "The model service could not answer this message.",
        "type": "upstream_error",
    }


def test_body_is_sent_as_utf8(client: FlaskClient, fake: FakeSidecar) -> None:
    lines(client.post("/chat", json=CONVERSATION))
    sent = {**CONVERSATION, "cache_scope": fake.requests[0]["cache_scope"]}
    expected = json.dumps(sent, ensure_ascii=False, separators=(",", ":"))
    assert fake.raw_bodies[0].decode("utf-8") == expected


def test_done_line_reports_the_sidecars_prompt_counts(
    client: FlaskClient, fake: FakeSidecar
) -> None:
    fake.predict = lambda h: fs.reply(
        h, ["ok"], finish_reason="length", prompt_tokens=42, cached_tokens=40, dropped_messages=2
    )
    done = lines(client.post("/chat", json=CONVERSATION))[-1]
    assert done["prompt_tokens"] == 42 and done["dropped_messages"] == 2
    assert done["cached_tokens"] == 40 and done["finish_reason"] == "length"
    assert "passage_cached_tokens" not in done  # none came from the passage store
    fake.predict = lambda h: fs.reply(h, ["ok"], prompt_tokens=900, passage_cached_tokens=700)
    assert lines(client.post("/chat", json=CONVERSATION))[-1]["passage_cached_tokens"] == 700


def test_a_plain_text_sidecar_reports_its_counts_in_headers(
    client: FlaskClient, fake: FakeSidecar
) -> None:
    def reply(h: Handler) -> None:
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked")
        h.send_header("X-Prompt-Tokens", "42")
        h.send_header("X-Dropped-Messages", "2")
        h.end_headers()
        fs.write_chunk(h, b"ok")
        fs.end_chunks(h)

    fake.predict = reply
    done = lines(client.post("/chat", json=CONVERSATION))[-1]
    assert done["prompt_tokens"] == 42 and done["dropped_messages"] == 2


def test_read_timeout_before_the_reply(make_app: Callable[..., Flask], fake: FakeSidecar) -> None:
    fake.predict = lambda h: fs.wait_until_client_closes(h, 5)
    client = make_app(SIDECAR_READ_TIMEOUT=0.5).test_client()
    response = client.post("/chat", json=CONVERSATION)
    assert response.status_code == 504
    assert response.get_json()["error"]["type"] == "upstream_timeout"
    assert fake.client_gone.wait(2)


def test_a_silent_start_gets_heartbeats_then_its_refusal(
    make_app: Callable[..., Flask], fake: FakeSidecar
) -> None:
    # The sidecar answers only when a queued chat gets its slot: past QUEUED_STREAM_AFTER the
    # stream starts with pings (issue 25), and a refusal that comes later is its last line.
    fake.predict = lambda h: fs.wait_until_client_closes(h, 5)
    client = make_app(
        SIDECAR_READ_TIMEOUT=0.7, HEARTBEAT_INTERVAL=0.1, QUEUED_STREAM_AFTER=0.1
    ).test_client()
    objs = lines(client.post("/chat", json=CONVERSATION))
    assert objs[0] == {"ping": True}
    assert objs[-1]["error"]["type"] == "upstream_timeout"
    assert all(obj == {"ping": True} for obj in objs[:-1])
    assert fake.client_gone.wait(2)


def test_sidecar_dies_mid_reply(client: FlaskClient, fake: FakeSidecar) -> None:
    def dies(h: Handler) -> None:
        fs.start_events(h)
        fs.write_text(h, "Part ")
        fs.write_text(h, "of it ")
        # The connection drops inside an event, inside "é": none of it may be shown.
        fs.write_chunk(h, fs.event_line({"text": "café"})[:-3])
        fs.drop(h)

    fake.predict = dies
    objs = lines(client.post("/chat", json=CONVERSATION))
    assert text_of(objs) == "Part of it "
    assert objs[-1] == {
        "error": {
            "message": "The model service stopped in the middle of the reply.",
            "type": "upstream_disconnected",
        }
    }
    assert not any("done" in o for o in objs)


def test_a_plain_text_sidecar_dying_mid_character(client: FlaskClient, fake: FakeSidecar) -> None:
    # The last piece ends inside "é": the half character must not be shown.
    fake.predict = lambda h: fs.plain(h, [b"Part ", b"of it ", b"caf" + b"\xc3"], end=False)
    objs = lines(client.post("/chat", json=CONVERSATION))
    assert text_of(objs) == "Part of it caf"
    assert objs[-1]["error"]["type"] == "upstream_disconnected"


def test_sidecar_stalls_mid_reply(make_app: Callable[..., Flask], fake: FakeSidecar) -> None:
    def stall(h: Handler) -> None:
        fs.start_events(h)
        fs.write_text(h, "The start")
        fs.wait_until_client_closes(h, 10)

    fake.predict = stall
    client = make_app(SIDECAR_READ_TIMEOUT=1.0, HEARTBEAT_INTERVAL=0.2).test_client()
    started = time.monotonic()
    objs = lines(client.post("/chat", json=CONVERSATION))
    assert time.monotonic() - started < 5
    assert text_of(objs) == "The start"
    assert {"ping": True} in objs
    assert objs[-1]["error"]["type"] == "upstream_timeout"
    assert fake.client_gone.wait(2)  # the relay hung up on the stalled sidecar


def test_heartbeat_while_the_sidecar_is_silent(client: FlaskClient, fake: FakeSidecar) -> None:
    def slow_prefill(h: Handler) -> None:
        fs.start_events(h)
        time.sleep(1.0)
        fs.write_text(h, "Finally")
        fs.write_done(h, 1)

    fake.predict = slow_prefill
    objs = lines(client.post("/chat", json=CONVERSATION))
    first_delta = next(i for i, o in enumerate(objs) if "delta" in o)
    assert objs[:first_delta].count({"ping": True}) >= 3
    assert objs[-1]["done"] is True and objs[-1]["tokens"] == 1
    assert objs[-1]["ttft_ms"] >= 900


def endless(h: Handler) -> None:
    fs.start_events(h)
    while True:
        fs.write_text(h, "more ")
        time.sleep(0.02)


def test_closing_the_response_drops_the_upstream(client: FlaskClient, fake: FakeSidecar) -> None:
    fake.predict = endless
    response = client.post("/chat", json=CONVERSATION, buffered=False)
    first = next(iter(response.response))
    assert isinstance(first, bytes)
    assert json.loads(first) == {"delta": "more "}
    response.close()
    assert fake.client_gone.wait(2)


def test_closing_before_reading_drops_the_upstream(client: FlaskClient, fake: FakeSidecar) -> None:
    fake.predict = endless
    response = client.post("/chat", json=CONVERSATION, buffered=False)
    response.close()
    assert fake.client_gone.wait(2)
