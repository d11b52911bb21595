"""POST /v1/embeddings as clients see it: the official `openai` SDK (its default base64 and
floats) and plain HTTP against a real sidecar on the tiny chat model and the tiny generated
encoder (scripts/models/make_encoder.py, given e5's prompts); the vectors checked against the
same encoder run in this process; every refusal; `input_type`'s prompts (issue 55); the API
key, log line and metrics; a chat beside an index run; what huge inputs cost (issue 58)."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import psutil
import pytest
from openai import OpenAI

from scripts.run import services
from scripts.run.services import Service
from sidecar.embeddings.encoder import Encoder
from sidecar.embeddings.folder import read_spec

KEY = "test-key"
TEXTS = ["The cat sat on the mat.", "Paris is the capital of France.", "hello"]
HEADERS = {"Authorization": f"Bearer {KEY}"}
PROMPTS = {"query": "query: ", "passage": "passage: "}  # e5's, two tokens each here


@pytest.fixture(scope="module")
def encoder_dir(tiny_encoder_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny encoder (same name, same files) with sentence-transformers' prompts file, as
    the multilingual encoder has it: a request without input_type reads as without it."""
    copy = tmp_path_factory.mktemp("prompted") / tiny_encoder_dir.name
    shutil.copytree(tiny_encoder_dir, copy)
    config = {"prompts": PROMPTS, "default_prompt_name": None}
    (copy / "config_sentence_transformers.json").write_text(json.dumps(config))
    return copy


