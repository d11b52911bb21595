"""The real encoder: all-MiniLM-L6-v2 built from its PyPI wheel (scripts/models/make_real_model.py
--model all-minilm-l6-v2), served by the real sidecar beside the tiny chat model, called with
the official `openai` SDK; its vectors agree with the PyTorch model's own (sentence-transformers'
pooling, done with transformers and torch: realmodel/encoder.py's torch_vectors), and mean what
they should (a paraphrase is nearer than another subject)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from openai import OpenAI

from scripts.models.realmodel.encoder import MIN_COSINE, torch_vectors
from scripts.models.realmodel.sources import ALL_MINILM_L6_V2
from scripts.run import services

pytestmark = pytest.mark.realmodel

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / "build" / "real-models"
TEXTS = [
    "A cat is sitting on the mat.",
    "The kitten sat on a rug.",
    "Stock markets fell sharply after the central bank raised interest rates.",
    "Paris is the capital of France.",
]


def build() -> subprocess.CompletedProcess[str]:
    model = ALL_MINILM_L6_V2
    command = [sys.executable, "-m", "scripts.models.make_real_model", "--model", model.name]
    command += ["--out", str(WORK / model.name), "--work-dir", str(WORK)]
    return subprocess.run(command, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    """Built once under build/real-models (kept by its stamps); a skip without the registry and
    without a kept wheel, a failure on CI (as the SmolLM2 fixture)."""
    result = build()
    if result.returncode != 0:
        message = f"scripts.models.make_real_model failed: {result.stderr.strip()}"
        if os.environ.get("CI") or "could not be reached" not in result.stderr:
            pytest.fail(message + "\n" + result.stdout[-3000:])
        pytest.skip(message)
    return WORK / ALL_MINILM_L6_V2.name


@pytest.fixture(scope="module")
def sidecar(
    minilm_dir: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-minilm.log"
    with services.sidecar(tiny_model_dir, log, EMBED_MODEL_PATH=str(minilm_dir)) as service:
        services.wait_for_embeddings(service)
        yield service


@pytest.fixture
def client(sidecar: services.Service) -> Iterator[OpenAI]:
    with OpenAI(base_url=sidecar.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def st_folder() -> Path:
    return WORK / f"{ALL_MINILM_L6_V2.name}-st"


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    result: np.ndarray = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return result


def test_the_sdk_s_vectors_agree_with_pytorch_in_both_formats(client: OpenAI) -> None:
    reference = torch_vectors(st_folder(), TEXTS)
    default = client.embeddings.create(model="all-minilm-l6-v2", input=TEXTS)  # base64
    floats = client.embeddings.create(
        model="all-minilm-l6-v2", input=TEXTS, encoding_format="float"
    )
    for reply in (default, floats):
        got = np.array([d.embedding for d in reply.data], dtype=np.float32)
        assert got.shape == (4, 384)
        assert cosines(got, reference).min() >= MIN_COSINE
    assert reply.model == "all-minilm-l6-v2"


def test_a_paraphrase_is_nearer_than_another_subject(client: OpenAI) -> None:
    reply = client.embeddings.create(model="m", input=TEXTS)
    cat, kitten, stocks, _ = (np.array(d.embedding) for d in reply.data)
    assert float(cat @ kitten) > float(cat @ stocks) + 0.3


def test_token_ids_and_the_256_token_limit(client: OpenAI, sidecar: services.Service) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(st_folder() / "tokenizer.json"))
    tokenizer.no_truncation()  # the file itself truncates and pads to 128 tokens
    tokenizer.no_padding()
    ids = tokenizer.encode(TEXTS[0]).ids
    by_ids = client.embeddings.create(model="m", input=[ids], encoding_format="float")
    by_text = client.embeddings.create(model="m", input=TEXTS[0], encoding_format="float")
    assert by_ids.data[0].embedding == by_text.data[0].embedding
    long = "word " * 300
    refused = httpx.post(sidecar.url + "/v1/embeddings", json={"input": long})
    assert refused.status_code == 400
    assert refused.json()["error"]["limit_tokens"] == 256
    cut = client.embeddings.create(model="m", input=long, extra_body={"truncate_prompt_tokens": -1})
    assert cut.usage.prompt_tokens == 256
    # PyTorch's tokenizer with sentence-transformers' truncation at max_seq_length
    reference = torch_vectors(st_folder(), [long])
    got = np.array([cut.data[0].embedding], dtype=np.float32)
    assert cosines(got, reference).min() >= MIN_COSINE


def test_a_second_build_keeps_what_it_made(minilm_dir: Path) -> None:
    result = build()
    assert result.returncode == 0, result.stderr
    assert f"kept the encoder folder {minilm_dir}" in result.stdout
