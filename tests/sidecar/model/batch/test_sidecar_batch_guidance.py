"""Structured output and tool calls on the batched path (model/batch/guidance.py), on the real
tiny model: every kind of grammar is followed without loading onnxruntime-genai's model (the
second copy of the weights), greedy guided replies are the Generator path's, guided and
unguided users decode together and every guided reply validates, a grammar that cannot be
built is the Generator path's 400, a guided reply may continue a cached prefix, and a tokenizer
llguidance cannot read sends guided requests to a Generator. And, token by token through the
matcher the worker uses, what a grammar let the model write that did not validate (issue 38),
and that now it cannot, or the finished reply is not reported as valid."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema_rs
import llguidance
import numpy as np
import pytest
from pydantic import ValidationError

from scripts.run import services
from scripts.run.services import Service
from sidecar.ipc import Generate, Guidance
from sidecar.model.batch.guidance import Grammars
from sidecar.model.batch.row import BatchGeneration
from sidecar.model.engine import Engine, Generation
from sidecar.model.guidance import GuidanceRefused
from sidecar.web.chat_completions.tools import JsonSchemaSpec, ToolSpec
from sidecar.web.structured.guidance import for_request, meant, prepared
from sidecar.web.structured.reply_check import ReplyCheck, validator

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "London", "Tokyo"]},
        "code": {"type": "string", "pattern": "[A-Z]{2}[0-9]{2}"},
        "temperature": {"type": "integer", "minimum": -30, "maximum": 45},
    },
    "required": ["city", "code", "temperature"],
    "additionalProperties": False,
}
GUIDED = Guidance("json_schema", json.dumps(prepared(SCHEMA)))
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]
LOADED_GENERATOR = "loading the Generator's model"
QUESTIONS = ["Weather in Paris?", "And in Tokyo, tomorrow?", "Describe London in one line."]


# -- the engine ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Engine:
    engine = Engine(
        tiny_model_dir,
        prompt_cache_mb=64,
        prefill_chunk=16,
        decode_batch_rows=4,
        max_concurrency=4,
    )
    engine.warm_up()
    return engine


def request(question: str, guidance: Guidance | None, **extra: Any) -> Generate:
    messages = extra.pop("messages", (("user", question),))
    return Generate("test", messages, 120, guidance=guidance, **extra)


def run_together(engine: Engine, generations: list[Any]) -> list[str]:
    """Step the batch until every generation is over, releasing each as the worker does."""
    assert engine.batch is not None
    texts = {id(g): "" for g in generations}
    live = set(texts)
    while live:
        for generation, text in engine.batch.step():
            texts[id(generation)] += text or ""
            if generation.finish is not None and id(generation) in live:
                live.discard(id(generation))
                generation.release(reusable=generation.finish != "error")
    return [texts[id(g)] for g in generations]


def test_every_kind_of_grammar_is_followed_without_the_generators_model(engine: Engine) -> None:
    lark = Guidance("lark_grammar", 'start: "yes" | "no" | "maybe"')
    regex = Guidance("regex", "[a-z]{2,6} [0-9]{1,3}")
    kinds = [GUIDED, lark, regex, None]
    generations = [
        engine.start(request(q, g)) for q, g in zip(QUESTIONS[:2] * 2, kinds, strict=True)
    ]
    assert all(isinstance(g, BatchGeneration) for g in generations)
    texts = run_together(engine, generations)
    jsonschema_rs.validate(SCHEMA, json.loads(texts[0]))
    assert re.fullmatch("[A-Z]{2}[0-9]{2}", json.loads(texts[0])["code"])
    assert texts[1] in ("yes", "no", "maybe")
    assert re.fullmatch("[a-z]{2,6} [0-9]{1,3}", texts[2]), texts[2]
    # A complete grammar ends the reply as an end token would, counted as the Generator does
    assert all(g.finish == "eos" for g in generations[:2])
    assert not engine.generators.loaded  # onnxruntime-genai's model never loaded


def tool_grammar(choice: Literal["auto", "required", "none"]) -> Guidance:
    guidance = for_request(None, [ToolSpec.model_validate(TOOLS[0])], choice, False)
    assert guidance is not None
    return guidance


# Each kind, the tool grammars (a Lark grammar over the call protocol), forced tokens on and off
GRAMMARS = {
    "json-schema": GUIDED,
    "json-schema-step-by-step": replace(GUIDED, ff_tokens=False),
    "regex": Guidance("regex", "[a-z]{2,6} [0-9]{1,3}"),
    "lark": Guidance("lark_grammar", 'start: "yes" | "no" | "maybe"'),
    "tools-auto": tool_grammar("auto"),
    "tools-required": tool_grammar("required"),
    "tools-none": tool_grammar("none"),
}


def greedy(engine: Engine, guidance: Guidance, question: str) -> tuple[str, str | None, int]:
    generation = engine.start(request(question, guidance), cached=False)
    text = ""
    while generation.finish is None:
        text += generation.step() or ""
    generation.release(reusable=False)
    return text, generation.finish, generation.generated


@pytest.fixture(scope="module")
def generator_engine(tiny_model_dir: Path) -> Engine:
    return Engine(tiny_model_dir, prefill_chunk=16)


@pytest.mark.parametrize("guidance", GRAMMARS.values(), ids=GRAMMARS.keys())
def test_greedy_guided_replies_are_the_generators(
    engine: Engine, generator_engine: Engine, guidance: Guidance
) -> None:
    """Text, finish and token count, forced tokens taken one per step or not."""
    for question in QUESTIONS:
        assert greedy(engine, guidance, question) == greedy(generator_engine, guidance, question)


def model_calls(engine: Engine, guidance: Guidance, question: str) -> tuple[Any, int]:
    """A greedy guided reply alone (greedy()) and the model calls it made after its prompt:
    the batched decoder's calls, or the Generator's steps (one model call each)."""
    if engine.batch is None:
        steps = 0
        generation = engine.start(request(question, guidance), cached=False)
        text = ""
        while generation.finish is None:
            piece = generation.step()
            steps += piece is not None
            text += piece or ""
        generation.release(reusable=False)
        # The first token comes from the prompt's last call (no call of its own)
        return (text, generation.finish, generation.generated), steps - 1
    decoder = engine.batch.decoder
    calls: list[int] = []
    run = decoder.run

    def counted(first: int, ids: np.ndarray, lengths: Any, **kwargs: Any) -> np.ndarray:
        calls.append(ids.shape[1])
        return run(first, ids, lengths, **kwargs)

    decoder.run = counted  # type: ignore[method-assign]
    try:
        reply = greedy(engine, guidance, question)
    finally:
        del decoder.run
    prompt_calls = -(
        -len(engine.prompts.fit(request(question, guidance).messages, 120, engine.max_length).ids)
        // engine.prefill_chunk
    )
    return reply, len(calls) - prompt_calls


@pytest.mark.parametrize("guidance", GRAMMARS.values(), ids=GRAMMARS.keys())
def test_forced_runs_are_read_in_one_call_as_on_the_generator_path(
    engine: Engine, generator_engine: Engine, guidance: Guidance
) -> None:
    """A grammar's forced tokens (a JSON reply's keys and punctuation, a tool call's opening)
    are read in one call: no more model calls than the Generator path makes, the same reply."""
    batched, calls = model_calls(engine, guidance, QUESTIONS[0])
    generator, steps = model_calls(generator_engine, guidance, QUESTIONS[0])
    assert batched == generator
    assert calls <= steps


def test_beside_other_replies_forced_tokens_ride_in_their_call(engine: Engine) -> None:
    """Beside replies that decode, a guided reply reads its forced tokens one a step in the
    batch's own call (batch.step._fed): the others lose no step to a call of its own;
    its reply is the one it makes alone."""
    assert engine.batch is not None
    alone = greedy(engine, GUIDED, QUESTIONS[0])[0]
    decoder = engine.batch.decoder
    fed: list[list[int]] = []  # the ids of every call that read more than one token
    run = decoder.run

    def counted(first: int, ids: np.ndarray, lengths: Any, **kwargs: Any) -> np.ndarray:
        fed.extend(row.tolist() for row in ids if ids.shape[1] > 1)
        return run(first, ids, lengths, **kwargs)

    questions = [*QUESTIONS, QUESTIONS[0]]
    prompts = [
        engine.prompts.fit(request(q, None).messages, 120, engine.max_length).ids for q in questions
    ]
    decoder.run = counted  # type: ignore[method-assign]
    try:
        others = [
            engine.start(request(q, None, min_new_tokens=100), cached=False) for q in QUESTIONS
        ]
        while any(g not in engine.batch.decoding for g in others):  # the others decode first
            engine.batch.step()
        guided = engine.start(request(QUESTIONS[0], GUIDED), cached=False)
        texts = run_together(engine, [guided, *others])
    finally:
        del decoder.run
    assert texts[0] == alone
    # Every call that read several tokens read a prompt's chunk, never a forced run
    assert fed and all(
        any(prompt[i : i + len(ids)] == ids for prompt in prompts for i in range(len(prompt)))
        for ids in fed
    )


def test_forced_tokens_off_take_a_call_each(engine: Engine) -> None:
    forced, calls = model_calls(engine, GUIDED, QUESTIONS[0])
    one_by_one, calls_off = model_calls(engine, replace(GUIDED, ff_tokens=False), QUESTIONS[0])
    assert one_by_one == forced
    assert calls_off == forced[2] - 2  # every token but the first and the end: a call each
    assert 4 * calls < calls_off  # 6 against 38 on the tiny model


def test_sampled_guided_replies_validate(engine: Engine) -> None:
    generations = [
        engine.start(request(q, GUIDED, temperature=1.0, top_p=0.95, seed=seed))
        for seed, q in enumerate(QUESTIONS)
    ]
    for text in run_together(engine, generations):
        jsonschema_rs.validate(SCHEMA, json.loads(text))
    assert not engine.generators.loaded


@pytest.mark.parametrize(
    "guidance",
    [
        Guidance("json_schema", '{"type": "objectx"}'),
        Guidance("json_schema", '{"type": "string", "pattern": "(("}'),
        Guidance("json_schema", "not json"),
        Guidance("lark_grammar", "start: nothing_defined"),
        Guidance("regex", "(("),
    ],
    ids=["unknown-type", "bad-pattern", "not-json", "undefined-rule", "bad-regex"],
)
def test_a_grammar_that_cannot_be_built_is_refused_and_takes_no_slot(
    engine: Engine, guidance: Guidance
) -> None:
    assert engine.batch is not None
    with pytest.raises(GuidanceRefused) as refused:
        engine.start(request(QUESTIONS[0], guidance, cache_scope="refused"))
    assert str(refused.value) and "\n" not in str(refused.value)
    assert not engine.batch.busy
    assert not any(entry.lent for entry in engine.batch.cache.entries)


def test_a_guided_reply_continues_a_cached_prefix_and_its_grammar_holds(engine: Engine) -> None:
    """Unlike the Generator path (whose grammar lives in its generator), a slot holds only
    K/V: a guided turn may continue what an unguided one left, and the reverse."""
    scope = "guided-batch-cache"
    history = " ".join(QUESTIONS * 3)  # long enough for whole prefill chunks to be reused
    first = engine.start(request(history, None, cache_scope=scope))
    (text,) = run_together(engine, [first])
    turn = (("user", history), ("assistant", text), ("user", "And tomorrow?"))
    guided = engine.start(request("", GUIDED, messages=turn, cache_scope=scope))
    assert guided.cached_tokens > 0
    (reply,) = run_together(engine, [guided])
    jsonschema_rs.validate(SCHEMA, json.loads(reply))
    again = engine.start(request("", None, messages=turn, cache_scope=scope))
    assert again.cached_tokens > 0
    run_together(engine, [again])


def test_a_mask_that_leaves_nothing_is_no_token(tiny_model_dir: Path, engine: Engine) -> None:
    grammars = engine.grammars
    assert grammars is not None and grammars.unavailable is None
    guide = grammars.matcher(Guidance("regex", "ab"))
    logits = np.zeros(grammars.vocab_size, dtype=np.float32)
    allowed = guide.masked(logits)
    assert allowed is not None
    only = np.flatnonzero(np.isfinite(allowed))
    assert guide.masked(logits, banned=only.tolist()) is None  # e.g. an end token banned


def test_a_tokenizer_llguidance_cannot_read_sends_guided_requests_to_a_generator(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "tokenizer.json"
    broken.write_text('{"model": {"type": "nothing"}}')
    grammars = Grammars(broken, 0, 0)
    assert grammars.unavailable
    engine = Engine(tiny_model_dir, prefill_chunk=16, decode_batch_rows=4, max_concurrency=4)
    engine.grammars = grammars  # the folder's tokenizer.json reads fine: this one does not
    guided = engine.start(request(QUESTIONS[0], GUIDED))
    assert isinstance(guided, Generation)  # onnxruntime-genai's own llguidance serves it
    plain = engine.start(request(QUESTIONS[0], None))
    assert isinstance(plain, BatchGeneration)
    plain.release(reusable=False)
    text = ""
    while guided.finish is None:
        text += guided.step() or ""
    guided.release(reusable=False)
    jsonschema_rs.validate(SCHEMA, json.loads(text))


# -- what a grammar allowed that did not validate, and now ----------------------------------


def as_before(schema: dict[str, Any]) -> Guidance:
    """The grammar a json_schema request got before issue 38: the schema as sent (bounds as
    they were), compact, with the client's own x-guidance merged in."""
    own = schema.get("x-guidance", {})
    return Guidance(
        "json_schema", json.dumps(schema | {"x-guidance": {"whitespace_flexible": False} | own})
    )


