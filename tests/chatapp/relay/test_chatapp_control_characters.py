"""Control characters in replies (issue 38, finding 8): a model, or an OpenAI-compatible
upstream, that writes ESC used to end the chat, since every later turn carried the reply back
and was refused 400 "Message 2 contains control characters". The app now makes them visible in
every reply, whichever upstream it reads (chatapp.relay.upstream), and in the assistant turns it is
sent back (chatapp.relay.wire), so such a chat goes on. The real sidecar's side: tests/e2e."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask

from chatapp.relay import wire
from tests.chatapp import fake_sidecar as fs
from tests.chatapp.fake_sidecar import FakeSidecar, chunk, sse

# What a model can write: a terminal colour (ESC), NUL, a bell, DEL, a C1 control (NEL), and the
# white space that stays.
RAW = ["Colours: \x1b[31mred", "\x1b[0m, nul \x00, bell \x07, del \x7f", ", nel \x85,\ttab\nnew\r"]
SHOWN = "Colours: ␛[31mred␛[0m, nul ␀, bell ␇, del ␡, nel \ufffd,\ttab\nnew\r"


def relayed(make_app: Callable[..., Flask], mode: str, body: dict[str, Any]) -> list[Any]:
    response = make_app(UPSTREAM_API=mode).test_client().post("/chat", json=body)
    assert response.status_code == 200, response.get_data()
    return list(fs.ndjson(response.get_data()))


def text_of(lines: list[dict[str, Any]]) -> str:
    return "".join(line.get("delta", "") for line in lines)


def answer(mode: str, texts: list[str]) -> Callable[[fs.Handler], None]:
    """The fake model service's reply in the upstream's own format."""
    if mode == "predict":
        return lambda h: fs.reply(h, texts)
    return lambda h: sse(h, [*(chunk(text) for text in texts), chunk(finish="stop")])


HELLO = {"messages": [{"role": "user", "content": "Hello"}]}


@pytest.mark.parametrize("mode", ["predict", "openai"])
def test_control_characters_in_a_reply_are_made_visible(
    make_app: Callable[..., Flask], fake: FakeSidecar, mode: str
) -> None:
    fake.predict = answer(mode, RAW)
    lines = relayed(make_app, mode, HELLO)
    assert text_of(lines) == SHOWN
    assert lines[-1]["done"] is True
    assert not any(wire.FORBIDDEN_CHARS.search(line.get("delta", "")) for line in lines)


def test_a_surrogate_pair_split_between_two_chunks_is_one_character(
    make_app: Callable[..., Flask], fake: FakeSidecar
) -> None:
    """A server that escapes a pair (JSON \\ud83d\\ude00) and splits it between two chunks: the
    two halves become the character; a half alone becomes U+FFFD. Before, a lone half could not
    be encoded, and the reply broke off there."""
    data = [
        b'{"choices": [{"index": 0, "delta": {"content": "smile \\ud83d"}}]}',
        b'{"choices": [{"index": 0, "delta": {"content": "\\ude00, half \\ud800"}}]}',
        b'{"choices": [{"index": 0, "delta": {"content": "!"}, "finish_reason": "stop"}]}',
    ]
    fake.predict = lambda h: sse(h, data)
    lines = relayed(make_app, "openai", HELLO)
    assert text_of(lines) == "smile \U0001f600, half \ufffd!"
    assert lines[-1]["done"] is True


@pytest.mark.parametrize("mode", ["predict", "openai"])
def test_a_chat_whose_reply_held_control_characters_goes_on(
    make_app: Callable[..., Flask], fake: FakeSidecar, mode: str
) -> None:
    """The assistant turn the page sends back, stored with raw control characters (by the app
    before this change, or by another client), is made visible, not refused."""
    fake.predict = answer(mode, ["Go on."])
    messages = [
        {"role": "user", "content": "Colour?"},
        {"role": "assistant", "content": "".join(RAW)},
        {"role": "user", "content": "And then?"},
    ]
    lines = relayed(make_app, mode, {"messages": messages})
    assert text_of(lines) == "Go on." and lines[-1]["done"] is True
    sent = fake.requests[0]["messages"]
    assert [m["content"] for m in sent] == ["Colour?", SHOWN, "And then?"]
    assert b"\\u001b" not in fake.raw_bodies[0]  # nothing for the model service to refuse


@pytest.mark.parametrize("role", ["system", "user"])
@pytest.mark.parametrize("char", ["\x1b", "\x00", "\x7f", "\x85", "\ud800"])
def test_control_characters_in_the_persons_turns_are_still_refused(
    make_app: Callable[..., Flask], fake: FakeSidecar, role: str, char: str
) -> None:
    messages = [{"role": role, "content": f"typed {char}"}]
    if role == "system":
        messages.append({"role": "user", "content": "Hello"})
    body = json.dumps({"messages": messages}).encode()  # \ud800 as JSON writes it
    response = make_app().test_client().post("/chat", data=body, content_type="application/json")
    assert response.status_code == 400
    assert response.get_json() == {
        "error": {
            "message": "Message 1 contains control characters; remove them.",
            "type": "invalid_request",
        }
    }
    assert fake.requests == []


def test_visible_keeps_what_is_allowed_and_pictures_the_rest() -> None:
    assert wire.visible("plain é 你好 \U0001f600\t\n\r") == "plain é 你好 \U0001f600\t\n\r"
    assert wire.visible("".join(chr(c) for c in range(0x20) if c not in (9, 10, 13))) == "".join(
        chr(0x2400 + c) for c in range(0x20) if c not in (9, 10, 13)
    )
    assert wire.visible("\x7f\x80\x9f") == "\u2421\ufffd\ufffd"
    assert wire.visible("\ud83d\ude00 \udc00\ud800") == "\U0001f600 \ufffd\ufffd"
