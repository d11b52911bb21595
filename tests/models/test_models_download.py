"""scripts/models/download_model.py and sidecar.model.download, against a local fake Hub or no Hub at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.model.download import DEFAULT_REPO_ID, DEFAULT_SUBFOLDER, download_model, is_complete
from tests.models.fake_hub import FakeHub
from scripts.run.services import free_port

SCRIPT = ["-m", "scripts.models.download_model"]
GRAPH = "model.onnx"


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return subprocess.run(
        [sys.executable, *SCRIPT, "--quiet", *args],
        capture_output=True,
        text=True,
        env=environ | env,
        timeout=120,
        check=False,
    )


def assert_one_sentence_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 1 and result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and lines[0].endswith(".")
    for word in words:
        assert word in lines[0]


def fake_model(folder: Path) -> Path:
    """A folder of small files shaped like a complete model folder."""
    folder.mkdir(parents=True)
    config = {"model": {"decoder": {"filename": GRAPH}}}
    (folder / "genai_config.json").write_text(json.dumps(config))
    for name in (GRAPH, f"{GRAPH}.data", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes(b"x")
    return folder


@pytest.fixture
def hub(tiny_model_dir: Path) -> Iterator[FakeHub]:
    with FakeHub.from_folder(DEFAULT_REPO_ID, tiny_model_dir, DEFAULT_SUBFOLDER) as hub:
        yield hub


def test_is_complete_needs_config_graph_weights_and_tokenizer(tmp_path: Path) -> None:
    folder = fake_model(tmp_path / "m")
    assert is_complete(folder)
    (folder / f"{GRAPH}.data").write_bytes(b"")
    assert not is_complete(folder)
    (folder / f"{GRAPH}.data").write_bytes(b"x")
    (folder / "tokenizer.json").unlink()
    assert not is_complete(folder)
    (folder / "tokenizer.json").write_bytes(b"x")
    (folder / "genai_config.json").write_text("{not json")
    assert not is_complete(folder)
    assert not is_complete(tmp_path / "missing")


def test_complete_folder_is_a_no_op_without_network(tmp_path: Path) -> None:
    folder = fake_model(tmp_path / DEFAULT_SUBFOLDER)
    assert download_model(out_dir=tmp_path, progress=False) == folder
    nowhere = f"http://127.0.0.1:{free_port()}"
    result = run("--out", str(tmp_path), HF_ENDPOINT=nowhere)
    assert result.returncode == 0 and result.stdout == f"{folder}\n"


def test_downloads_the_folder_and_prints_its_path(hub: FakeHub, tmp_path: Path) -> None:
    result = run("--out", str(tmp_path), HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "home"))
    assert result.returncode == 0, result.stderr
    folder = tmp_path / DEFAULT_SUBFOLDER
    assert result.stdout == f"{folder}\n" and is_complete(folder)
    assert not (tmp_path / "README.md").exists()  # only the requested folder
    assert len(hub.downloads) == 7

    # A lost file is fetched again, and only that one.
    hub.downloads.clear()
    data = next(folder.glob("*.onnx.data"))
    data.unlink()
    result = run("--out", str(tmp_path), HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "home"))
    assert result.returncode == 0 and data.exists()
    assert hub.downloads == [f"{DEFAULT_SUBFOLDER}/{data.name}"]


def test_missing_repository(hub: FakeHub, tmp_path: Path) -> None:
    result = run("--out", str(tmp_path), "--repo-id", "nobody/nothing", HF_ENDPOINT=hub.url)
    assert_one_sentence_error(result, "nobody/nothing", "does not exist")


def test_missing_folder(hub: FakeHub, tmp_path: Path) -> None:
    result = run("--out", str(tmp_path), "--subfolder", "cpu_and_mobile/nope", HF_ENDPOINT=hub.url)
    assert_one_sentence_error(result, "cpu_and_mobile/nope", "does not exist")
    assert not (tmp_path / "cpu_and_mobile").exists()


def test_missing_revision(hub: FakeHub, tmp_path: Path) -> None:
    result = run("--out", str(tmp_path), "--revision", "v0.0", HF_ENDPOINT=hub.url)
    assert_one_sentence_error(result, "'v0.0'", "does not exist")


def test_folder_without_genai_config(hub: FakeHub, tmp_path: Path) -> None:
    result = run("--out", str(tmp_path), "--subfolder", "", HF_ENDPOINT=hub.url)
    assert_one_sentence_error(result, "genai_config.json")


def test_no_network(tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    result = run("--out", str(tmp_path), HF_ENDPOINT=nowhere)
    assert_one_sentence_error(result, "Cannot reach", nowhere)


def test_offline_mode(tmp_path: Path) -> None:
    assert_one_sentence_error(run("--out", str(tmp_path), HF_HUB_OFFLINE="1"), "Cannot reach")


def test_help_and_bad_arguments() -> None:
    result = run("--help")
    assert result.returncode == 0
    for flag in ("--out", "--repo-id", "--subfolder", "--revision", "HF_TOKEN", "HF_HOME"):
        assert flag in result.stdout
    bad = run("--repo-id", "not-a-repo")
    assert bad.returncode == 2 and "owner/name" in bad.stderr and "Traceback" not in bad.stderr
    assert run("--no-such-flag").returncode == 2
