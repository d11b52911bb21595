"""The contracts the two services share, checked equal in one place.

The sidecar and the chat app ship as separate images and import nothing from each other, so
a rule they must agree on exists twice, deliberately. This module is what keeps each pair
equal: change one side and this fails until the other side follows.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

from chatapp import settings as app_settings
from chatapp.errors import ApiError
from chatapp.guards import host as app_host
from chatapp.observability import logs as app_logs
from chatapp.observability import telemetry as app_telemetry
from chatapp.relay import upstream as app_upstream
from chatapp.relay import upstream_predict as app_upstream_predict
from chatapp.relay import wire as app_wire
from sidecar import ipc
from sidecar import jsonlog as sidecar_jsonlog
from sidecar.settings import Settings
from sidecar.web import errors as sidecar_errors
from sidecar.web.generation import messages as sidecar_messages
from sidecar.web.guards import access as sidecar_access
from sidecar.web.observability import request_log as sidecar_request_log


def test_request_id_rule_is_the_same() -> None:
    assert app_logs.REQUEST_ID.pattern == sidecar_request_log.REQUEST_ID.pattern
    for candidate in ("abc-123", "a" * 64, "a" * 65, "with space", "ünïcode", "x\n", ""):
        assert bool(app_logs.REQUEST_ID.fullmatch(candidate)) == bool(
            sidecar_request_log.REQUEST_ID.fullmatch(candidate)
        ), candidate


def test_forbidden_characters_are_the_same() -> None:
    assert app_wire.FORBIDDEN_CHARS.pattern == sidecar_messages.FORBIDDEN_CHARS.pattern
    for code in range(0x110000):
        char = chr(code)
        if bool(app_wire.FORBIDDEN_CHARS.search(char)) != bool(
            sidecar_messages.FORBIDDEN_CHARS.search(char)
        ):
            pytest.fail(f"U+{code:04X} is judged differently")


def test_what_the_app_forwards_the_sidecar_accepts() -> None:
    """The app refuses what the sidecar refuses in system and user turns, and makes it visible
    in assistant turns (the replies the page sends back, which nobody can edit): either way,
    the sidecar never receives a character its rule refuses."""
    forbidden = [chr(c) for c in range(0x110000) if sidecar_messages.FORBIDDEN_CHARS.search(chr(c))]
    assert len(forbidden) == 29 + 1 + 32 + 2048  # C0 but 3, DEL, C1, surrogates
    reply = "".join(forbidden)
    body = {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "Go on"},
        ]
    }
    forwarded = app_wire.parse_chat_request(body, max_messages=10)["messages"]
    assert forwarded[1]["content"] != reply
    for message in forwarded:
        sidecar_messages.ChatMessage.model_validate(message)  # raises if refused
    with pytest.raises(ValidationError):
        sidecar_messages.ChatMessage.model_validate({"role": "assistant", "content": reply})
    for char in forbidden[::31]:
        for role in ("system", "user"):
            message = {"role": role, "content": f"typed {char}"}
            with pytest.raises(ApiError, match="control characters"):
                turns = [message, {"role": "user", "content": "x"}]
                app_wire.parse_chat_request({"messages": turns}, max_messages=10)
            with pytest.raises(ValidationError):
                sidecar_messages.ChatMessage.model_validate(message)


def test_roles_are_the_same() -> None:
    assert set(app_wire.ROLES) == set(get_args(ipc.Role))


def test_the_greedy_temperature_floor_is_the_same() -> None:
    """/chat sends a temperature below it as 0; the sidecar treats one below it as greedy."""
    assert app_wire.MIN_TEMPERATURE == ipc.MIN_TEMPERATURE


@pytest.mark.parametrize(
    "fields", [None, {"request_id": "r1", "status": 200, "ratio": 0.5, "text": "é — 你好"}]
)
def test_log_lines_have_the_same_shape(fields: dict[str, object] | None) -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    for info in (None, exc_info):
        record = logging.LogRecord("x.y", logging.WARNING, __file__, 1, "msg %s", ("a",), info)
        record.created = 1_700_000_000.123
        if fields is not None:
            record.fields = fields
        app_line = app_logs.JsonFormatter().format(record)
        sidecar_line = sidecar_jsonlog.JsonFormatter().format(record)
        assert app_line == sidecar_line


def test_the_app_understands_every_error_type_it_branches_on() -> None:
    """The app tells loading from failed from busy by the sidecar's error type and phase
    (upstream_predict.py reads the type, upstream.py's not_ready the phase)."""
    sidecar_types = {answer.type for answer in sidecar_errors.REFUSALS.values()}
    source = " ".join(
        re.sub(r"\s+", " ", Path(path).read_text(encoding="utf-8"))
        for path in (app_upstream_predict.__file__, app_upstream.__file__)
    )
    branched_on = set(re.findall(r'type == "(\w+)"', source))
    assert branched_on and branched_on <= sidecar_types
    phases = set(re.findall(r'phase == "(\w+)"', source))
    assert phases and phases <= set(get_args(ipc.PhaseName))


def test_the_app_never_sends_more_than_the_sidecar_accepts() -> None:
    assert (
        app_settings.DEFAULTS["MAX_CONTENT_LENGTH"]
        <= Settings.model_fields["max_body_bytes"].default
    )
    assert app_settings.DEFAULTS["MAX_MESSAGES"] <= sidecar_messages.MAX_MESSAGES
    # Images: the page checks the app's limits; an image they let through the sidecar takes
    assert app_settings.DEFAULTS["MAX_IMAGES"] <= Settings.model_fields["max_images"].default
    sidecar_bytes = Settings.model_fields["max_image_bytes"].default
    assert app_settings.DEFAULTS["MAX_IMAGE_BYTES"] <= sidecar_bytes


TRACING_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "TRACES_FILE",
    "OTEL_SERVICE_NAME",
    "OTEL_SDK_DISABLED",
)