@dataclass(frozen=True)
class Matching:
    """The tiny model's grammars (the worker's), its tokenizer and its end token."""

    grammars: Grammars
    tokenizer: llguidance.LLTokenizer
    eos_token: int


def allows(model: Matching, guidance: Guidance, text: str) -> bool:
    """Whether the worker's matcher lets a reply be `text`, tokenized by the model's own
    tokenizer, and then end: each token consumed as the batched path does, the end token in
    the last mask."""
    grammars = model.grammars
    tokens = model.tokenizer.tokenize_bytes(text.encode())
    guide = grammars.matcher(guidance)
    logits = np.zeros(grammars.vocab_size, dtype=np.float32)
    for token in tokens:
        allowed = guide.masked(logits)
        if allowed is None or not np.isfinite(allowed[token]) or not guide.consume(token):
            return False
    if guide.stopped:
        return True
    allowed = guide.masked(logits)
    return allowed is not None and bool(np.isfinite(allowed[model.eos_token]))


CONST = {"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"]}
# name: (schema, a text the grammar let the model finish with that does not validate, what now)
#   impossible: the grammar no longer allows it; not-valid: the grammar does, the final check
#   (web/structured/reply_check.py) refuses it; refused: the request is a 400 (the schema's
#   x-guidance)
DIFFERENTIAL: dict[str, tuple[dict[str, Any], str, str]] = {
    "const-overridden-by-an-escaped-key": (CONST, '{"a":1,"\\u0061":"x"}', "not-valid"),
    "a-key-repeated": ({"type": "object"}, '{"b":1,"b":2}', "not-valid"),
    "above-a-maximum-past-2^53": (
        {"type": "integer", "maximum": 9007199254740999},
        "9007199254741000",
        "impossible",
    ),
    "below-a-minimum-past-2^53": (
        {"type": "integer", "minimum": 2**53 + 1},
        str(2**53),
        "impossible",
    ),
    "at-an-exclusive-maximum": (
        {"type": "integer", "exclusiveMaximum": 2**60},
        str(2**60),
        "impossible",
    ),
    "lenient-drops-uniqueItems": (
        {"type": "array", "uniqueItems": True, "x-guidance": {"lenient": True}},
        "[1,1]",
        "refused",
    ),
    "lenient-drops-not": (
        {"type": "string", "not": {"const": "no"}, "x-guidance": {"lenient": True}},
        '"no"',
        "refused",
    ),
    "lenient-drops-dependentRequired": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "dependentRequired": {"a": ["b"]},
            "x-guidance": {"lenient": True},
        },
        '{"a":1}',
        "refused",
    ),
    "separators-that-are-not-json": (
        CONST | {"x-guidance": {"key_separator": "=", "item_separator": ";"}},
        '{"a"=1}',
        "refused",
    ),
}


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Matching:
    config = json.loads((tiny_model_dir / "genai_config.json").read_text())["model"]
    eos = config["eos_token_id"]
    eos = eos[0] if isinstance(eos, list) else eos
    tokenizer = tiny_model_dir / "tokenizer.json"
    grammars = Grammars(tokenizer, config["vocab_size"], eos)
    assert grammars.unavailable is None
    return Matching(grammars, llguidance.LLTokenizer(str(tokenizer)), eos)


