"""The layout's rules (ARCHITECTURE.md), checked: who may import whom.

- The sidecar's web/ (the uvicorn process) and model/ (the model worker process) never import
  each other; they meet in sidecar/ipc.py.
- The two services never import each other: they ship as separate images.
- No code edits sys.path: the services and scripts/ are installed packages.
- scripts/ is grouped by job (models/, bench/, run/), each group's README naming its files;
  only the repo-keeping commands stay at its top.
- No package of either service holds more than MAX_MODULES modules, and every package of
  either is named in ARCHITECTURE.md: `ls` of a folder says what is in it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SIDECAR = REPO / "phi3-sidecar" / "sidecar"
APP = REPO / "main-app" / "chatapp"


def python_files(*roots: Path) -> Iterator[Path]:
    for root in roots:
        yield from (p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def imported_modules(path: Path) -> set[str]:
    """Every module an import statement in `path` names (absolute imports only)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def imports_of(root: Path, prefix: str) -> dict[str, set[str]]:
    found = {}
    for path in python_files(root):
        hits = {m for m in imported_modules(path) if m == prefix or m.startswith(prefix + ".")}
        if hits:
            found[str(path.relative_to(REPO))] = hits
    return found


def test_the_web_process_code_never_imports_model_code() -> None:
    assert imports_of(SIDECAR / "web", "sidecar.model") == {}


def test_the_model_process_code_never_imports_web_code() -> None:
    assert imports_of(SIDECAR / "model", "sidecar.web") == {}


def test_the_encoder_package_imports_no_web_code_and_of_the_model_s_only_the_cpu_count() -> None:
    """sidecar/embeddings/ runs in the web process (ARCHITECTURE.md, "Embeddings"): it reads the
    CPU budget from model/cpus.py (plain Python, the one copy of that rule) and nothing else
    of the model worker's."""
    assert imports_of(SIDECAR / "embeddings", "sidecar.web") == {}
    model_imports = imports_of(SIDECAR / "embeddings", "sidecar.model")
    assert list(model_imports) == ["phi3-sidecar/sidecar/embeddings/service.py"]
    assert {
        m.removesuffix(".cpu_budget") for m in model_imports[str(next(iter(model_imports)))]
    } == {"sidecar.model.cpus"}


@pytest.mark.parametrize(("root", "other"), [(SIDECAR, "chatapp"), (APP, "sidecar")])
def test_the_services_never_import_each_other(root: Path, other: str) -> None:
    assert imports_of(root, other) == {}


def test_onnxruntime_genai_is_imported_by_the_engine_and_the_generator_path_only() -> None:
    """Its API changes between minors: what a version bump can break stays in two modules."""
    importers = imports_of(SIDECAR, "onnxruntime_genai")
    assert sorted(importers) == [
        "phi3-sidecar/sidecar/model/engine.py",
        "phi3-sidecar/sidecar/model/generator/path.py",
    ]


def test_nothing_edits_sys_path() -> None:
    offenders = [
        str(path.relative_to(REPO))
        for path in python_files(REPO / "phi3-sidecar", REPO / "main-app", REPO / "scripts")
        if "sys.path." in path.read_text(encoding="utf-8")
    ]
    assert offenders == []


SCRIPTS = REPO / "scripts"


def test_scripts_top_level_holds_only_the_groups_and_the_repo_keeping_commands() -> None:
    files = sorted(p.name for p in SCRIPTS.iterdir() if p.is_file())
    assert files == ["README.md", "__init__.py", "gen_docs.py", "vendor_static.py"]
    groups = sorted(p.name for p in SCRIPTS.iterdir() if (p / "__init__.py").is_file())
    assert groups == ["bench", "models", "run"]


@pytest.mark.parametrize("group", ["bench", "models", "run"])
def test_each_group_s_readme_names_every_file_in_it(group: str) -> None:
    folder = SCRIPTS / group
    readme = (folder / "README.md").read_text(encoding="utf-8")
    for path in folder.iterdir():
        if path.name in ("README.md", "__init__.py", "__pycache__"):
            continue
        # A command by its module (python -m scripts.models.make_model) or file name; a
        # library package by its folder.
        names = (path.name, f"scripts.{group}.{path.stem}", f"{path.name}/")
        assert any(name in readme for name in names), f"scripts/{group}/README.md: {path.name}"
    assert f"]({group}/README.md)" in (SCRIPTS / "README.md").read_text(encoding="utf-8")


