"""Passages sized by the encoder's own tokenizer with no shared folder (documents/sizing.py):
fetched from a real sidecar's GET /v1/embeddings/tokenizer and used by the app's indexer; a
server that cannot say gives the byte bound, with its reason on /healthz; a file that is not
what was listed is never used."""

from __future__ import annotations

import hashlib
import io
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask

from chatapp import create_app
from chatapp.documents import sizing
from chatapp.documents.reading.chunker import chunk
from chatapp.documents.reading.formats import Limits, read
from chatapp.documents.reading.tokens import ByteBound, EncoderTokens
from chatapp.documents.sizing import Measure, PassageSizing
from scripts.run.services import Service
from tests.chatapp.fake_sidecar import FakeSidecar

FILES = Path(__file__).parent / "files"
USER = {"X-MS-CLIENT-PRINCIPAL-ID": "alice-oid", "X-MS-CLIENT-PRINCIPAL-NAME": "Alice"}
URL = "/v1/embeddings/tokenizer"


@pytest.fixture
def app(encoder_sidecar: Service, tmp_path: Path) -> Iterator[Flask]:
    """The app as a deployment that shares no folder with its sidecar: no EMBED_TOKENIZER,
    EMBED_MAX_TOKENS left at its default (256, above the tiny encoder's 32)."""
    app = create_app(
        {
            "TESTING": True,
            "DATA_DIR": str(tmp_path),
            "DATABASE_URL": f"sqlite:///{tmp_path / 'app.db'}",
            "SIDECAR_URL": encoder_sidecar.url,
            "EMBED_MODEL": "tiny",
            "AUTH_MODE": "appservice",
        }
    )
    yield app
    app.extensions["documents"].close()
    app.extensions["store"].close()


def test_the_sidecar_s_tokenizer_sizes_the_app_s_passages_with_no_shared_folder(
    app: Flask, tiny_encoder_dir: Path, tmp_path: Path
) -> None:
    client = app.test_client()
    passages = client.get("/healthz").get_json()["documents"]["passages"]
    assert passages == {"counted_by": "encoder", "max_tokens": 32}  # the encoder's own limit
    own = (tiny_encoder_dir / "tokenizer.json").read_bytes()
    kept = tmp_path / "encoder-tokenizers" / f"{hashlib.sha256(own).hexdigest()}.json"
    assert kept.read_bytes() == own
    data = (FILES / "guide.md").read_bytes()
    response = client.post(
        "/api/documents",
        data={"file": [(io.BytesIO(data), "guide.md")]},
        headers=USER,
        content_type="multipart/form-data",
    )
    assert response.status_code == 202
    deadline = time.monotonic() + 60
    while (document := client.get("/api/documents", headers=USER).get_json()["documents"][0])[
        "status"
    ] not in ("ready", "failed") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert document["status"] == "ready"
    _, blocks = read(data, "guide.md", None, Limits(1_000_000, 50))
    exact = chunk(blocks, EncoderTokens(tiny_encoder_dir), 32)
    assert document["chunks"] == len(exact) < len(chunk(blocks, ByteBound(), 32))


def test_an_openai_server_that_lists_no_tokenizer_gives_the_byte_bound_and_says_why(
    fake: FakeSidecar, tmp_path: Path
) -> None:
    """vLLM lists its encoder's `max_model_len`: the limit is taken, the count cannot be."""
    fake.models = (200, {"data": [{"id": "all-minilm-l6-v2", "max_model_len": 128}]})
    measure = PassageSizing(
        max_tokens=256, base_url=fake.url + "/v1", model="all-minilm-l6-v2", folder=tmp_path
    ).current()
    reason = "the model service does not give its encoder's tokenizer"
    assert measure == Measure("byte_bound", None, 128, reason)


@pytest.mark.parametrize(
    ("listed", "reason"),
    [
        ({"ready": False}, "the encoder is still loading"),
        ({"tokenizer": {"url": URL, "sha256": "0" * 64}}, "did not match its sha256"),
        ({"tokenizer": {"url": "http://elsewhere/t.json", "sha256": "0" * 64}}, "not readable"),
        ({"tokenizer": {"url": "/missing", "sha256": "0" * 64}}, "answered 404 to /missing"),
    ],
)
def test_a_tokenizer_the_app_cannot_trust_is_never_used(
    fake: FakeSidecar, tmp_path: Path, wordpiece_dir: Path, listed: dict[str, object], reason: str
) -> None:
    fake.files[URL] = (wordpiece_dir / "tokenizer.json").read_bytes()
    entry = {"id": "encoder", "type": "embedding", "max_input_tokens": 64, **listed}
    fake.models = (200, {"data": [{"id": "fake-model"}, entry]})
    measure = PassageSizing(max_tokens=256, base_url=fake.url, folder=tmp_path).current()
    assert (measure.counted_by, measure.tokenizer, measure.max_tokens) == ("byte_bound", None, 64)
    assert measure.reason is not None and reason in measure.reason
    assert not list(tmp_path.iterdir())  # nothing kept


def test_garbage_under_the_right_sha256_is_not_used(fake: FakeSidecar, tmp_path: Path) -> None:
    garbage = b'{"not": "a tokenizer"}'
    fake.files[URL] = garbage
    tokenizer = {"url": URL, "sha256": hashlib.sha256(garbage).hexdigest()}
    fake.models = (200, {"data": [{"id": "e", "type": "embedding", "tokenizer": tokenizer}]})
    measure = PassageSizing(max_tokens=256, base_url=fake.url, folder=tmp_path).current()
    assert measure.reason == "the encoder's tokenizer cannot be read by this app"


