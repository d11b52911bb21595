"""POST /v1/chat/completions (OpenAI's Chat Completions API) against real sidecar processes on
the generated models: the same replies as /predict, in OpenAI's shapes (JSON and server-sent
events), OpenAI's usage and finish reasons, the same validation, errors and cancellation."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.models.make_model import EOS_PROMPT, LONG_PROMPT
from scripts.run import services
from scripts.run.services import Service
from tests.sidecar import reference
from tests.sidecar.support import assert_error, metrics, predict, request_line
from tests.support.engines import RAISE, SECRET

PATH = "/v1/chat/completions"
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello there"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "Bonjour, ça va ?"},
]


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def chat(url: str, body: dict[str, Any], timeout: float = 60.0) -> httpx.Response:
    return httpx.post(url + PATH, json=body, timeout=timeout)


def sse_events(response: httpx.Response) -> list[str]:
    """The data of each server-sent event (strictly: only `data:` lines, blank-line separated)."""
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    text = response.text
    assert text.endswith("\n\n"), text[-200:]
    events = []
    for block in text[:-2].split("\n\n"):
        lines = block.split("\n")
        assert all(line.startswith("data: ") for line in lines), block
        events.append("\n".join(line.removeprefix("data: ") for line in lines))
    return events


def stream(url: str, body: dict[str, Any]) -> tuple[httpx.Response, list[dict[str, Any]]]:
    """A streamed completion: the response and its chunks; checks the frame around them."""
    response = chat(url, {**body, "stream": True})
    assert response.status_code == 200, response.text
    *data, done = sse_events(response)
    assert done == "[DONE]"
    chunks = [json.loads(d) for d in data]
    rid = response.headers["x-request-id"]
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["id"] == f"chatcmpl-{rid}"
        assert (chunk["created"], chunk["model"]) == (chunks[0]["created"], chunks[0]["model"])
    first, *middle = [c for c in chunks if c["choices"]]
    assert first["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    *content, last = middle
    for chunk in content:
        (choice,) = chunk["choices"]
        # text, or a keepalive (STREAM_KEEPALIVE_S of silence: a busy machine)
        assert set(choice["delta"]) == {"content"} and isinstance(choice["delta"]["content"], str)
        assert choice["finish_reason"] is None
    assert last["choices"][0]["delta"] == {"content": ""}
    assert last["choices"][0]["finish_reason"] in ("stop", "length")
    return response, chunks


def streamed_text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])


def finish_reason(chunks: list[dict[str, Any]]) -> str:
    return str([c for c in chunks if c["choices"]][-1]["choices"][0]["finish_reason"])


def test_a_completion_is_the_predict_reply_with_usage(
    sidecar_service: Service, tiny_model_dir: Path
) -> None:
    expected = reference.generate(tiny_model_dir, CONVERSATION, 40)
    before = metrics(sidecar_service.url)
    body = {"model": "any-name/v1", "messages": CONVERSATION, "max_tokens": 40}
    response = chat(sidecar_service.url, body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    completion = response.json()
    rid = response.headers["x-request-id"]
    assert completion["id"] == f"chatcmpl-{rid}"
    assert completion["object"] == "chat.completion"
    assert completion["model"] == "any-name/v1"
    assert abs(completion["created"] - time.time()) < 60
    assert completion["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": expected.text},
            "logprobs": None,
            "finish_reason": "stop" if expected.eos else "length",
        }
    ]
    usage = completion["usage"]
    line = request_line(sidecar_service, rid)
    after = metrics(sidecar_service.url)
    assert usage["completion_tokens"] == line["generated_tokens"] == len(expected.tokens)
    assert (
        usage["prompt_tokens"] == line["prompt_tokens"] == int(response.headers["x-prompt-tokens"])
    )
    assert usage["prompt_tokens"] == len(reference.prompt_ids(tiny_model_dir, CONVERSATION))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert (line["path"], line["stream"], line["status"]) == (PATH, False, 200)
    assert line["outcome"] == ("eos" if expected.eos else "length")
    outcome = f'sidecar_requests_total{{outcome="{line["outcome"]}"}}'
    assert after[outcome] == before[outcome] + 1
    tokens = after["sidecar_generated_tokens_total"] - before["sidecar_generated_tokens_total"]
    assert tokens == usage["completion_tokens"]
    body = {"messages": CONVERSATION, "max_new_tokens": 40}
    assert predict(sidecar_service.url, body).text == expected.text


def test_the_model_name_defaults_to_the_model_folder(
    sidecar_service: Service, tiny_model_dir: Path
) -> None:
    response = chat(sidecar_service.url, {"messages": user("Hi"), "max_tokens": 2})
    assert response.json()["model"] == tiny_model_dir.name


def test_the_stream_has_the_same_text_and_ends_with_done(
    small_service: Service, small_model_dir: Path
) -> None:
    prompt = reference.long_reply_prompt(small_model_dir, 150)
    body = {"messages": user(prompt), "max_completion_tokens": 150}
    whole = chat(small_service.url, body).json()
    response, chunks = stream(small_service.url, body)
    assert len(chunks) > 4  # the role, several content deltas, the finish
    assert streamed_text(chunks) == whole["choices"][0]["message"]["content"]
    assert streamed_text(chunks) == reference.generate(small_model_dir, user(prompt), 150).text
    assert finish_reason(chunks) == "length"
    assert all("usage" not in chunk for chunk in chunks)
    line = request_line(small_service, response.headers["x-request-id"])
    assert (line["stream"], line["outcome"], line["generated_tokens"]) == (True, "length", 150)


def test_include_usage_adds_a_usage_chunk(sidecar_service: Service) -> None:
    body = {"messages": CONVERSATION, "max_tokens": 30}
    whole = chat(sidecar_service.url, body).json()
    options = {"stream_options": {"include_usage": True}}
    response, chunks = stream(sidecar_service.url, {**body, **options})
    *with_choices, last = chunks
    assert last["choices"] == [] and last["usage"] == whole["usage"]
    assert all(chunk["usage"] is None for chunk in with_choices)
    assert streamed_text(chunks) == whole["choices"][0]["message"]["content"]
    line = request_line(sidecar_service, response.headers["x-request-id"])
    assert last["usage"]["completion_tokens"] == line["generated_tokens"]


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
def test_finish_reason_stop_at_the_end_token_and_length_at_the_limit(
    sidecar_service: Service, tiny_model_dir: Path, streamed: bool
) -> None:
    ended = reference.generate(tiny_model_dir, user(EOS_PROMPT), 32)
    cut = reference.generate(tiny_model_dir, user(LONG_PROMPT), 5)
    assert ended.eos and not cut.eos
    cases = [
        (EOS_PROMPT, {"max_tokens": 32}, "stop", ended),
        (LONG_PROMPT, {"max_tokens": 5}, "length", cut),
    ]
    for prompt, limit, reason, expected in cases:
        body = {"messages": user(prompt), **limit}
        if streamed:
            _, chunks = stream(sidecar_service.url, body)
            assert (streamed_text(chunks), finish_reason(chunks)) == (expected.text, reason)
        else:
            completion = chat(sidecar_service.url, body).json()
            choice = completion["choices"][0]
            assert (choice["message"]["content"], choice["finish_reason"]) == (
                expected.text,
                reason,
            )
            assert completion["usage"]["completion_tokens"] == len(expected.tokens)


def test_text_parts_are_joined_with_newlines(sidecar_service: Service) -> None:
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]
    as_parts = chat(sidecar_service.url, {"messages": [{"role": "user", "content": parts}]})
    as_text = chat(sidecar_service.url, {"messages": user("Hello\nthere")})
    assert as_parts.status_code == 200
    assert as_parts.json()["choices"] == as_text.json()["choices"]
    assert as_parts.json()["usage"] == as_text.json()["usage"]


def test_sampling_options_are_predicts(sidecar_service: Service) -> None:
    options = {"temperature": 1.5, "top_p": 0.9, "top_k": 50, "seed": 7}
    text = predict(
        sidecar_service.url, {"input_text": "Tell me a story.", "max_new_tokens": 30, **options}
    ).text
    body = {"messages": user("Tell me a story."), "max_tokens": 30, **options}
    assert chat(sidecar_service.url, body).json()["choices"][0]["message"]["content"] == text


def test_fields_that_change_nothing_are_accepted(sidecar_service: Service) -> None:
    body = {
        "messages": user("Hi"),
        "max_tokens": 3,
        "n": 1,
        "stop": None,
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "logprobs": False,
        "top_logprobs": None,
        "logit_bias": {},
        "tools": [],
        "tool_choice": "none",
        "response_format": {"type": "text"},
        "store": False,
        "user": "user-1234",
        "stream": False,
    }
    assert chat(sidecar_service.url, body).status_code == 200


HI = user("Hi")
INVALID: dict[str, dict[str, Any]] = {
    "n-2": {"messages": HI, "n": 2},
    "bad-role": {"messages": [{"role": "tool", "content": "Hi"}]},
    "part-with-a-number": {
        "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]
    },
    "stream-not-bool": {"messages": HI, "stream": "true"},
    "stream-options-without-stream": {"messages": HI, "stream_options": {"include_usage": True}},
    "include-usage-not-bool": {
        "messages": HI,
        "stream": True,
        "stream_options": {"include_usage": 1},
    },
    "stop-too-many": {"messages": HI, "stop": ["a", "b", "c", "d", "e"]},
    "logit-bias": {"messages": HI, "logit_bias": {"50256": -100}},
    "presence-penalty": {"messages": HI, "presence_penalty": 0.5},
    "top-logprobs-past-20": {"messages": HI, "logprobs": True, "top_logprobs": 21},
    "tool-choice-names-no-tool": {
        "messages": HI,
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "tool_choice": {"type": "function", "function": {"name": "g"}},
    },
    "json-schema-without-name": {
        "messages": HI,
        "response_format": {"type": "json_schema", "json_schema": {"schema": {}}},
    },
    "unknown-field": {"messages": HI, "max_new_tokens": 5},
    "max-tokens-zero": {"messages": HI, "max_tokens": 0},
    "two-different-limits": {"messages": HI, "max_tokens": 5, "max_completion_tokens": 6},
    "temperature-too-high": {"messages": HI, "temperature": 2.5},
    "no-messages": {"model": "x"},
    "last-not-user": {"messages": [*HI, {"role": "assistant", "content": "Hi"}]},
    "blank-user": {"messages": user("  ")},
    "model-not-a-string": {"messages": HI, "model": 3},
}


@pytest.mark.parametrize("body", INVALID.values(), ids=INVALID.keys())
def test_invalid_requests_are_openais_400(sidecar_service: Service, body: dict[str, Any]) -> None:
    """OpenAI's answer to an invalid field: 400 invalid_request_error with param and code (the
    SDK raises BadRequestError)."""
    response = chat(sidecar_service.url, body)
    message = assert_error(response, 400, "invalid_request_error")
    assert "Hi" not in message  # the input is not echoed
    error = response.json()["error"]
    assert error["code"] == "invalid_value" and "param" in error


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (INVALID["n-2"], "n: "),
        (INVALID["logit-bias"], "logit_bias is not supported"),
        (INVALID["stream-not-bool"], "stream: "),
    ],
    ids=["n", "logit-bias", "stream"],
)
def test_refusals_name_the_reason(
    sidecar_service: Service, body: dict[str, Any], says: str
) -> None:
    response = chat(sidecar_service.url, body)
    assert says in assert_error(response, 400)
    param = says.split(":")[0] if says.endswith(": ") else None
    if param is not None:
        assert response.json()["error"]["param"] == param  # the field, for the SDK


def test_an_audio_part_without_a_speech_model_is_refused_saying_so(
    sidecar_service: Service,
) -> None:
    """An `input_audio` part is transcribed by the speech model (docs/speech.md); this sidecar has
    none, so it is refused with its own type, naming what is missing."""
    audio = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}, audio]}]}
    response = chat(sidecar_service.url, body)
    assert "SPEECH_MODEL_PATH" in assert_error(response, 400, "invalid_request_error")
    assert response.json()["error"]["code"] == "audio_input_unsupported"


def test_the_body_and_context_errors_in_openais_shape(sidecar_service: Service) -> None:
    def code_of(response: httpx.Response, status: int) -> str:
        assert_error(response, status, "invalid_request_error")
        return str(response.json()["error"]["code"])

    url = sidecar_service.url + PATH
    cut = b'{"messages": '
    post = httpx.post(url, content=cut, headers={"content-type": "application/json"})
    assert code_of(post, 400) == "invalid_json"
    text = httpx.post(url, content=b"{}", headers={"content-type": "text/plain"})
    assert code_of(text, 415) == "unsupported_media_type"
    big = {"messages": user("x" * 100_000)}
    assert code_of(chat(sidecar_service.url, big), 413) == "request_too_large"
    # A context overflow is OpenAI's 400 context_length_exceeded (the SDK's BadRequestError).
    response = chat(sidecar_service.url, {"messages": user("tell me more " * 3000)})
    assert code_of(response, 400) == "context_length_exceeded"
    assert response.json()["error"]["param"] is None
    assert response.json()["error"]["limit_tokens"] == 4096
    assert code_of(httpx.get(url, timeout=10), 405) == "method_not_allowed"


def test_not_ready_is_503_with_retry_after(tmp_path: Path) -> None:
    with services.sidecar(tmp_path / "no-model", tmp_path / "sidecar.log", wait=False) as service:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(service.url + "/readyz", timeout=10).json()["phase"] == "failed":
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, service.log()
            time.sleep(0.05)
        for streamed in (False, True):
            response = chat(service.url, {"messages": HI, "stream": streamed})
            assert "is not a folder" in assert_error(response, 503, "server_error")
            assert response.json()["error"]["code"] == "model_not_ready"
            assert int(response.headers["retry-after"]) > 0


def test_a_disconnect_mid_stream_stops_the_generation_within_one_token(
    paced_small_service: Service, small_model_dir: Path
) -> None:
    service = paced_small_service  # 50 ms a token: see tests/sidecar/conftest.py
    prompt = reference.long_reply_prompt(small_model_dir, 300)
    body = {"messages": user(prompt), "max_tokens": 3000, "stream": True}
    with httpx.stream("POST", service.url + PATH, json=body, timeout=60) as response:
        rid = response.headers["x-request-id"]
        events = 0
        for line in response.iter_lines():
            events += line.startswith("data: ")
            if events >= 5:
                break  # leaving the block closes the connection
    logged = request_line(service, rid)
    assert (logged["outcome"], logged["stream"]) == ("cancelled", True)
    assert logged["tokens_after_disconnect"] <= 1
    assert logged["generated_tokens"] < 300


def test_a_disconnect_while_waiting_for_the_whole_reply_stops_it_too(
    paced_small_service: Service, small_model_dir: Path
) -> None:
    service = paced_small_service  # 50 ms a token: see tests/sidecar/conftest.py
    prompt = reference.long_reply_prompt(small_model_dir, 300)
    body = json.dumps({"messages": user(prompt), "max_tokens": 3000}).encode()
    host, port = service.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"X-Request-Id: whole-then-gone\r\nContent-Length: %d\r\n\r\n%s"
            % (PATH.encode(), len(body), body)
        )
        deadline = time.monotonic() + 30
        while metrics(service.url)["sidecar_active_generations"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    line = request_line(service, "whole-then-gone")
    assert (line["outcome"], line["stream"]) == ("cancelled", False)
    assert line["tokens_after_disconnect"] <= 1
    assert line["generated_tokens"] < 300
    assert metrics(service.url)["sidecar_active_generations"] == 0


def test_an_error_after_the_first_byte_aborts_the_stream(faulty_service: Service) -> None:
    body = {"messages": user(f"{RAISE} Tell me a story."), "stream": True}
    received = b""
    broken = pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read")
    with httpx.stream("POST", faulty_service.url + PATH, json=body, timeout=60) as response, broken:
        for chunk in response.iter_raw():
            received += chunk
    assert response.status_code == 200
    assert received.startswith(b"data: ")  # the role chunk went out before the error
    assert b"[DONE]" not in received and b'finish_reason":"' not in received
    assert SECRET.encode() not in received
    line = request_line(faulty_service, response.headers["x-request-id"])
    assert (line["status"], line["outcome"], line["stream"]) == (200, "error", True)
    assert chat(faulty_service.url, {"messages": HI, "stream": True}).status_code == 200


def test_a_failed_generation_without_stream_is_a_500(faulty_service: Service) -> None:
    response = chat(faulty_service.url, {"messages": user(f"{RAISE} Tell me a story.")})
    message = assert_error(response, 500, "server_error")
    assert SECRET not in response.text and "see the log" in message
    line = request_line(faulty_service, response.headers["x-request-id"])
    assert (line["status"], line["outcome"], line["error_type"]) == (500, "error", "internal_error")
    assert chat(faulty_service.url, {"messages": HI}).status_code == 200


def test_the_model_list_names_the_served_model(
    sidecar_service: Service, tiny_model_dir: Path
) -> None:
    listed = httpx.get(sidecar_service.url + "/v1/models", timeout=10)
    assert listed.status_code == 200
    assert listed.json()["object"] == "list"
    (model,) = listed.json()["data"]
    assert model["id"] == tiny_model_dir.name and model["object"] == "model"
    assert isinstance(model["created"], int) and model["created"] > 0
    one = httpx.get(f"{sidecar_service.url}/v1/models/{model['id']}", timeout=10)
    assert one.status_code == 200 and one.json() == model
    ready = httpx.get(sidecar_service.url + "/readyz", timeout=10).json()
    assert ready["model"] == model["id"]


def test_an_unknown_model_id_is_404(sidecar_service: Service) -> None:
    response = httpx.get(sidecar_service.url + "/v1/models/gpt-4o", timeout=10)
    assert response.status_code == 404
    assert "gpt-4o" in response.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("model", ["\ud800", "m" * 60_000], ids=["surrogate", "60kb"])
def test_a_bad_model_name_is_a_clean_400_counted_as_rejected(
    sidecar_service: Service, model: str, stream: bool
) -> None:
    # A lone surrogate answered 500 (counted as a success) or an empty streamed 200; a 60 KB
    # name was echoed into every chunk (issue 25).
    before = metrics(sidecar_service.url)
    body = json.dumps({"messages": HI, "model": model, "stream": stream, "max_tokens": 4})
    response = httpx.post(
        sidecar_service.url + PATH,
        content=body,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert_error(response, 400, "invalid_request_error")
    error = response.json()["error"]
    assert error["param"] == "model" and error["code"] == "invalid_value"
    after = metrics(sidecar_service.url)
    outcomes = [key for key in after if key.startswith("sidecar_requests_total{")]
    changed = {key: after[key] - before.get(key, 0) for key in outcomes}
    assert {key: n for key, n in changed.items() if n} == {
        'sidecar_requests_total{outcome="rejected"}': 1.0
    }
