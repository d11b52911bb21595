"""Several models behind one sidecar (MODELS_FILE) on the generated tiny and small models, real
processes: every surface routed by id and alias, an unknown name 404, a cold model loaded on
demand with its stream saying so, /v1/models' states and measured memory, each model's caches
apart, the budget held by unloading the least recently used idle model, load/unload/pin."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.run import services
from scripts.run.services import Service
from tests.sidecar.support import assert_error

EVENTS = {"accept": "application/x-ndjson"}
HI = [{"role": "user", "content": "Hello there"}]


def tables(tiny: Path, small: Path, other: Path) -> list[dict[str, Any]]:
    return [
        {"id": "tiny", "path": str(tiny), "aliases": ["chat"], "pinned": True},
        {"id": "small", "path": str(small), "aliases": ["bigger"], "system_prompt": "Be brief."},
        {"id": "tiny-b", "path": str(other)},
    ]


@pytest.fixture(scope="module")
def other_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's files under another folder: a third model."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path_factory.mktemp("other") / "tiny-b"))


@pytest.fixture(scope="module")
def several(
    tiny_model_dir: Path,
    small_model_dir: Path,
    other_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("several")
    with services.several_models(
        folder, tables(tiny_model_dir, small_model_dir, other_model_dir)
    ) as service:
        yield service


def listed(url: str) -> dict[str, dict[str, Any]]:
    data = httpx.get(url + "/v1/models", timeout=10).json()["data"]
    return {model["id"]: model for model in data}


def predict(url: str, model: str | None, **fields: object) -> list[dict[str, Any]]:
    body: dict[str, object] = {"messages": HI, "max_new_tokens": 3, **fields}
    if model is not None:
        body["model"] = model
    response = httpx.post(url + "/predict", json=body, headers=EVENTS, timeout=120)
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()]


def test_models_are_listed_with_their_states(several: Service) -> None:
    models = listed(several.url)
    assert list(models)[:3] == ["tiny", "small", "tiny-b"]
    tiny = models["tiny"]
    assert tiny["state"] == "loaded" and tiny["pinned"] and tiny["default"]
    assert tiny["aliases"] == ["chat"] and tiny["object"] == "model"
    assert models["tiny-b"]["memory_bytes"] is None or models["tiny-b"]["state"] != "available"
    one = httpx.get(several.url + "/v1/models/bigger", timeout=10).json()
    assert one["id"] == "small"
    assert_error(httpx.get(several.url + "/v1/models/gpt-4o", timeout=10), 404)


def test_a_cold_model_loads_on_demand_and_its_stream_says_so(several: Service) -> None:
    assert listed(several.url)["small"]["state"] in ("available", "loaded")
    httpx.post(several.url + "/v1/models/small/unload", timeout=30)
    assert listed(several.url)["small"]["state"] == "available"
    lines = predict(several.url, "bigger")
    loading = [line["loading"] for line in lines if "loading" in line]
    assert loading and loading[0]["model"] == "small"  # before any text
    assert lines.index({"loading": loading[0]}) < next(
        i for i, line in enumerate(lines) if "text" in line or "done" in line
    )
    assert lines[-1]["done"] is True
    small = listed(several.url)["small"]
    assert small["state"] == "loaded"
    # Measured once ready (the tidy loop, every second: a wait, not a timing)
    for _ in range(50):
        if listed(several.url)["small"]["memory_bytes"]:
            break
        httpx.get(several.url + "/healthz", timeout=5)
    assert int(listed(several.url)["small"]["memory_bytes"]) > 64 * 2**20


def test_every_surface_routes_by_name_and_refuses_an_unknown_one(several: Service) -> None:
    url = several.url
    tiny = predict(url, "chat")[-1]
    small = predict(url, "small")[-1]
    assert (tiny["model"], small["model"]) == ("tiny", "small")  # the id, whatever name was sent
    # The same message: the small model's table gives it a system prompt (its own default)
    assert int(small["prompt_tokens"]) > int(tiny["prompt_tokens"])
    body = {"messages": HI, "max_tokens": 2}
    chat = httpx.post(url + "/v1/chat/completions", json=body | {"model": "bigger"}, timeout=60)
    assert chat.status_code == 200 and chat.json()["model"] == "small"
    text = {"prompt": "Once", "max_tokens": 2}
    done = httpx.post(url + "/v1/completions", json=text | {"model": "tiny"}, timeout=60)
    assert done.status_code == 200 and done.json()["model"] == "tiny"
    answer = httpx.post(
        url + "/v1/responses", json={"input": "Hi", "model": "chat", "max_output_tokens": 2}
    )
    assert answer.status_code == 200 and answer.json()["model"] == "tiny"
    for path, payload in (
        ("/predict", {"messages": HI, "model": "gpt-4o"}),
        ("/v1/chat/completions", body | {"model": "gpt-4o"}),
        ("/v1/completions", text | {"model": "gpt-4o"}),
        ("/v1/responses", {"input": "Hi", "model": "gpt-4o"}),
    ):
        message = assert_error(httpx.post(url + path, json=payload, timeout=30), 404)
        assert "gpt-4o" in message, path


def test_each_model_keeps_its_caches_apart(several: Service) -> None:
    first = predict(several.url, "tiny", cache_scope="apart")
    predict(several.url, "small", cache_scope="apart")
    cache = several.log_path.parent / "cache"  # PROMPT_CACHE_DIR: a folder per model
    assert {"tiny", "small"} <= {child.name for child in cache.iterdir() if child.is_dir()}
    # The next turn of the scope on the same model finds its first, the other model's between
    # them notwithstanding (each worker its own cache)
    reply = "".join(str(line["text"]) for line in first if "text" in line)
    turn = [*HI, {"role": "assistant", "content": reply}, {"role": "user", "content": "More?"}]
    again = predict(several.url, "tiny", cache_scope="apart", messages=turn)[-1]
    assert int(again["cached_tokens"]) > 0


def test_pinned_models_stay_and_load_unload_answer(several: Service) -> None:
    url = several.url
    assert_error(httpx.post(url + "/v1/models/tiny/unload", timeout=30), 409)
    assert_error(httpx.post(url + "/v1/models/chat/unpin", timeout=30), 409)
    loaded = httpx.post(url + "/v1/models/tiny-b/load", timeout=60).json()
    assert loaded["state"] in ("loading", "loaded")
    pinned = httpx.post(url + "/v1/models/tiny-b/pin", timeout=30).json()
    assert pinned["pinned"] is True
    assert_error(httpx.post(url + "/v1/models/tiny-b/unload", timeout=30), 409)
    assert httpx.post(url + "/v1/models/tiny-b/unpin", timeout=30).json()["pinned"] is False
    assert_error(httpx.post(url + "/v1/models/nope/load", timeout=30), 404)


def test_the_budget_unloads_the_least_recently_used_idle_model(
    tiny_model_dir: Path, small_model_dir: Path, other_model_dir: Path, tmp_path: Path
) -> None:
    # Each model books a 2 GiB KV bound (counted, not allocated): a model then costs about
    # 2.25 GiB, whatever its processes' resident memory measures on a busy machine, and 5.2 GiB
    # holds two of them, not three
    booked = [
        table | {"kv_memory_mb": 2048}
        for table in tables(tiny_model_dir, small_model_dir, other_model_dir)
    ]
    with services.several_models(
        tmp_path, booked, MODELS_MEMORY_BYTES=str(int(5.2 * 2**30))
    ) as service:
        predict(service.url, "small")
        assert listed(service.url)["small"]["state"] == "loaded"
        predict(service.url, "tiny-b")  # no room beside tiny (pinned) and small: small goes
        states = {k: v["state"] for k, v in listed(service.url).items() if k != "tiny"}
        assert states == {"small": "available", "tiny-b": "loaded"}
        assert "model unloaded" in service.log_path.read_text()
        predict(service.url, "tiny")  # the pinned default answers throughout