def test_the_service_is_asked_again_and_the_count_follows_it(
    fake: FakeSidecar, tmp_path: Path, wordpiece_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An encoder that finished loading (or a sidecar restarted with another): the next ask
    takes its tokenizer, and counting uses it from then on."""
    monkeypatch.setattr(sizing, "RETRY_S", 0.0)
    fake.models = (200, {"data": [{"id": "e", "type": "embedding", "ready": False}]})
    passages = PassageSizing(max_tokens=16, base_url=fake.url, folder=tmp_path)
    text = "the kettle boils a litre of water"
    assert passages.count(text) == ByteBound().count(text)
    own = (wordpiece_dir / "tokenizer.json").read_bytes()
    fake.files[URL] = own
    tokenizer = {"url": URL, "sha256": hashlib.sha256(own).hexdigest()}
    fake.models = (200, {"data": [{"id": "e", "type": "embedding", "tokenizer": tokenizer}]})
    assert passages.count(text) == EncoderTokens(wordpiece_dir).count(text) < len(text)
    assert passages.current() == Measure(
        "encoder", str(tmp_path / f"{tokenizer['sha256']}.json"), 16
    )


def test_without_a_model_service_or_with_the_setting_nothing_is_asked(
    wordpiece_dir: Path,
) -> None:
    assert PassageSizing(max_tokens=100).current().reason == "no model service"
    set_by_hand = PassageSizing(max_tokens=100, tokenizer=str(wordpiece_dir), base_url="http://x")
    assert set_by_hand.current() == Measure("setting", str(wordpiece_dir), 100)


PROMPTS = {"query": "the kettle: ", "passage": "a litre: "}  # 3 tokens each here


def test_the_prompts_the_sidecar_lists_leave_passages_and_questions_their_room(
    fake: FakeSidecar, tmp_path: Path, wordpiece_dir: Path
) -> None:
    """Issue 55: an encoder with prompts (e5's "query: ", "passage: ") reads each input after
    its prompt, so a passage has the limit less its prompt's tokens, a question the limit less
    the query's; with EMBED_MAX_TOKENS below that room the prompts change nothing."""
    own = (wordpiece_dir / "tokenizer.json").read_bytes()
    fake.files[URL] = own
    tokenizer = {"url": URL, "sha256": hashlib.sha256(own).hexdigest()}
    prompts = PROMPTS | {"query": "the kettle boils: "}  # 4 tokens
    entry = {"id": "e", "type": "embedding", "max_input_tokens": 64, "prompts": prompts}
    fake.models = (200, {"data": [entry | {"tokenizer": tokenizer}]})
    measure = PassageSizing(max_tokens=256, base_url=fake.url, folder=tmp_path, prompted=True)
    assert measure.current().public() == {
        "counted_by": "encoder",
        "max_tokens": 61,
        "prompt_tokens": {"query": 4, "passage": 3},
    }
    assert measure.current().question_limit == 60
    roomy = PassageSizing(max_tokens=32, base_url=fake.url, folder=tmp_path, prompted=True)
    assert (roomy.current().max_tokens, roomy.current().question_limit) == (32, 32)
    # UPSTREAM_API=openai: the app sends no input_type, so no prompt is written
    unprompted = PassageSizing(max_tokens=256, base_url=fake.url, folder=tmp_path)
    kept = str(tmp_path / f"{tokenizer['sha256']}.json")
    assert unprompted.current() == Measure("encoder", kept, 64)


def test_an_encoder_folder_s_prompts_count_with_the_setting(
    wordpiece_dir: Path, tmp_path: Path
) -> None:
    """EMBED_TOKENIZER names the sidecar's folder: its config_sentence_transformers.json says
    the prompts, its sentence_bert_config.json the limit."""
    import json
    import shutil

    folder = tmp_path / "encoder"
    shutil.copytree(wordpiece_dir, folder)
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40}))
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": PROMPTS}))
    measure = PassageSizing(max_tokens=256, tokenizer=str(folder), prompted=True).current()
    assert (measure.counted_by, measure.max_tokens, measure.question_limit) == ("setting", 37, 37)
    assert measure.prompt_tokens == {"query": 3, "passage": 3}
    assert PassageSizing(max_tokens=256, tokenizer=str(folder)).current().max_tokens == 40


def test_a_prompt_s_tokens_are_never_undercounted(wordpiece_dir: Path) -> None:
    """What a prompt ending in a space adds before a word, or its own tokens, whichever is
    more: e5's "query: " is 3 before a text and 4 alone (the space's own token at the end)."""
    from chatapp.documents.reading.tokens import prompt_tokens

    counter = EncoderTokens(wordpiece_dir)
    assert prompt_tokens(counter, "") == 0
    assert prompt_tokens(counter, "the kettle: ") == 3

    class EndsInASpaceToken:  # Metaspace's count of e5's "query: " alone and before a word
        def count(self, text: str) -> int:
            return {"query: ": 6, "": 2, "query: x": 6, "x": 3}[text]

    assert prompt_tokens(EndsInASpaceToken(), "query: ") == 4