def test_both_services_read_the_same_trace_settings(tmp_path: Path) -> None:
    """One set of variables for the pair: the same names, the same destinations, the same
    accepted protocol, the same kill switch."""
    sidecar_fields = {name.upper() for name in Settings.model_fields}
    assert set(TRACING_VARIABLES) <= sidecar_fields
    assert set(TRACING_VARIABLES) <= set(app_settings.DEFAULTS)
    assert (
        Settings.model_fields["otel_exporter_otlp_protocol"].default
        == app_settings.DEFAULTS["OTEL_EXPORTER_OTLP_PROTOCOL"]
    )
    environ = {"TRACES_FILE": str(tmp_path / "t.jsonl")}
    off = {**environ, "OTEL_SDK_DISABLED": "true"}

    def sidecar(variables: dict[str, str]) -> Settings:
        return Settings.model_validate(
            {"model_path": tmp_path, **{k.lower(): v for k, v in variables.items()}}
        )

    def app_exporters(variables: dict[str, str]) -> int:
        config = {**app_settings.DEFAULTS, **app_settings.from_environ(variables)}
        exporters = app_telemetry.span_exporters(config)
        for exporter in exporters:
            exporter.shutdown()
        return len(exporters)

    assert sidecar(environ).tracing and app_exporters(environ) == 1
    assert not sidecar(off).tracing and app_exporters(off) == 0
    for bad in ("grpc", "http/json"):
        with pytest.raises(ValueError):
            sidecar({"OTEL_EXPORTER_OTLP_PROTOCOL": bad})
        with pytest.raises(app_settings.SettingsError):
            app_settings.from_environ({"OTEL_EXPORTER_OTLP_PROTOCOL": bad})


@pytest.mark.parametrize("shown", [False, True])
def test_logged_exceptions_keep_their_messages_out_alike(shown: bool) -> None:
    """Both services log an exception's type and frames, not its message (it may quote a
    prompt); the sidecar's model worker shows messages with LOG_PROMPTS only."""
    quoted = "the prompt was: door code 7431"  # a variable: the raise lines are logged
    try:
        try:
            raise KeyError(quoted)
        except KeyError:
            raise ValueError(quoted) from None
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("x.y", logging.ERROR, __file__, 1, "failed", (), exc_info)
    sidecar_line = sidecar_jsonlog.JsonFormatter(exception_messages=shown).format(record)
    assert ("door code" in sidecar_line) is shown
    assert "ValueError" in sidecar_line and "KeyError" not in sidecar_line  # from None
    if not shown:
        assert app_logs.JsonFormatter().format(record) == sidecar_line


