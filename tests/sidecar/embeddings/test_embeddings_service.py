"""sidecar/embeddings/service.py and catalog.py: EMBED_MODEL_ID's defaults, and a catalog
encoder fetched from the Hub (a local stand-in) at start, as the chat model is with
MODEL_DOWNLOAD; without MODEL_DOWNLOAD, the phase says what to set."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from scripts.run import services
from sidecar.embeddings import catalog
from sidecar.embeddings.service import Embeddings
from sidecar.settings import Settings
from tests.models.fake_hub import FakeHub


def test_embed_model_id_sets_the_folder_and_the_name() -> None:
    settings = Settings(embed_model_id="bge-small-en-v1.5")
    assert settings.embed_model_path == Path("/home/models/bge-small-en-v1.5")
    assert Embeddings(settings).name == "bge-small-en-v1.5"
    mine = Settings(embed_model_id="bge-small-en-v1.5", embed_model_path=Path("/srv/enc"))
    assert mine.embed_model_path == Path("/srv/enc")
    with pytest.raises(ValidationError, match="not in the catalog"):
        Settings(embed_model_id="text-embedding-3-small")


def test_matryoshka_comes_from_the_catalog_unless_set() -> None:
    assert Embeddings(Settings(embed_model_id="nomic-embed-text-v1.5")).matryoshka is True
    assert Embeddings(Settings(embed_model_id="all-minilm-l6-v2")).matryoshka is False
    assert Embeddings(Settings(embed_model_path=Path("x"), embed_matryoshka=True)).matryoshka


def test_no_encoder_is_off_and_starts_nothing() -> None:
    embeddings = Embeddings(Settings())
    embeddings.start()
    assert embeddings.phase.name == "off" and embeddings.model_object() is None
    assert embeddings.readiness() == {"served": False, "phase": "off"}


def test_a_catalog_encoder_is_downloaded_at_start(
    tiny_model_dir: Path, tiny_encoder_dir: Path, tmp_path: Path
) -> None:
    entry = catalog.DEFAULT
    files = {
        str(p.relative_to(tiny_encoder_dir)): p.read_bytes()
        for p in sorted(tiny_encoder_dir.rglob("*"))
        if p.is_file()
    }
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    with FakeHub(entry.repo_id, files) as hub:
        target = tmp_path / "encoder"
        environ |= {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "home")}
        with services.sidecar(
            tiny_model_dir,
            tmp_path / "log",
            env=environ,
            MODEL_DOWNLOAD="1",
            MODEL_SUBFOLDER="",  # the chat model is the folder itself: nothing to fetch
            EMBED_MODEL_ID=entry.name,
            EMBED_MODEL_PATH=str(target),
        ) as side:
            state = services.wait_for_embeddings(side)
            assert state["model"] == entry.name and state["dimensions"] == 32
            assert "onnx/model.onnx" in hub.downloads
            reply = httpx.post(side.url + "/v1/embeddings", json={"input": "hello"}, timeout=30)
            assert reply.status_code == 200 and reply.json()["model"] == entry.name
    assert (target / "onnx" / "model.onnx").is_file()


def test_without_model_download_the_phase_says_what_to_set(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with services.sidecar(
        tiny_model_dir,
        tmp_path / "log",
        EMBED_MODEL_ID="bge-small-en-v1.5",
        EMBED_MODEL_PATH=str(tmp_path / "none"),
    ) as side:
        with pytest.raises(RuntimeError, match="failed"):
            services.wait_for_embeddings(side)
        state = httpx.get(side.url + "/readyz").json()["embeddings"]
        assert "MODEL_DOWNLOAD=1" in state["reason"]