@pytest.fixture(scope="module")
def service(
    tiny_model_dir: Path, encoder_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-embeddings.log"
    with services.sidecar(
        tiny_model_dir,
        log,
        EMBED_MODEL_PATH=str(encoder_dir),
        EMBED_MAX_INPUTS="300",  # the body keeps its default 8 MiB: huge inputs reach the route
        EMBED_MAX_CHARS="20000",
        EMBED_BATCH_TOKENS="64",
        API_KEY=KEY,
    ) as running:
        services.wait_for_embeddings(running)
        yield running


@pytest.fixture(scope="module")
def encoder(encoder_dir: Path) -> Encoder:
    return Encoder(read_spec(encoder_dir))


@pytest.fixture
def client(service: Service) -> Iterator[OpenAI]:
    with OpenAI(base_url=service.url + "/v1", api_key=KEY, max_retries=0) as client:
        yield client


def post(service: Service, body: Any, **headers: str) -> httpx.Response:
    return httpx.post(
        service.url + "/v1/embeddings", json=body, headers=HEADERS | headers, timeout=60
    )


def error(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()["error"]
    return body


def test_the_sdk_s_default_base64_and_floats_give_the_encoder_s_vectors(
    client: OpenAI, encoder: Encoder, tiny_encoder_dir: Path
) -> None:
    expected = encoder.encode(encoder.tokenize(TEXTS))
    default = client.embeddings.create(model="anything", input=TEXTS)  # base64 on the wire
    floats = client.embeddings.create(model="anything", input=TEXTS, encoding_format="float")
    for reply in (default, floats):
        got = np.array([item.embedding for item in reply.data], dtype=np.float32)
        assert [item.index for item in reply.data] == [0, 1, 2]
        assert np.array_equal(got, expected)  # both formats carry float32 exactly
        assert reply.model == tiny_encoder_dir.name
        tokens = sum(len(ids) for ids in encoder.tokenize(TEXTS))
        assert reply.usage.prompt_tokens == reply.usage.total_tokens == tokens
    assert np.allclose(np.linalg.norm(expected, axis=1), 1.0, atol=1e-6)


def test_base64_is_little_endian_float32(service: Service, encoder: Encoder) -> None:
    response = post(service, {"input": "hello", "encoding_format": "base64"})
    raw = base64.b64decode(response.json()["data"][0]["embedding"])
    assert len(raw) == 4 * encoder.spec.dimensions
    got = np.frombuffer(raw, dtype="<f4")
    assert np.array_equal(got, encoder.encode(encoder.tokenize(["hello"]))[0])


def test_token_ids_as_the_tokenizer_gives_them_are_the_text(
    client: OpenAI, encoder: Encoder
) -> None:
    ids = encoder.tokenize(TEXTS)
    by_text = client.embeddings.create(model="m", input=TEXTS, encoding_format="float")
    by_ids = client.embeddings.create(model="m", input=ids, encoding_format="float")
    one = client.embeddings.create(model="m", input=ids[0], encoding_format="float")
    assert [d.embedding for d in by_ids.data] == [d.embedding for d in by_text.data]
    assert one.data[0].embedding == by_text.data[0].embedding


def test_a_batch_gives_each_input_the_vector_it_has_alone(service: Service) -> None:
    """Inputs are sorted, padded and cut into batches of EMBED_BATCH_TOKENS: none of that shows."""
    texts = [" ".join(["cat"] * n) for n in (1, 20, 3, 25, 7)]
    together = post(service, {"input": texts}).json()["data"]
    alone = [post(service, {"input": t}).json()["data"][0]["embedding"] for t in texts]
    got = np.array([d["embedding"] for d in together])
    assert np.allclose(got, np.array(alone), atol=1e-6)


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        ({"input": ""}, "invalid_input", "empty"),
        ({"input": []}, "invalid_input", "non-empty"),
        ({"input": ["a", ""]}, "invalid_input", "input 1 is empty"),
        ({"input": [[2, 3], []]}, "invalid_input", "input 1 is empty"),
        ({"input": ["a", [2, 3]]}, "invalid_input", "mixes"),
        ({"input": [2, 99999]}, "invalid_input", "not in the vocabulary"),
        ({"input": [2, -1]}, "invalid_input", "not in the vocabulary"),
        ({"input": [True, 2]}, "invalid_input", "mixes"),
        ({"input": {"text": "a"}}, "invalid_input", "non-empty string or array"),
        ({"input": ["a"] * 301}, "too_many_inputs", "at most 300"),
        ({"input": "cat " * 40}, "context_length_exceeded", "at most 32"),
        # 32 tokens times 100 characters an input, EMBED_MAX_CHARS together
        ({"input": "x" * 3201}, "too_many_characters", "input 0 has 3,201 characters"),
        ({"input": ["a", "x " * 1601]}, "too_many_characters", "at most 3,200 an input"),
        ({"input": ["cat " * 700] * 8}, "too_many_characters", "22,400 characters together"),
        ({"input": "a", "dimensions": 8}, "invalid_value", "only 32"),
        ({"input": "a", "truncate_prompt_tokens": 100}, "invalid_input", "between 2"),
        ({"input": "a", "encoding_format": "int8"}, "invalid_value", "encoding_format"),
        ({"input": "a", "input_type": "document"}, "invalid_value", "input_type: Input should"),
        ({"input": [2, 3], "input_type": "query"}, "invalid_input", "token ids are read as"),
        ({"input": "a", "temperature": 1}, "invalid_value", "temperature"),
    ],
)
def test_each_refusal(service: Service, body: Any, code: str, words: str) -> None:
    response = post(service, body)
    assert response.status_code == 400, response.text
    assert error(response)["code"] == code and words in error(response)["message"]


def test_too_long_names_the_limit_and_truncation_cuts_only_when_asked(
    client: OpenAI, service: Service, encoder: Encoder
) -> None:
    long = "cat " * 40  # 42 tokens, [CLS] and [SEP] included; the tiny encoder reads 32
    refused = post(service, {"input": long})
    assert error(refused)["limit_tokens"] == 32 and error(refused)["param"] == "input"
    assert "input 0 has 42 tokens" in error(refused)["message"]
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="m", input=long)
    cut = client.embeddings.create(
        model="m", input=long, encoding_format="float", extra_body={"truncate_prompt_tokens": -1}
    )
    ids = encoder.tokenize(["cat " * 30])[0]  # [CLS], 30 words, [SEP] kept: the cut's 32 ids
    assert cut.usage.prompt_tokens == 32
    expected = encoder.encode([ids])[0]
    assert np.allclose(cut.data[0].embedding, expected, atol=1e-6)


