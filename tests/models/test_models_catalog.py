"""The model catalog (sidecar/catalog.py): its entries, `phi3-download --list` and `--model`,
and MODEL_ID in the sidecar's settings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from sidecar import catalog
from sidecar.settings import Settings
from tests.models.fake_hub import FakeHub
from tests.models.test_models_download import run


def test_the_default_is_phi3_mini_int4_cpu_in_its_usual_folder() -> None:
    assert catalog.DEFAULT.name == "phi3-mini-4k-int4-cpu"
    assert catalog.DEFAULT.folder == "phi3-mini-4k-instruct-int4"
    assert catalog.DEFAULT.device == "cpu" and catalog.DEFAULT.size_exact


@pytest.mark.parametrize("entry", catalog.ENTRIES.values(), ids=lambda e: e.name)
def test_every_entry_is_complete(entry: catalog.CatalogEntry) -> None:
    assert re.fullmatch(r"[a-z0-9][a-z0-9.-]+", entry.name)
    assert re.fullmatch(r"[\w.-]+/[\w.-]+", entry.repo_id)
    assert entry.subfolder and not entry.subfolder.startswith("/")
    assert entry.device in ("cpu", "cuda")
    assert entry.size_bytes > 10**8 and entry.context_length >= 4096
    assert entry.licence in ("MIT", "Apache-2.0")
    assert "genai_config.json" in entry.files and entry.source and entry.revision
    assert entry.size_text.endswith("GB")


def test_vision_entries_name_their_processor_configuration() -> None:
    vision = [e for e in catalog.ENTRIES.values() if e.images]
    assert {e.name for e in vision} >= {"phi3.5-vision-int4-cpu"}
    for entry in vision:
        assert "processor_config.json" in entry.files and entry.device == "cpu"
    assert not catalog.DEFAULT.images


def test_names_and_folders_are_unique() -> None:
    entries = list(catalog.ENTRIES.values())
    assert len({e.folder for e in entries}) == len({e.name for e in entries}) == len(entries)
    assert len({(e.repo_id, e.subfolder) for e in entries}) == len(entries)


def test_list_prints_every_entry() -> None:
    result = run("--list")
    assert result.returncode == 0, result.stderr
    for entry in catalog.ENTRIES.values():
        assert entry.name in result.stdout and entry.subfolder in result.stdout


def test_model_downloads_the_catalog_entry(tiny_model_dir: Path, tmp_path: Path) -> None:
    entry = catalog.ENTRIES["phi4-mini-int4-cpu"]
    with FakeHub.from_folder(entry.repo_id, tiny_model_dir, entry.subfolder) as hub:
        result = run("--model", entry.name, "--out", str(tmp_path / "m"), HF_ENDPOINT=hub.url)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == tmp_path / "m" / entry.subfolder


def test_an_unknown_model_is_refused_with_the_known_names() -> None:
    result = run("--model", "gpt-5")
    assert result.returncode == 2 and "phi3-mini-4k-int4-cpu" in result.stderr


def test_model_id_sets_repository_folder_and_path() -> None:
    entry = catalog.ENTRIES["mistral-7b-v0.2-int4-cpu"]
    settings = Settings(model_id=entry.name)
    assert (settings.model_repo_id, settings.model_subfolder) == (entry.repo_id, entry.subfolder)
    assert settings.model_path == Path("/home/models") / entry.folder
    assert settings.served_model_name == entry.folder
    # The variables themselves still win.
    custom = Settings(model_id=entry.name, model_repo_id="me/mine", model_path=Path("/m"))
    assert (custom.model_repo_id, custom.model_subfolder) == ("me/mine", entry.subfolder)
    assert custom.model_path == Path("/m")


def test_an_unknown_model_id_is_an_invalid_setting() -> None:
    with pytest.raises(ValidationError, match="MODEL_ID 'nope' is not in the catalog; known: "):
        Settings(model_id="nope")