@pytest.mark.parametrize(("schema", "text", "now"), DIFFERENTIAL.values(), ids=DIFFERENTIAL.keys())
def test_what_a_grammar_allowed_that_does_not_validate_is_no_longer_a_valid_reply(
    model: Matching, schema: dict[str, Any], text: str, now: str
) -> None:
    assert allows(model, as_before(schema), text)  # before: a reply, finish "stop"
    # and it breaks the schema (a repeated key: a parser keeps one of them, so it may not)
    assert ReplyCheck(validator(meant(schema)), {}, 0).problem(text, calling=False)
    if now == "refused":
        with pytest.raises(ValidationError, match="x-guidance"):
            JsonSchemaSpec.model_validate({"name": "x", "schema": schema})
        return
    guidance = Guidance("json_schema", json.dumps(prepared(schema)))
    assert allows(model, guidance, text) == (now == "not-valid")


def test_a_tool_whose_parameters_are_not_an_object_could_not_be_called(model: Matching) -> None:
    """Before: parameters of another type (or none) let the call's arguments be any JSON, which
    no call can be read from: the call was dropped, finish "stop". Now such a tool is refused,
    and one whose parameters have no type takes an object."""
    text = '<tool_call>[{"name":"f","arguments":"Paris"}]'
    kinds: list[dict[str, Any]] = [{"type": "string"}, {"properties": {"city": {}}}]
    for parameters in kinds:
        call: dict[str, Any] = {"type": "object"}
        call["properties"] = {"name": {"const": "f"}, "arguments": parameters}
        call |= {"required": ["name", "arguments"], "additionalProperties": False}
        calls: dict[str, Any] = {"type": "array", "items": {"anyOf": [call]}}  # as main's
        calls |= {"minItems": 1, "maxItems": 1, "x-guidance": {"whitespace_flexible": False}}
        before = Guidance(
            "lark_grammar", f'start: calls\ncalls: "<tool_call>" %json {json.dumps(calls)}'
        )
        assert allows(model, before, text)
        tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
        if "type" in parameters:
            with pytest.raises(ValidationError, match='"type": "object"'):
                ToolSpec.model_validate(tool)
            continue
        now = for_request(None, [ToolSpec.model_validate(tool)], "required", False)
        assert now is not None and not allows(model, now, text)
        assert allows(model, now, '<tool_call>[{"name":"f","arguments":{}}]')


