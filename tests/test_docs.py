"""The docs cannot drift from the code: the generated tables are current, every setting and
refusal has its sentence, every link leads somewhere, every question of `python -m scripts.bench`
has its page of figures and its row in their index, every measured table names its CPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chatapp import settings as app_settings
from scripts import gen_docs
from scripts.bench import __main__ as bench
from sidecar.settings import Settings
from sidecar.web.errors import REFUSALS, WHEN
from sidecar.web.observability.metrics import GENERATION_PATHS

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted(REPO.glob("*.md")) + sorted((REPO / "docs").rglob("*.md"))
BENCHMARKS = REPO / "docs" / "benchmarks"  # README.md, the index; a page per question


def test_the_generated_pages_are_current() -> None:
    stale = gen_docs.stale_pages()
    assert not stale, f"stale: {', '.join(stale)}; run {gen_docs.COMMAND} and commit the result"


def test_generating_changes_only_what_is_between_the_markers() -> None:
    page = "docs/api.md"
    text = (REPO / page).read_text(encoding="utf-8")
    begin, end = gen_docs._markers("refusals")
    emptied = re.sub(re.escape(begin) + ".*?" + re.escape(end), f"{begin}\n{end}", text, flags=re.S)
    assert emptied != text
    assert gen_docs.render(page, emptied) == gen_docs.render(page, text)
    assert "| `body_too_large` | 413 |" in gen_docs.render(page, emptied)


def test_every_setting_and_refusal_has_its_sentence() -> None:
    for name, field in Settings.model_fields.items():
        assert field.description, f"sidecar setting {name} has no description"
    for name, _kind, _default, meaning in app_settings.reference():
        assert meaning, f"{name}: add it to DESCRIPTIONS in main-app/chatapp/settings.py"
    assert set(WHEN) == set(REFUSALS), "one WHEN sentence per REFUSALS reason (web/errors.py)"


def test_each_setting_appears_in_the_configuration_page() -> None:
    page = (REPO / "docs/configuration.md").read_text(encoding="utf-8")
    names = [name.upper() for name in Settings.model_fields]
    names += [name for name, *_ in app_settings.reference()]
    for name in names:
        assert f"| `{name}` |" in page, name


def test_the_body_limit_is_documented_for_every_generation_route() -> None:
    # It applies to every route that generates (each reads its body with the limit); the
    # README once said /predict only.
    for path in GENERATION_PATHS:
        assert path in (Settings.model_fields["max_body_bytes"].description or ""), path
        assert f"`{path}`" in WHEN["body_too_large"], path


def test_the_readme_is_a_landing_page() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, "move reference material into docs/ and link it"


def test_every_relative_link_leads_to_a_file() -> None:
    """In docs/ (its folders too) and the top-level pages."""
    link = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
    for page in PAGES:
        for target in link.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)}: {target}"


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces
    as hyphens, a repeated one numbered."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        fenced = fenced != line.startswith("```")
        if fenced or not line.startswith("#"):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def test_every_link_to_a_section_finds_it() -> None:
    """Headings move (docs/benchmarks/ is rewritten as measurements are); links follow."""
    link = re.compile(r"\]\(([^)\s#]*)#([^)\s]+)\)")
    for page in PAGES:
        for target, anchor in link.findall(page.read_text(encoding="utf-8")):
            if "://" in target or (target and not target.endswith(".md")):
                continue
            linked = (page.parent / target) if target else page
            assert anchor in anchors(linked), f"{page.relative_to(REPO)}: {target}#{anchor}"


def test_anchors_are_github_s() -> None:
    assert "users-how-fast-is-it-with-n-users-at-once" in anchors(BENCHMARKS / "users.md")
    assert "batched-decode-decode_batch_rows-2026-11-24" in anchors(BENCHMARKS / "users.md")
    peers = anchors(BENCHMARKS / "peers.md")
    assert "against-llamacpp-before-batched-decode-2026-11-23" in peers
    assert {"today", "history"} <= peers


def test_every_question_has_its_page_and_its_row() -> None:
    """Each question `python -m scripts.bench` offers (scripts/bench/__main__.py, COMMANDS) has
    docs/benchmarks/QUESTION.md, today's figure first, and a row in the index's table."""
    index = (BENCHMARKS / "README.md").read_text(encoding="utf-8")
    rows = {
        found[1]: line
        for line in index.splitlines()
        if (found := re.match(r"\| \[([\w-]+)\]\(\1\.md\) \|", line))
    }
    for command in bench.COMMANDS:
        page = BENCHMARKS / f"{command.name}.md"
        assert page.is_file(), f"docs/benchmarks/{command.name}.md: the page of its figures"
        headings = [
            line for line in page.read_text(encoding="utf-8").splitlines() if line[:2] == "##"
        ]
        assert headings[:1] == ["## Today"], f"{page.relative_to(REPO)}: today's figure first"
        assert command.name in rows, f"docs/benchmarks/README.md: a row for {command.name}"
        cells = [cell.strip() for cell in rows[command.name].strip("|").split("|")]
        assert len(cells) == 5 and all(cells), (
            f"{command.name}: question, what, figure, target, peer"
        )
    assert set(rows) == {command.name for command in bench.COMMANDS}, "a row for a question gone"


@pytest.mark.parametrize("page", sorted(BENCHMARKS.glob("*.md")), ids=lambda page: page.stem)
def test_every_measured_table_names_its_cpu(page: Path) -> None:
    """In docs/benchmarks/, the paragraph above each table (or its header) names the CPU: a
    figure, and above all a ratio against llama.cpp, holds for that CPU only."""
    cpu = re.compile(r"Intel Xeon|AMD EPYC|\bCPU\b")
    lines = page.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines):
        if not line.startswith("|") or (number and lines[number - 1].startswith("|")):
            continue
        above = number - 1
        while above >= 0 and not lines[above].strip():
            above -= 1
        paragraph = [line]
        while above >= 0 and lines[above].strip() and not lines[above].startswith(("|", "#")):
            paragraph.append(lines[above])
            above -= 1
        assert cpu.search(" ".join(reversed(paragraph))), (
            f"{page.relative_to(REPO)}:{number + 1}: name the CPU"
        )


def test_the_readme_states_no_ratio_against_a_peer() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert not re.search(r"\d(\.\d+)?x llama\.cpp|llama\.cpp's \w+ is \d", readme)
