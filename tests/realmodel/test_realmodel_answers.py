"""Greedy questions with known answers through every door: the sidecar's /predict and
/v1/chat/completions, the app's /chat, and the chat page in Chromium; stop sequences and
Markdown on the model's real text."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from scripts.models.realmodel.sources import SMOLLM2_135M_INSTRUCT
from scripts.run import services
from tests.e2e import live
from tests.e2e.browser.support import reply, send

pytestmark = pytest.mark.realmodel

ANSWERS = [*SMOLLM2_135M_INSTRUCT.answers, ("What is 2 + 2?", "4")]
FRANCE = "What is the capital of France?"
# Greedy, SmolLM2 answers this with a numbered list ("1. Red\n2. Blue\n...").
LIST_PROMPT = "List three primary colors as a numbered list."


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def predict(sidecar: services.Service, text: str, **options: Any) -> httpx.Response:
    body = {"messages": user(text), "max_new_tokens": 48, **options}
    response = httpx.post(sidecar.url + "/predict", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response


def completion(sidecar: services.Service, text: str, **options: Any) -> dict[str, Any]:
    body = {"messages": user(text), "max_tokens": 48, **options}
    response = httpx.post(sidecar.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


@pytest.mark.parametrize(("question", "word"), ANSWERS)
def test_predict_answers(smollm2_sidecar: services.Service, question: str, word: str) -> None:
    text = predict(smollm2_sidecar, question).text
    assert word in text, text


@pytest.mark.parametrize(("question", "word"), ANSWERS)
def test_openai_route_answers_the_same(
    smollm2_sidecar: services.Service, question: str, word: str
) -> None:
    result = completion(smollm2_sidecar, question)
    choice = result["choices"][0]
    assert word in choice["message"]["content"]
    assert choice["finish_reason"] == "stop"  # the model ended its turn with <|im_end|>
    assert choice["message"]["content"] == predict(smollm2_sidecar, question).text


def test_the_app_relays_the_answer(
    smollm2_app: services.Service, smollm2_sidecar: services.Service
) -> None:
    objs = live.chat(smollm2_app.url, user(FRANCE))
    assert objs[-1]["done"] is True and objs[-1]["finish_reason"] == "stop"
    assert "Paris" in live.text_of(objs)
    assert live.text_of(objs) == predict(smollm2_sidecar, FRANCE).text


def test_stop_sequence_on_real_text(smollm2_sidecar: services.Service) -> None:
    whole = completion(smollm2_sidecar, FRANCE)["choices"][0]["message"]["content"]
    assert " is Paris" in whole
    cut = completion(smollm2_sidecar, FRANCE, stop=[" is Paris", "Paris"])
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == whole[: whole.index(" is Paris")]
    # On /predict too, streamed as NDJSON: the text before the stop string, nothing of it.
    body = {"messages": user(FRANCE), "max_new_tokens": 48, "stop": ["France is"]}
    headers = {"accept": "application/x-ndjson"}
    with httpx.stream(
        "POST", smollm2_sidecar.url + "/predict", json=body, headers=headers, timeout=120
    ) as response:
        objs = list(live.lines(response))
    assert "".join(obj.get("text", "") for obj in objs) == whole[: whole.index("France is")]
    assert objs[-1]["done"] is True and objs[-1]["finish_reason"] == "stop"


@pytest.mark.browser
def test_the_page_shows_the_answer(page: Page, smollm2_app: services.Service) -> None:
    page.goto(smollm2_app.url)
    expect(page.locator("#model-status")).to_contain_text("Model ready")
    send(page, FRANCE)
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "done", timeout=60_000)
    expect(answer.locator(".text")).to_contain_text("Paris")


@pytest.mark.browser
def test_a_markdown_list_in_a_reply_is_a_list_on_the_page(
    page: Page, smollm2_app: services.Service, smollm2_sidecar: services.Service
) -> None:
    expected = predict(smollm2_sidecar, LIST_PROMPT).text
    items = [line.split(". ", 1)[1] for line in expected.splitlines() if line[:1].isdigit()]
    assert len(items) >= 3, expected  # the model's own list, as the page must show it
    page.goto(smollm2_app.url)
    expect(page.locator("#model-status")).to_contain_text("Model ready")
    send(page, LIST_PROMPT)
    answer = reply(page)
    expect(answer).to_have_attribute("data-state", "done", timeout=60_000)
    rendered = answer.locator(".markdown ol > li")
    expect(rendered).to_have_count(len(items))
    expect(rendered).to_have_text(items)
