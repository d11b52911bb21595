"""MODELS_FILE (web/models/registry.py): the tables read, every mistake one clear sentence, names
resolved by id and alias, each model's worker settings its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.settings import Settings
from sidecar.web.errors import ApiError
from sidecar.web.models.registry import RegistryError, load_registry

TWO = """
[[models]]
id = "chat"
path = "{folder}"
aliases = ["phi3", "default"]
pinned = true

[[models]]
id = "fast"
path = "phi3-mini-4k-cpu"
system_prompt = "Be brief."
temperature = 0.5
idle_unload_s = 60
kv_memory_mb = 256
passage_kv_mb = 0
"""


def registry_of(tmp_path: Path, text: str, **settings: object):  # type: ignore[no-untyped-def]
    file = tmp_path / "models.toml"
    file.write_text(text)
    return load_registry(Settings(models_file=file, **settings))  # type: ignore[arg-type]


def test_models_are_found_by_id_and_alias_and_unknown_names_are_404(tmp_path: Path) -> None:
    registry = registry_of(
        tmp_path, TWO.format(folder=tmp_path), prompt_cache_dir=tmp_path / "cache"
    )
    chat, fast = registry.entries
    assert registry.default is chat and registry.resolve(None) is chat
    assert registry.resolve("phi3") is chat and registry.resolve("fast") is fast
    with pytest.raises(ApiError) as refused:
        registry.resolve("gpt-4o")
    assert refused.value.status == 404 and refused.value.reason == "model_not_found"
    assert "chat, fast" in refused.value.message
    # Each worker's own: its folder, its name, its bounds, its cache folder
    assert chat.settings.model_path == tmp_path and chat.settings.served_model_name == "chat"
    assert fast.settings.model_path.name == "phi3-mini-4k-cpu"  # the catalog's folder
    assert fast.settings.model_repo_id.startswith("microsoft/")
    assert fast.settings.prompt_cache_dir == tmp_path / "cache" / "fast"
    assert fast.settings.kv_memory_mb == 256 and fast.settings.passage_kv_mb == 0
    assert fast.booked_bytes == 256 * 2**20
    assert (fast.system_prompt, fast.temperature, fast.idle_unload_s) == ("Be brief.", 0.5, 60)
    # Several models: their workers do not spin (a hand-over's cost), unless a table says so
    assert not chat.settings.thread_spinning and not fast.settings.thread_spinning
    one = registry_of(tmp_path, TWO.format(folder=tmp_path).split('[[models]]\nid = "fast"')[0])
    assert one.entries[0].settings.thread_spinning


def test_without_a_file_the_one_model_answers_to_any_name(tmp_path: Path) -> None:
    registry = load_registry(Settings(model_path=tmp_path / "phi3"))
    (only,) = registry.entries
    assert only.id == "phi3" and only.pinned and not registry.strict
    assert registry.resolve("gpt-4o") is only


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[[models]\nid=", "not TOML"),
        ('[[models]]\nid = "a"\npath = "/x"\n', "pins no model"),
        ('[[models]]\nid = "a"\npath = "/x"\npinned = true\ncolour = "red"\n', "models.0.colour"),
        ('[[models]]\nid = "a b"\npath = "/x"\npinned = true\n', "models.0.id"),
        (
            '[[models]]\nid = "a"\npath = "/x"\npinned = true\n'
            '[[models]]\nid = "b"\npath = "/y"\naliases = ["a"]\n',
            "names 'a' twice",
        ),
        ('[[models]]\nid = "a"\npath = "/x"\npinned = true\ntemperature = 3.0\n', "temperature"),
        ("models = []", "models"),
    ],
)
def test_every_mistake_is_one_sentence(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(RegistryError, match="MODELS_FILE") as refused:
        registry_of(tmp_path, text)
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_a_missing_file_is_said(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="cannot be read"):
        load_registry(Settings(models_file=tmp_path / "none.toml"))
