"""llama.cpp's own server on the converted tiny model: it loads the GGUF, tokenizes our prompt to
our ids, generates exactly the tokens asked for, reuses its prompt cache, and `python -m
scripts.bench peers` and `users-turns --peers` run end to end.

Marker `peers`: needs llama-server from `make peers` (llama.cpp built from source, which .ci/run
does); without it these tests fail on CI (CI=true) and are skipped elsewhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.run.services import Service

pytest.importorskip("gguf", reason="requirements-peers.txt is not installed")

from scripts.bench.drivers import RawEngine
from scripts.bench.peers import gguf_model, llamacpp

pytestmark = [pytest.mark.peers, pytest.mark.usefixtures("llama_server_built")]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> RawEngine:
    return RawEngine(str(tiny_model_dir), None)


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    gguf = tmp_path_factory.mktemp("llamacpp") / "tiny.gguf"
    gguf_model.convert(tiny_model_dir, gguf)
    return gguf


@pytest.fixture(scope="module")
def llama(tiny_gguf: Path) -> Iterator[Service]:
    log = tiny_gguf.parent / "server.log"
    with llamacpp.server(tiny_gguf, log, threads=2, slots=2, context=512) as service:
        yield service


def test_a_gguf_path_relative_to_the_caller(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--model models/x` given to a benchmark: the server runs in the GGUF's folder, where
    that relative path would name nothing."""
    monkeypatch.chdir(tiny_gguf.parent.parent)
    relative = Path(tiny_gguf.parent.name) / tiny_gguf.name
    log = tmp_path / "server.log"
    with llamacpp.server(relative, log, threads=1, slots=1, context=256) as service:
        assert httpx.get(service.url + "/health", timeout=10).status_code == 200


def prompt(engine: RawEngine, text: str) -> list[int]:
    return [int(i) for i in engine.prompt_ids([{"role": "user", "content": text}])]


def test_llama_cpp_tokenizes_the_rendered_chat_to_our_ids(
    engine: RawEngine, llama: Service
) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello, how are you today? Café, 你好 <|end|>!"},
    ]
    text = engine.tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True)
    # Role markers in the template are special tokens in both; our sidecar never lets user text
    # become one, so only the template's own markers are compared as specials.
    ours = [int(i) for i in engine.tokenizer.encode(text)]
    body = {"content": text, "add_special": False, "parse_special": True}
    theirs = httpx.post(llama.url + "/tokenize", json=body, timeout=30).json()["tokens"]
    assert theirs == ours


def test_generates_exactly_the_tokens_asked_for_greedily(engine: RawEngine, llama: Service) -> None:
    ids = prompt(engine, "How.")  # ends with <|end|> within 4 tokens on tiny: held off
    with httpx.Client(timeout=60) as client:
        first, timings = llamacpp.complete(client, llama.url, ids, 24, rep=0)
        second, _ = llamacpp.complete(client, llama.url, ids, 24, rep=1)
    assert first.status == 200 and first.tokens == 24
    assert timings["prompt_n"] == len(ids) and timings["cache_n"] == 0  # cache_prompt off
    assert 0 < first.ttft_s <= first.total_s and first.decode_tps > 0
    assert second.tokens == 24
    # The reply's text, for a caller that resends it (`users-turns`): greedy, the same.
    assert first.text and first.text == second.text


def test_same_weights_rank_our_greedy_tokens_on_top(engine: RawEngine, llama: Service) -> None:
    """The GGUF is the ONNX model's weights (scales in fp16, embedding and output requantized):
    fed our greedy reply token by token, llama.cpp ranks each of our tokens among its top 3.
    (A random model's best tokens are close, so the two greedy replies may part later.)"""
    import onnxruntime_genai as og

    ids = prompt(engine, "Tell me a story about the sea")
    params = og.GeneratorParams(engine.model)
    params.set_search_options(max_length=len(ids) + 6, min_length=len(ids) + 6, do_sample=False)
    generator = og.Generator(engine.model, params)
    generator.append_tokens(ids)
    ours = []
    while not generator.is_done():
        generator.generate_next_token()
        ours.append(int(generator.get_next_tokens()[0]))
    for k, token in enumerate(ours):
        body: dict[str, Any] = {"prompt": ids + ours[:k], "n_predict": 1, "n_probs": 3}
        body |= {"temperature": 0.0, "top_k": 1, "ignore_eos": True, "cache_prompt": False}
        reply = httpx.post(llama.url + "/completion", json=body, timeout=60).json()
        top = [entry["id"] for entry in reply["completion_probabilities"][0]["top_logprobs"]]
        assert token in top, (k, token, top)