@pytest.mark.parametrize("kind", ["query", "passage"])
def test_input_type_writes_the_encoder_s_prompt_before_each_text(
    service: Service, encoder: Encoder, kind: str
) -> None:
    """As sentence-transformers' encode(prompt_name=kind): the prompt's text, then the input's;
    its tokens are read and counted. Without input_type the texts are read as sent."""
    reply = post(service, {"input": TEXTS, "input_type": kind}).json()
    got = np.array([item["embedding"] for item in reply["data"]], dtype=np.float32)
    ids = encoder.tokenize([PROMPTS[kind] + text for text in TEXTS])
    assert np.allclose(got, encoder.encode(ids), atol=1e-6)
    assert reply["usage"]["prompt_tokens"] == sum(len(one) for one in ids)
    bare = post(service, {"input": TEXTS}).json()
    assert bare["usage"]["prompt_tokens"] == reply["usage"]["prompt_tokens"] - 2 * len(TEXTS)
    plain = encoder.encode(encoder.tokenize(TEXTS))
    assert np.allclose([item["embedding"] for item in bare["data"]], plain, atol=1e-6)
    assert not np.allclose(got, plain, atol=1e-3)


def test_the_prompt_s_tokens_count_against_the_limit(service: Service) -> None:
    """32 tokens fit the tiny encoder; the same text after "passage: " is 34, refused, or cut
    to 32 with the prompt kept (the cut keeps the head, where the prompt is)."""
    full = "cat " * 30  # [CLS], 30 words, [SEP]
    assert post(service, {"input": full}).status_code == 200
    refused = post(service, {"input": full, "input_type": "passage"})
    assert refused.status_code == 400 and "input 0 has 34 tokens" in error(refused)["message"]
    cut = post(service, {"input": full, "input_type": "passage", "truncate_prompt_tokens": -1})
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == 32


def test_a_lone_surrogate_and_bytes_that_are_not_utf8(service: Service) -> None:
    surrogate = httpx.post(
        service.url + "/v1/embeddings",
        content=b'{"input": ["fine", "\\ud800"]}',
        headers=HEADERS | {"Content-Type": "application/json"},
    )
    assert surrogate.status_code == 400 and "lone surrogate" in error(surrogate)["message"]
    latin1 = httpx.post(
        service.url + "/v1/embeddings",
        content='{"input": "caf\u00e9"}'.encode("latin-1"),
        headers=HEADERS | {"Content-Type": "application/json"},
    )
    assert latin1.status_code == 400 and error(latin1)["code"] == "invalid_encoding"


def test_a_body_over_embed_max_body_bytes_is_413(service: Service) -> None:
    response = post(service, {"input": ["cat " * 5] * 280 + ["x" * 8 * 1024 * 1024]})
    assert response.status_code == 413


def test_a_word_without_separators_counts_as_the_tokens_of_its_pieces(
    client: OpenAI, service: Service, encoder: Encoder
) -> None:
    """Issue 58: a word longer than WordPiece's 100 characters was one [UNK] (a 7 MB word was
    3 tokens): now each 100 characters are read as a word of their own, and counted."""
    word = "x" * 150
    ids = encoder.tokenize([word])[0]
    assert len(ids) == 152 and 1 not in ids  # [CLS], x, ##x (99), x, ##x (49), [SEP]; no [UNK]
    refused = post(service, {"input": word})
    assert error(refused)["code"] == "context_length_exceeded"
    assert "input 0 has 152 tokens" in error(refused)["message"]
    cut = client.embeddings.create(
        model="m", input=word, encoding_format="float", extra_body={"truncate_prompt_tokens": -1}
    )
    assert cut.usage.prompt_tokens == 32
    assert np.allclose(cut.data[0].embedding, encoder.encode([encoder.cut(ids, 32)])[0], atol=1e-6)


def test_truncation_cuts_a_text_over_the_bound_of_characters_before_tokenizing(
    client: OpenAI, encoder: Encoder
) -> None:
    long = "cat " * 2000  # 8,000 characters: over 3,200, so refused without truncation
    cut = client.embeddings.create(
        model="m", input=long, encoding_format="float", extra_body={"truncate_prompt_tokens": -1}
    )
    assert cut.usage.prompt_tokens == 32
    expected = encoder.encode([encoder.cut(encoder.tokenize([long])[0], 32)])[0]
    assert np.allclose(cut.data[0].embedding, expected, atol=1e-6)