def test_building_the_web_app_loads_no_model_code(tmp_path: Path) -> None:
    """Not only the import statements: the modules really loaded by the web process's code."""
    probe = (
        "import json, sys\n"
        "from sidecar.settings import Settings\n"
        "from sidecar.web.app import create_app\n"
        f"create_app(Settings(model_path={str(tmp_path)!r}))\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('onnxruntime_genai', "
        "'onnxruntime', 'tokenizers', 'numpy') or m.startswith('sidecar.model')]\n"
        "print(json.dumps(loaded))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(result.stdout) == []


def test_the_encoder_loads_in_the_web_process_without_the_chat_model_s_runtime(
    tmp_path: Path,
) -> None:
    """With an encoder, the web process loads onnxruntime and tokenizers for it, never
    onnxruntime-genai or the model worker's code (but the CPU count, model/cpus.py)."""
    encoder = tmp_path / "encoder"
    subprocess.run(
        [sys.executable, "-m", "scripts.models.make_encoder", "--out", str(encoder)],
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    probe = (
        "import json, sys, time\n"
        "from sidecar.settings import Settings\n"
        "from sidecar.web.app import create_app\n"
        f"app = create_app(Settings(model_path={str(tmp_path)!r}, "
        f"embed_model_path={str(encoder)!r}))\n"
        "embeddings = app.state.embeddings\n"
        "embeddings.start()\n"
        "while embeddings.phase.name not in ('ready', 'failed'): time.sleep(0.05)\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] == 'onnxruntime_genai' "
        "or (m.startswith('sidecar.model') and m != 'sidecar.model.cpus')]\n"
        "print(json.dumps([embeddings.phase.name, loaded]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(result.stdout.splitlines()[-1]) == ["ready", ["sidecar.model"]]


def test_the_engine_stays_one_module_that_reads_at_one_sitting() -> None:
    """Issue 35: engine.py loads the model and starts replies; the paths live beside it."""
    engine = SIDECAR / "model" / "engine.py"
    assert len(engine.read_text(encoding="utf-8").splitlines()) < 300


# More modules than this and a folder's listing no longer says what is in it: group them by
# concern into packages (issue 59; about 15 is the aim).
MAX_MODULES = 18
# Packages that still hold more, folded next (issue 59): each must come off this list when it
# is folded, and a package that no longer exceeds the limit fails until it does.
NOT_YET_FOLDED: set[str] = set()


def packages(*roots: Path) -> Iterator[Path]:
    """Every folder of Python modules under `roots`, the roots included. Alembic's revisions
    (store/migrations/versions/) are not a package of modules: one file per schema change."""
    for root in roots:
        for folder in sorted({p.parent for p in python_files(root)}):
            if folder.parts[-2:] != ("migrations", "versions"):
                yield folder


def modules_in(package: Path) -> list[str]:
    return sorted(p.name for p in package.glob("*.py") if p.name != "__init__.py")


def test_no_package_holds_more_than_max_modules() -> None:
    crowded = {
        str(package.relative_to(REPO)): len(modules_in(package))
        for package in packages(SIDECAR, APP)
        if len(modules_in(package)) > MAX_MODULES
    }
    assert set(crowded) - NOT_YET_FOLDED == set(), crowded
    assert NOT_YET_FOLDED - set(crowded) == set(), "folded: take it off NOT_YET_FOLDED"


def test_every_package_of_the_sidecar_is_named_in_the_architecture() -> None:
    architecture = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
    unnamed = [
        f"{package.relative_to(SIDECAR.parent).as_posix()}/"
        for package in packages(SIDECAR)
        if package != SIDECAR
        and f"`{package.relative_to(SIDECAR.parent).as_posix()}/`" not in architecture
    ]
    assert unnamed == [], "say what each is in ARCHITECTURE.md, one line each"


def test_every_package_of_the_app_is_named_in_the_architecture() -> None:
    architecture = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
    unnamed = [
        f"{package.relative_to(APP.parent).as_posix()}/"
        for package in packages(APP)
        if package != APP and f"`{package.relative_to(APP.parent).as_posix()}/`" not in architecture
    ]
    assert unnamed == [], "say what each is in ARCHITECTURE.md, one line each"