def test_prompt_cache_reuses_the_previous_turn(engine: RawEngine, llama: Service) -> None:
    turn1 = [{"role": "user", "content": "the model streams each token to the page"}]
    turn2 = [*turn1, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    ids1 = [int(i) for i in engine.prompt_ids(turn1)]
    ids2 = [int(i) for i in engine.prompt_ids(turn2)]
    with httpx.Client(timeout=60) as client:
        llamacpp.complete(client, llama.url, ids1, 4, rep=0, cache_prompt=True)
        _, timings = llamacpp.complete(client, llama.url, ids2, 4, rep=0, cache_prompt=True)
    # Everything up to the end of turn 1's prompt is reused; the rest is processed.
    assert timings["cache_n"] >= len(ids1) - 1
    assert timings["cache_n"] + timings["prompt_n"] == len(ids2)


def test_bench_with_peers_on_the_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    json_path = tmp_path / "peers.json"
    args = ["--quick", "--model", str(tiny_model_dir), "--prompt-tokens", "40", "--reps", "1"]
    args += ["--new-tokens", "8", "--concurrency", "1", "--json", str(json_path)]
    args += ["--peer-lengths", "16,64", "--turn-tokens", "12", "--peer-users", "1,2"]
    result = subprocess.run(
        [sys.executable, "-m", "scripts.bench", "peers", *args],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(json_path.read_text())
    assert {s["variant"] for s in data["samples"]} >= {"sidecar", "llamacpp"}
    assert all(s["tokens"] == 8 for s in data["samples"])
    peers = data["peers"]
    assert [row["target"] for row in peers["prefill"]] == [16, 64]
    assert [row["turn"] for row in peers["turns"]] == [1, 2, 3, 4, 5]
    # llama.cpp reuses the previous turns: every turn after the first reports cached tokens.
    assert all(row["llamacpp"][0]["cached"] > 0 for row in peers["turns"][1:])
    assert [row["n"] for row in peers["users"]] == [1, 2]
    assert all(row["llamacpp"]["accepted"] == row["n"] for row in peers["users"])
    assert set(peers["memory"]) == {"sidecar (web + model worker)", "llama-server"}
    table = result.stdout
    for row in ("| llamacpp |", "| 5 |", "| llama-server |", "Ratios: llama.cpp / sidecar"):
        assert row in table


def test_users_taking_turns_beside_llama_server(
    engine: RawEngine, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from scripts.bench.users_turns import message

    out = tmp_path / "users.json"
    args = ["--model-dir", str(tiny_model_dir), "--users", "2", "--turns", "2", "--words", "12"]
    args += ["--reply-tokens", "6", "--baseline-reps", "1", "--pause", "0"]
    args += ["--restore-tokens", "0", "--peers", "--json", str(out)]
    result = subprocess.run(
        [sys.executable, "-m", "scripts.bench", "users-turns", *args],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    users = [s for s in data["samples"] if s["phase"] == "users"]
    # Request by request: ours, then llama-server's for the same user and turn.
    order = [(server, u, t) for t in (1, 2) for u in (1, 2) for server in ("sidecar", "llamacpp")]
    assert [(s["server"], s["user"], s["turn"]) for s in users] == order
    for ours, theirs in zip(users[::2], users[1::2], strict=True):
        # Turn 1 is the same prompt; after it each server's chat holds its own reply.
        if ours["turn"] == 1:
            assert theirs["prompt_tokens"] == ours["prompt_tokens"] and theirs["reused"] is None
        else:
            # One slot: user 1's turn 2 comes back from llama-server's host-memory cache.
            assert theirs["cached_tokens"] >= theirs["previous_prompt_tokens"] - 1
            # Its turn 2 resends its own reply's text: longer than with an empty reply.
            user = ours["user"]
            chat = [message(user, 1, 12), "", message(user, 2, 12)]
            roles = ("user", "assistant", "user")
            messages = [{"role": r, "content": c} for r, c in zip(roles, chat, strict=True)]
            assert theirs["prompt_tokens"] > len(engine.prompt_ids(messages))
    assert all("llamacpp" in row and row["llamacpp"]["requests"] == 2 for row in data["turns"])
    assert "--parallel 1" in " ".join(data["peers"]["args"])
    assert "--ctx-size 4096" in " ".join(data["peers"]["args"])
    assert data["peak_rss_bytes"]["llama-server"] > 0
    verdicts = {t["target"]: t["status"] for t in data["targets"]}
    assert verdicts["turn-2 TTFT, median and p95, at or below llama.cpp's on the same chats"] in (
        "pass",
        "fail",
    )
    assert "llama.cpp TTFT median (s)" in result.stdout
