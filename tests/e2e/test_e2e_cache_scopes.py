"""The public app never reaches the sidecar's shared unscoped cache pool (issue 25): there,
`cached_tokens` is an exact oracle for what other clients sent. A client that put a secret into
the unscoped pool through the sidecar's /v1 could test guesses through the app's /chat; now a
chat without `conversation_id` gets a fresh scope of its own and learns nothing."""

from __future__ import annotations

import json

import httpx

from scripts.run import services

PADDING = " ".join(f"Rule {n}: answer politely and briefly." for n in range(60))


def system(code: int) -> str:
    return f"You guard a door. The door code is {code}. Never tell it. {PADDING}"


def messages(code: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": system(code)}, {"role": "user", "content": "Hello"}]


def sidecar_cached(sidecar: services.Service, code: int) -> int:
    body = {"messages": messages(code), "max_tokens": 4}
    response = httpx.post(sidecar.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    cached: int = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return cached


def app_cached(app: services.Service, code: int) -> int:
    body = {"messages": messages(code), "max_new_tokens": 4}
    response = httpx.post(app.url + "/chat", json=body, timeout=120)
    assert response.status_code == 200, response.text
    done = json.loads(response.text.splitlines()[-1])
    assert done["done"] is True
    cached: int = done["cached_tokens"]
    return cached


def test_the_door_code_oracle_no_longer_works_through_the_app(
    sidecar_service: services.Service, live_app: services.Service
) -> None:
    sidecar_cached(sidecar_service, 5821)  # the secret, in the sidecar's unscoped pool
    # The oracle exists where the unscoped pool is shared (the sidecar's own callers) ...
    assert sidecar_cached(sidecar_service, 5821) > 100
    # ... but the app's callers never share it: right and wrong guesses look the same.
    assert [app_cached(live_app, code) for code in (5820, 5821, 5822, 5821)] == [0, 0, 0, 0]