# -- through the sidecar ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def batch_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-batch-guidance.log"
    with services.sidecar(
        tiny_model_dir, log, DECODE_BATCH_ROWS="4", MAX_CONCURRENCY="6", QUEUE_SIZE="6"
    ) as service:
        yield service


def chat(url: str, question: str, **extra: Any) -> httpx.Response:
    body = {"model": "any", "messages": [{"role": "user", "content": question}], **extra}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=300)


def test_guided_and_unguided_users_at_once_all_validate(batch_sidecar: Service) -> None:
    schema_format = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}
    requests: list[dict[str, Any]] = [
        {"response_format": schema_format, "max_tokens": 120},
        {"response_format": schema_format, "max_tokens": 120, "temperature": 0.9, "seed": 3},
        {"response_format": {"type": "json_object"}, "max_tokens": 120},
        {
            "tools": TOOLS,
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "max_tokens": 300,
        },
        {"max_tokens": 40},
        {"max_tokens": 40, "temperature": 0.8},
    ]
    barrier = threading.Barrier(len(requests))

    def one(extra: dict[str, Any]) -> dict[str, Any]:
        barrier.wait()
        response = chat(batch_sidecar.url, "Weather in Paris?", **extra)
        assert response.status_code == 200, response.text
        return dict(response.json()["choices"][0])

    with ThreadPoolExecutor(len(requests)) as pool:
        choices = list(pool.map(one, requests))
    for choice in choices[:2]:
        assert choice["finish_reason"] == "stop"
        jsonschema_rs.validate(SCHEMA, json.loads(choice["message"]["content"]))
    if choices[2]["finish_reason"] == "stop":  # any object: its strings may run to the limit
        assert isinstance(json.loads(choices[2]["message"]["content"]), dict)
    else:
        assert choices[2]["message"]["content"].startswith("{")
    assert choices[3]["finish_reason"] == "tool_calls"
    for call in choices[3]["message"]["tool_calls"]:
        assert call["function"]["name"] == "get_weather"
        jsonschema_rs.validate(
            TOOLS[0]["function"]["parameters"], json.loads(call["function"]["arguments"])
        )
    assert all(choice["message"]["content"] for choice in choices[4:])
    assert LOADED_GENERATOR not in batch_sidecar.log()


@pytest.fixture(scope="module")
def generator_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-generator-guidance.log"
    with services.sidecar(tiny_model_dir, log, DECODE_BATCH_ROWS="1") as service:
        yield service


@pytest.mark.parametrize(
    "schema",
    [{"type": "objectx"}, {"type": "string", "pattern": "(("}],
    ids=["unknown-type", "bad-pattern"],
)
def test_a_bad_grammar_is_the_generator_paths_400(
    batch_sidecar: Service, generator_sidecar: Service, schema: dict[str, Any]
) -> None:
    extra = {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    }
    batched = chat(batch_sidecar.url, "Hi", **extra)
    alone = chat(generator_sidecar.url, "Hi", **extra)
    assert batched.status_code == alone.status_code == 400
    assert batched.json() == alone.json()
    assert batched.json()["error"]["code"] == "invalid_schema"
    assert LOADED_GENERATOR not in batch_sidecar.log()