def test_a_long_word_is_counted_alike() -> None:
    """Issue 58: the sidecar reads a word longer than WordPiece's longest as its pieces (not
    one [UNK]) and counts them against the encoder's limit; the app measures passages by the
    same rule, or a passage it measured as fitting would be refused as too long."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from chatapp.documents.reading import tokens as app_tokens
    from sidecar.embeddings import encoder as sidecar_encoder

    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["[UNK]", "hello", "world", ".", *letters, *("##" + c for c in letters)]

    def wordpiece() -> Tokenizer:
        ids = {token: i for i, token in enumerate(vocab)}
        tokenizer = Tokenizer(models.WordPiece(ids, unk_token="[UNK]", max_input_chars_per_word=10))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        return tokenizer

    app, sidecar = wordpiece(), wordpiece()
    app_tokens.split_long_words(app)
    sidecar_encoder.split_long_words(sidecar)
    for text in ("hello world.", "x" * 25, "hello " + "ab" * 12 + ". world", "É" * 11, "x" * 10):
        assert app.encode(text).ids == sidecar.encode(text).ids, text
    assert sidecar.encode("x" * 25).tokens == (["x"] + ["##x"] * 9) * 2 + ["x"] + ["##x"] * 4
    assert wordpiece().encode("x" * 25).ids == [0]  # without the rule: one [UNK]
    bpe, plain = Tokenizer(models.BPE()), Tokenizer(models.BPE())
    app_tokens.split_long_words(bpe)
    sidecar_encoder.split_long_words(plain)
    assert bpe.pre_tokenizer is None and plain.pre_tokenizer is None  # left as they are


def test_an_encoder_s_prompts_are_read_and_named_alike(tmp_path: Path) -> None:
    """Issue 55: the sidecar writes the folder's prompt named by `input_type`; the app, which
    sends the names, sizes passages and questions by those prompts (read from the same folder
    with EMBED_TOKENIZER): the names and the reading must agree."""
    import json

    from chatapp.documents import embedder as app_embedder
    from chatapp.documents.reading import tokens as app_tokens
    from sidecar.embeddings import folder as sidecar_folder
    from sidecar.web.embeddings import api as sidecar_embeddings

    sidecar_names = get_args(sidecar_embeddings.InputType)
    assert set(sidecar_names) == set(get_args(app_embedder.InputType))
    assert set(app_tokens.PROMPT_KINDS) == set(sidecar_names)
    prompts = {"query": "query: ", "passage": "passage: ", "classification": "c: ", "empty": ""}
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts}))
    read = sidecar_folder._prompts(tmp_path)
    assert app_tokens.encoder_prompts(tmp_path) == {
        name: text for name, text in read.items() if name in sidecar_names
    }


def test_both_services_answer_host_names_alike() -> None:
    """Issue 58: both answer only the loopback names by default (DNS rebinding), any name on
    their probes, and match a list the same way."""
    assert app_host.HOST.pattern == sidecar_access.HOST.pattern
    assert app_host.PROBES == sidecar_access.PROBES
    assert Settings().allowed_host_patterns == app_host.LOOPBACK
    lists = [app_host.LOOPBACK, ("*.example.com", "chat.example.org"), ("*",)]
    hosts = ["localhost:8080", "[::1]", "127.0.0.1.nip.io", "a.example.com", "example.com"]
    hosts += ["evil.com#.example.com", "CHAT.example.org:443", "chat.example.org.", "", "x y"]
    for patterns in lists:
        for host in hosts:
            app = app_host.host_allowed(host, patterns)
            assert app == sidecar_access.host_allowed(host.encode(), patterns), (host, patterns)