def test_six_huge_inputs_at_once_are_refused_without_tokenizing_and_chat_goes_on(
    service: Service,
) -> None:
    """Issue 58: a 7 MB input was tokenized whole before its length was checked, outside the
    queue (3.6 GB at its peak, 2.4 GB kept; three at once, 10 GB). Now its characters are
    counted first: the sidecar's memory grows by the bodies only, and gives them back."""
    process = psutil.Process(service.process.pid)
    before = process.memory_info().rss
    peak = before
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.wait(0.005):
            peak = max(peak, process.memory_info().rss)

    def chat() -> httpx.Response:
        body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
        url = service.url + "/v1/chat/completions"
        return httpx.post(url, json=body, headers=HEADERS, timeout=60)

    bodies = [{"input": "x" * 7_000_000}, {"input": ["cat " * 1_750_000]}] * 3
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(7) as pool:
            talk = pool.submit(chat)
            answers = list(pool.map(lambda body: post(service, body), bodies))
            said = talk.result()
    finally:
        done.set()
        watcher.join()
    for answer in answers:
        assert error(answer)["code"] == "too_many_characters", answer.text[:300]
        assert error(answer)["limit_chars"] == 3200
    assert said.status_code == 200 and said.json()["usage"]["completion_tokens"] > 0
    mb = 1024 * 1024
    assert (peak - before) / mb < 500
    assert (process.memory_info().rss - before) / mb < 100


def test_the_api_key_is_required(service: Service) -> None:
    response = httpx.post(service.url + "/v1/embeddings", json={"input": "a"})
    assert response.status_code == 401


def test_models_list_the_encoder_and_readyz_says_embeddings_are_served(
    client: OpenAI, service: Service, tiny_encoder_dir: Path
) -> None:
    models = {m.id: m for m in client.models.list()}
    encoder = models[tiny_encoder_dir.name]
    assert encoder.model_extra is not None
    assert encoder.model_extra["type"] == "embedding"
    assert encoder.model_extra["dimensions"] == 32
    assert encoder.model_extra["prompts"] == PROMPTS  # what input_type writes
    assert client.models.retrieve(tiny_encoder_dir.name).id == tiny_encoder_dir.name
    ready = httpx.get(service.url + "/readyz").json()["embeddings"]
    assert ready == {
        "served": True,
        "phase": "ready",
        "model": tiny_encoder_dir.name,
        "reason": None,
        "dimensions": 32,
        "max_input_tokens": 32,
    }


def test_the_encoder_s_own_tokenizer_json_is_served_behind_the_key(
    service: Service, tiny_encoder_dir: Path
) -> None:
    """What the app sizes passages with where it shares no folder with the sidecar
    (chatapp/documents/sizing.py): the file the encoder loaded, named by /v1/models."""
    import hashlib

    own = (tiny_encoder_dir / "tokenizer.json").read_bytes()
    digest = hashlib.sha256(own).hexdigest()
    listed = httpx.get(service.url + "/v1/models", headers=HEADERS).json()["data"]
    encoder = next(m for m in listed if m.get("type") == "embedding")
    assert encoder["tokenizer"] == {"url": "/v1/embeddings/tokenizer", "sha256": digest}
    assert encoder["max_input_tokens"] == 32
    url = service.url + encoder["tokenizer"]["url"]
    response = httpx.get(url, headers=HEADERS)
    assert response.status_code == 200 and response.content == own
    assert response.headers["content-type"] == "application/json"
    assert response.headers["etag"] == f'"{digest}"'
    assert response.headers["x-max-input-tokens"] == "32"
    again = httpx.get(url, headers=HEADERS | {"If-None-Match": f'"{digest}"'})
    assert again.status_code == 304 and again.content == b""
    assert httpx.get(url).status_code == 401


def test_the_log_line_and_metrics_count_inputs_and_tokens(service: Service) -> None:
    response = post(service, {"input": TEXTS}, **{"X-Request-Id": "embed-log-1"})
    line = services.request_line(service, "embed-log-1")
    assert line["embedding_inputs"] == 3 and line["status"] == 200
    assert line["prompt_tokens"] == response.json()["usage"]["prompt_tokens"]
    assert "The cat" not in str(line)  # never the text
    metrics = httpx.get(service.url + "/metrics").text
    assert 'sidecar_embedding_requests_total{outcome="ok"}' in metrics
    inputs = next(x for x in metrics.splitlines() if x.startswith("sidecar_embedding_inputs_total"))
    assert float(inputs.split()[-1]) >= 3


