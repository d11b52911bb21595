"""`python -m scripts.bench`, the one benchmark command: --help names every question, every module
of scripts/bench/ is a question or a declared library, each question builds its options, and a
failed or refused run says so with its exit status (and still writes what it measured)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.bench import __main__ as bench
from scripts.bench.common import BadArguments, Failed
from scripts.run.services import REPO

BENCH = REPO / "scripts" / "bench"


def squeezed(text: str) -> str:
    return "".join(text.split())  # argparse wraps the help lines wherever it likes


def test_help_lists_every_question_with_its_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "scripts.bench", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for command in bench.COMMANDS:
        assert re.search(rf"^ +{command.name}\b", result.stdout, re.M), command.name
        assert squeezed(command.question) in squeezed(result.stdout), command.name
    for library in bench.LIBRARIES:
        assert f"\n  {library} " in result.stdout


def test_every_benchmark_module_is_a_question_or_a_library() -> None:
    """A new benchmark module fails here until __main__.py names it (COMMANDS), or says that it
    is a library of the others (LIBRARIES)."""
    modules = {path.stem for path in BENCH.glob("*.py")} - {"__init__", "__main__"}
    modules |= {path.parent.name for path in BENCH.glob("*/__init__.py")}
    asked = {command.module for command in bench.COMMANDS}
    assert modules - asked - set(bench.LIBRARIES) == set()
    assert asked | set(bench.LIBRARIES) <= modules  # nothing named that is not there
    assert not asked & set(bench.LIBRARIES)
    names = [command.name for command in bench.COMMANDS]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("command", bench.COMMANDS, ids=lambda command: command.name)
def test_each_question_builds_its_options(
    command: bench.Command, capsys: pytest.CaptureFixture[str]
) -> None:
    parser, own = bench.build_parser(command.name)
    assert own is not parser
    with pytest.raises(SystemExit) as done:
        parser.parse_args([command.name, "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert "--json PATH" in shown and squeezed(command.question) in squeezed(shown)
    module = sys.modules[f"scripts.bench.{command.module}"]
    assert callable(module.main) and (module.__doc__ or "?").split("\n")[0] in shown
    assert not hasattr(module, "parse_args")  # one command line: this one


def test_a_question_that_fails_exits_1_and_keeps_what_it_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from scripts.bench import tracing

    def failing(args: object) -> dict[str, object]:
        raise Failed("the third pair never answered", {"pairs": {"off": {"reply_p50_ms": 1.0}}})

    monkeypatch.setattr(tracing, "main", failing)
    out = tmp_path / "tracing.json"
    assert bench.main(["tracing", "--json", str(out)]) == 1
    printed = capsys.readouterr()
    assert "error: the third pair never answered" in printed.err
    assert "# tracing: what tracing costs a chat" in printed.out and "CPUs" in printed.out
    data = json.loads(out.read_text())
    assert data["pairs"] == {"off": {"reply_p50_ms": 1.0}}
    assert data["benchmark"]["command"] == f"python -m scripts.bench tracing --json {out}"


def test_arguments_a_question_refuses_exit_2_with_its_usage(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from scripts.bench import tracing

    def refusing(args: object) -> dict[str, object]:
        raise BadArguments("--rounds must be at least 3")

    monkeypatch.setattr(tracing, "main", refusing)
    with pytest.raises(SystemExit) as done:
        bench.main(["tracing", "--json", "unused.json"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "usage: python -m scripts.bench tracing" in err
    assert "error: --rounds must be at least 3" in err
    assert not Path("unused.json").exists()


def test_no_question_is_a_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "scripts.bench"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "QUESTION" in result.stderr
