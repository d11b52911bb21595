"""Guided generation in the model worker's engine (model/engine.py, model/guidance.py) on the
real tiny model: forced tokens save decode steps without changing the reply or its budget, a
guided generator is reused only by the same grammar (and its grammar holds again), and a
grammar onnxruntime-genai cannot build is a GuidanceRefused, not a crash."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.ipc import Generate, Guidance
from sidecar.model.batch.row import BatchGeneration
from sidecar.model.engine import Engine
from sidecar.model.generator.generation import Generation
from sidecar.model.guidance import FF_MARGIN, GuidanceRefused, fitted
from sidecar.web.structured.guidance import prepared

SCHEMA = prepared(
    {
        "type": "object",
        "properties": {
            "city": {"enum": ["Paris", "London", "Tokyo"]},
            "description": {"type": "string", "maxLength": 16},
            "temperature": {"type": "integer", "minimum": -30, "maximum": 45},
        },
        "required": ["city", "description", "temperature"],
        "additionalProperties": False,
    }
)
GUIDED = Guidance("json_schema", json.dumps(SCHEMA))
QUESTIONS = ["Weather in Paris?", "And in Tokyo, tomorrow?", "Describe London in one line."]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Engine:
    engine = Engine(tiny_model_dir, prompt_cache_mb=64, prefill_chunk=16)
    engine.warm_up()
    return engine


def request(question: str, guidance: Guidance | None, **extra: object) -> Generate:
    messages = extra.pop("messages", (("user", question),))
    return Generate("test", messages, 200, guidance=guidance, **extra)  # type: ignore[arg-type]


def run(generation: Generation | BatchGeneration) -> tuple[str, int]:
    """The reply's text and the decode steps it took (prefill steps not counted)."""
    text, steps = [], 0
    while generation.finish is None:
        was_prefilling = generation.prefilling
        piece = generation.step()
        steps += not was_prefilling
        text.append(piece or "")
    generation.release(reusable=True)
    return "".join(text), steps


def test_forced_tokens_save_steps_and_change_nothing_else(engine: Engine) -> None:
    for question in QUESTIONS:
        fast = engine.start(request(question, GUIDED), cached=False)
        fast_text, fast_steps = run(fast)
        slow = engine.start(request(question, replace(GUIDED, ff_tokens=False)), cached=False)
        slow_text, slow_steps = run(slow)
        assert fast.finish == slow.finish == "eos"
        assert fast_text == slow_text  # the same greedy reply ...
        assert fast.generated == slow.generated  # ... and token count (forced ones included)
        assert fast_steps < slow_steps == slow.generated  # in fewer decode steps
        reply = json.loads(fast_text)
        assert reply["city"] in ("Paris", "London", "Tokyo")
        assert -30 <= reply["temperature"] <= 45


def test_forced_tokens_never_run_past_the_budget(engine: Engine) -> None:
    for budget in range(1, 12):
        generation = engine.start(
            replace(request(QUESTIONS[0], GUIDED), max_new_tokens=budget), cached=False
        )
        text, _ = run(generation)
        assert generation.generated <= budget
        assert generation.finish == "length" or json.loads(text)


def test_forced_tokens_need_room_beyond_the_request(engine: Engine) -> None:
    assert fitted(GUIDED, 100, 100 + FF_MARGIN) == GUIDED
    assert fitted(GUIDED, 101, 100 + FF_MARGIN) == replace(GUIDED, ff_tokens=False)
    # a request that fills the context still runs, step by step
    generation = engine.start(replace(request(QUESTIONS[0], GUIDED), max_new_tokens=10**5))
    assert isinstance(generation, Generation) and generation.guided
    run(generation)


def test_a_guided_generator_is_reused_only_by_its_own_grammar(engine: Engine) -> None:
    scope = "guided-engine-test"
    history = " ".join(QUESTIONS * 3)  # long enough for whole prefill chunks to be reused
    first = engine.start(request(history, GUIDED, cache_scope=scope))
    text, _ = run(first)
    assert first.cached_tokens == 0
    # the next turn with the same grammar continues it, and the grammar holds again
    turn = (("user", history), ("assistant", text), ("user", "And tomorrow?"))
    second = engine.start(request("", GUIDED, messages=turn, cache_scope=scope))
    assert second.cached_tokens > 0
    json.loads(run(second)[0])
    # neither an unguided request nor another grammar is lent it
    for other in (None, replace(GUIDED, ff_tokens=False), Guidance("regex", "[a-z]{1,8}")):
        generation = engine.start(request("", other, messages=turn, cache_scope=scope))
        assert generation.cached_tokens == 0
        run(generation)


@pytest.mark.parametrize(
    "guidance",
    [
        Guidance("json_schema", '{"type": "objectx"}'),
        Guidance("json_schema", '{"type": "string", "pattern": "(("}'),
        Guidance("lark_grammar", "start: nothing_defined"),
        Guidance("regex", "(("),
    ],
    ids=["unknown-type", "bad-pattern", "undefined-rule", "bad-regex"],
)
def test_a_grammar_that_cannot_be_built_is_refused(engine: Engine, guidance: Guidance) -> None:
    with pytest.raises(GuidanceRefused) as refused:
        engine.start(request(QUESTIONS[0], guidance, cache_scope="refused"))
    assert str(refused.value) and "\n" not in str(refused.value)
    # and the cache is left as it was: nothing lent
    assert not any(entry.lent for entry in engine.cache.entries)