def test_a_chat_and_an_index_run_at_once_both_finish_whole(service: Service) -> None:
    chunks = [f"chunk {n} of a long document about paris and france" for n in range(300)]

    def chat() -> dict[str, Any]:
        body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 40}
        reply = httpx.post(
            service.url + "/v1/chat/completions", json=body, headers=HEADERS, timeout=120
        )
        return dict(reply.json())

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        index = pool.submit(post, service, {"input": chunks})
        talk = pool.submit(chat)
        indexed, said = index.result(), talk.result()
    assert indexed.status_code == 200
    assert [d["index"] for d in indexed.json()["data"]] == list(range(300))
    assert said["choices"][0]["finish_reason"] in ("stop", "length")
    assert said["usage"]["completion_tokens"] > 0


def test_without_an_encoder_the_route_says_so(sidecar_service: Service) -> None:
    response = httpx.post(sidecar_service.url + "/v1/embeddings", json={"input": "a"})
    assert response.status_code == 400
    assert error(response)["code"] == "embeddings_not_served"
    assert "EMBED_MODEL_PATH" in error(response)["message"]
    tokenizer = httpx.get(sidecar_service.url + "/v1/embeddings/tokenizer")
    assert tokenizer.status_code == 400
    assert error(tokenizer)["code"] == "embeddings_not_served"
    assert httpx.get(sidecar_service.url + "/readyz").json()["embeddings"] == {
        "served": False,
        "phase": "off",
    }


def test_an_encoder_that_fails_to_load_is_said_and_chat_goes_on(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken-encoder"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{}")
    with services.sidecar(tiny_model_dir, tmp_path / "log", EMBED_MODEL_PATH=str(broken)) as side:
        with pytest.raises(RuntimeError, match="failed"):
            services.wait_for_embeddings(side)
        ready = httpx.get(side.url + "/readyz")
        assert ready.status_code == 200  # the chat model is ready: readiness is about it
        state = ready.json()["embeddings"]
        assert state["phase"] == "failed" and "onnx/model.onnx" in state["reason"]
        refused = httpx.post(side.url + "/v1/embeddings", json={"input": "a"})
        assert refused.status_code == 503 and error(refused)["phase"] == "failed"
        chat = httpx.post(
            side.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
            timeout=60,
        )
        assert chat.status_code == 200
        assert "embedding model failed to load" in side.log()


def test_render_cuts_a_matryoshka_vector_and_makes_it_unit_length_again() -> None:
    import json

    from sidecar.web.embeddings.api import render

    vectors = np.array([[3.0, 4.0, 12.0], [1.0, 0.0, 0.0]], dtype=np.float32)
    body = json.loads(render(vectors, 2, "float", "enc", 7))
    assert body["data"][0]["embedding"] == pytest.approx([0.6, 0.8])
    assert body["data"][1]["embedding"] == [1.0, 0.0]
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7} and body["model"] == "enc"
    whole = json.loads(render(vectors, 3, "base64", "enc", 7))["data"][0]["embedding"]
    assert np.frombuffer(base64.b64decode(whole), "<f4").tolist() == [3.0, 4.0, 12.0]


def test_a_client_that_leaves_cancels_its_request() -> None:
    """The route gives up on the vectors when the connection says http.disconnect, and the
    cancellation reaches the pool's future (its queued batches are then skipped)."""
    import asyncio
    from concurrent.futures import Future

    from starlette.requests import Request

    from sidecar.web.embeddings.api import _unless_gone

    async def scenario() -> tuple[object, bool]:
        pending: Future[np.ndarray] = Future()

        async def receive() -> dict[str, str]:
            await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        request = Request({"type": "http", "method": "POST", "headers": []}, receive)
        result = await _unless_gone(request, asyncio.wrap_future(pending))
        await asyncio.sleep(0)  # the cancellation travels to the concurrent future
        return result, pending.cancelled()

    assert asyncio.run(scenario()) == (None, True)
