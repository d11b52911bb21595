"""Prompt-lookup drafts on the batched path (PROMPT_LOOKUP_TOKENS, model/batch/drafts.py) on the
real engine and the generated `tiny` model: replies are the same with drafts on and off (greedy,
seeded sampling, log probabilities, a grammar, two users at once, a reply that runs into the
context's end, one that a stop sequence or EOS ends), the drafts are really checked and
accepted and their counts add up; and through a real sidecar, the log line, /metrics and the
OpenAI usage say what they did (slow: a process)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.models import make_model
from scripts.run import services
from sidecar.ipc import Drafts, Generate, Guidance
from sidecar.model.batch import drafts
from sidecar.model.batch.row import BatchGeneration
from sidecar.model.engine import Engine
from sidecar.web.structured.guidance import prepared
from tests.sidecar.support import request_line

DRAFT_TOKENS = 4
NEW = 64
REPEAT = "Repeat after me: one two three four, one two three four, one two three four."
PROMPTS = (make_model.LONG_PROMPT, "Hi", make_model.EOS_PROMPT, REPEAT)


def engine(folder: Path, draft_tokens: int, **options: Any) -> Engine:
    made = Engine(
        folder,
        decode_batch_rows=4,
        max_concurrency=4,
        prompt_lookup_tokens=draft_tokens,
        **options,
    )
    made.warm_up()
    assert made.batch is not None and made.batch.draft_tokens == draft_tokens
    return made


@pytest.fixture(scope="module")
def pair(tiny_model_dir: Path) -> dict[str, Engine]:
    return {"on": engine(tiny_model_dir, DRAFT_TOKENS), "off": engine(tiny_model_dir, 0)}


class Reply:
    """One request driven to its end through the batch, with its text and counts."""

    def __init__(self, generation: BatchGeneration) -> None:
        self.generation = generation
        self.text = ""

    @property
    def drafts(self) -> Drafts | None:
        return self.generation.drafts()

    def outcome(self) -> tuple[str, str | None, int]:
        return self.text, self.generation.finish, self.generation.generated


def run(model: Engine, *requests: Generate) -> list[Reply]:
    """Start the requests together and step the batch until every one has ended (each
    released as it ends, as the worker does)."""
    assert model.batch is not None
    replies = []
    for request in requests:
        generation = model.start(request, cached=False)
        assert isinstance(generation, BatchGeneration)
        replies.append(Reply(generation))
    running = {id(r.generation): r for r in replies}
    while running:
        for generation, text in model.batch.step():
            reply = running.get(id(generation))
            if reply is None:
                continue
            reply.text += text or ""
            if generation.finish is not None:
                generation.release(reusable=False)
                del running[id(generation)]
    return replies


def ask(prompt: str, new: int = NEW, **options: Any) -> Generate:
    return Generate("test", (("user", prompt),), new, **options)


def test_lookup_proposes_what_followed_the_latest_earlier_occurrence() -> None:
    assert drafts.lookup([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 4) == [7, 8, 1, 2]
    assert drafts.lookup([1, 2, 3, 4, 5, 1, 2, 3], 9) == [4, 5, 1, 2, 3]
    assert drafts.lookup([1, 2, 3, 4, 5, 1, 2, 3], 2) == [4, 5]
    assert drafts.lookup([1, 2, 3, 4, 2, 3], 4) == []  # the n-gram is 3 tokens
    assert drafts.lookup([5, 5, 5, 5], 3) == [5]  # the latest earlier window: its successor
    assert drafts.lookup([1, 2, 3], 4) == [] and drafts.lookup([1, 2, 3, 1, 2, 3], 0) == []


def test_the_draft_shortens_after_a_miss_and_pauses_after_misses_in_a_row() -> None:
    row = drafts.RowDrafts(4)
    tokens = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    assert row.propose(tokens, 8) == [4, 5, 6, 1]
    row.settle(4, 1)
    assert row.propose(tokens, 8) == [4, 5]  # the agreeing run and one more
    row.settle(2, 2)
    assert row.length == 3
    row.settle(3, 0)
    row.settle(1, 0)  # two misses in a row: a pause
    assert [row.propose(tokens, 8) for _ in range(drafts.PAUSE_STEPS)] == [[]] * drafts.PAUSE_STEPS
    assert row.propose(tokens, 8) == [4]
    assert row.counts() == Drafts(checked=10, accepted=3, steps=4)


def test_greedy_replies_are_the_same_with_drafts_on_and_off(pair: dict[str, Engine]) -> None:
    accepted = 0
    for prompt in PROMPTS:
        (on,), (off,) = run(pair["on"], ask(prompt)), run(pair["off"], ask(prompt))
        assert on.outcome() == off.outcome(), prompt
        assert off.drafts is None and on.drafts is not None
        accepted += on.drafts.accepted
    assert accepted > 0  # drafts really happened


def test_the_counts_add_up(pair: dict[str, Engine]) -> None:
    """Each decode call gives the model's own token after the draft tokens it accepted (the
    first token comes from the prompt's last chunk); a reply may end on an accepted one."""
    calls: list[tuple[int, int]] = []
    batch = pair["on"].batch
    assert batch is not None
    real_run = batch.decoder.run

    def counted(first: int, ids: Any, lengths: Any, *, every: bool = False) -> Any:
        calls.append(ids.shape)
        return real_run(first, ids, lengths, every=every)

    batch.decoder.run = counted  # type: ignore[method-assign]
    try:
        (reply,) = run(pair["on"], ask(REPEAT))
    finally:
        del batch.decoder.run
    counts = reply.drafts
    assert counts is not None and 0 < counts.accepted <= counts.checked
    decode_calls = [shape for shape in calls if shape[1] <= 1 + DRAFT_TOKENS][-counts.steps :]
    assert counts.steps == len(decode_calls)
    assert counts.checked == sum(width - 1 for _, width in decode_calls)
    assert 1 + counts.steps + counts.accepted - reply.generation.generated in (0, 1)
    assert reply.generation.generated / counts.steps > 1.2  # several tokens a call


def test_a_seeded_sampled_reply_is_the_same_with_drafts(pair: dict[str, Engine]) -> None:
    """A draft token is taken only where the reply's own sampler picks it, one draw a token
    as without drafts: the same seed gives the same reply."""
    checked = accepted = 0
    for seed in (1, 11):  # the tiny model repeats itself at a low temperature only
        request = ask(make_model.LONG_PROMPT, temperature=0.1, seed=seed)
        (on,), (off,) = run(pair["on"], request), run(pair["off"], request)
        assert on.outcome() == off.outcome(), seed
        assert on.drafts is not None
        checked, accepted = checked + on.drafts.checked, accepted + on.drafts.accepted
    assert checked > accepted > 0  # draft tokens the sampler picked, and some it did not


def test_log_probabilities_are_the_same_with_drafts(pair: dict[str, Engine]) -> None:
    replies = {}
    for side in ("on", "off"):
        (reply,) = run(pair[side], ask(REPEAT, logprobs=3))
        replies[side] = (reply, reply.generation.take_logprobs())
    (on, on_logprobs), (off, off_logprobs) = replies["on"], replies["off"]
    assert on.outcome() == off.outcome()
    assert on.drafts is not None and on.drafts.accepted > 0
    assert [t.token for t in on_logprobs] == [t.token for t in off_logprobs]
    for a, b in zip(on_logprobs, off_logprobs, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [token for token, _ in a.top] == [token for token, _ in b.top]


def test_a_guided_reply_is_the_same_with_drafts(pair: dict[str, Engine]) -> None:
    schema = {
        "type": "object",
        "properties": {"words": {"type": "array", "items": {"enum": ["one", "two", "three"]}}},
        "required": ["words"],
    }
    guidance = Guidance("json_schema", json.dumps(prepared(schema)))
    request = ask(REPEAT, guidance=guidance)
    (on,), (off,) = run(pair["on"], request), run(pair["off"], request)
    assert on.outcome() == off.outcome()
    if on.generation.finish == "eos":
        assert set(json.loads(on.text)) == {"words"}


def test_other_users_rows_are_unchanged(pair: dict[str, Engine]) -> None:
    """While two replies decode nobody drafts (batch/drafts.py): the other user's reply is made
    by the same model calls whatever the setting, so it is the same bit for bit on any CPU; the
    longer one drafts once it decodes alone."""
    requests = (ask(REPEAT, 96, min_new_tokens=96), ask("Hi", 24))
    on, off = run(pair["on"], *requests), run(pair["off"], *requests)
    assert on[1].outcome() == off[1].outcome()
    assert on[0].outcome() == off[0].outcome()
    assert on[1].drafts == Drafts(0, 0, on[1].drafts.steps if on[1].drafts else -1)
    assert on[0].drafts is not None and on[0].drafts.accepted > 0


def test_a_reply_that_runs_into_the_contexts_end(tiny_model_dir: Path) -> None:
    """A draft never reaches past the slot (MAX_LENGTH positions) or the KV reserved."""
    short = {side: engine(tiny_model_dir, k, max_length=96) for side, k in (("on", 8), ("off", 0))}
    request = ask(REPEAT, 500)
    (on,), (off,) = run(short["on"], request), run(short["off"], request)
    assert on.outcome() == off.outcome()
    assert on.generation.finish == "length"
    assert on.drafts is not None and on.drafts.accepted > 0
    holder = on.generation.holder
    assert holder.kv_len <= holder.touched <= 96


def drafted_stop(model: Engine, prompt: str) -> str:
    """A stop sequence the reply first writes in a step that took draft tokens."""
    assert model.batch is not None
    generation = model.start(ask(prompt), cached=False)
    assert isinstance(generation, BatchGeneration) and generation.lookup is not None
    text, ends = "", []  # where each such step's text ended
    while generation.finish is None:
        accepted = generation.lookup.accepted
        for touched, piece in model.batch.step():
            if touched is generation and piece:
                text += piece
                if generation.lookup.accepted > accepted:
                    ends.append(len(text))
    generation.release(reusable=False)
    return next(text[end - 4 : end] for end in ends if text.find(text[end - 4 : end]) == end - 4)


def test_a_stop_sequence_or_eos_inside_a_draft_run(pair: dict[str, Engine]) -> None:
    stop = drafted_stop(pair["on"], make_model.LONG_PROMPT)
    request = ask(make_model.LONG_PROMPT, stop=(stop,))
    (on,), (off,) = run(pair["on"], request), run(pair["off"], request)
    assert on.outcome() == off.outcome() and on.generation.finish == "stop"
    assert on.drafts is not None and on.drafts.accepted > 0
    request = ask(make_model.EOS_PROMPT)
    (on,), (off,) = run(pair["on"], request), run(pair["off"], request)
    assert on.outcome() == off.outcome() and on.generation.finish == "eos"


@pytest.fixture(scope="module")
def drafting_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-batch-drafts.log"
    with services.sidecar(tiny_model_dir, log, PROMPT_LOOKUP_TOKENS=str(DRAFT_TOKENS)) as service:
        yield service


def test_the_log_line_metrics_and_usage_say_what_the_drafts_did(
    drafting_sidecar: services.Service,
) -> None:
    url = drafting_sidecar.url
    body = {"messages": [{"role": "user", "content": REPEAT}], "max_tokens": NEW}
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    line = request_line(drafting_sidecar, response.headers["x-request-id"])
    assert line["draft_tokens"] >= line["accepted_draft_tokens"] > 0
    assert 1 < line["tokens_per_step"] <= 1 + DRAFT_TOKENS
    assert response.json()["usage"]["completion_tokens_details"] == {
        "accepted_prediction_tokens": line["accepted_draft_tokens"],
        "rejected_prediction_tokens": line["draft_tokens"] - line["accepted_draft_tokens"],
    }
    metrics = httpx.get(url + "/metrics", timeout=10).text
    accepted = re.search(r"^sidecar_draft_tokens_accepted_total (\S+)$", metrics, re.M)
    assert accepted and float(accepted.group(1)) >= line["accepted_draft_tokens"]
