"""rag's evaluation suite: question and document sets built at run time from public text on
this machine, each of its own kind, format and language (issue 55). Nothing is downloaded.

| set | language | what the query is | the document (its format) |
|---|---|---|---|
| `python-faq` | en | a Python FAQ question | its answer (reStructuredText), rag_faq.py |
| `git-faq` | en | a question of gitfaq(7) | its answer (the manual page's text) |
| `debian-packages` | en | an installed package's synopsis | its long description (text) |
| `man-en` | en | an English manual page's NAME line | its DESCRIPTION section (text) |
| `man-de`, `man-fr`, `man-es` | de, fr, es | the same, from /usr/share/man/LANG | the same |

Manual pages are rendered by man-db (`man -l`, 100 columns, no hyphenation or justification);
a page that is an alias of another (`.so`) or whose NAME or DESCRIPTION is missing or short is
skipped, and so is one whose query or document repeats another's; at most `PER_FAMILY` pages
of one family (the name up to its first `-`, `_` or `.`: gcloud's thousands of subcommands).
Where a set has more pages than `limit`, it takes them in the order of a hash of their file
names (the same every run, on any machine with the same packages). The other languages'
pages come with their packages' own translations; `apt-get install manpages-de manpages-fr
manpages-es` adds thousands.

The Debian FAQ (debian-faq, in every language) is held out of every set for checks made
outside the project: no builder reads it, and a package named debian-faq* is skipped.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from scripts.bench.rag_faq import faq_pairs

MAN = Path("/usr/share/man")
DPKG_STATUS = Path("/var/lib/dpkg/status")
HELD_OUT = "debian-faq"
MIN_DOCUMENT_CHARS = 200
PER_FAMILY = 3  # pages of one tool's family (git-*, dpkg-*, gcloud_*'s thousands) in a set
# The NAME and DESCRIPTION sections' headings, as the pages' translators wrote them.
NAME_HEADINGS = {"NAME", "BEZEICHNUNG", "NOM", "NOMBRE"}
DESCRIPTION_HEADINGS = {"DESCRIPTION", "BESCHREIBUNG", "DESCRIPCIÓN", "DESCRIPCION"}
_HEADING = re.compile(r"^[^\s].*$")
_DASH = re.compile(r"\s[-\u2010-\u2015]\s|\s\\-\s")


@dataclass(frozen=True)
class Case:
    question: str
    document: str  # the file's text, as uploaded
    name: str  # its file name: the app picks the parser by its suffix


@dataclass(frozen=True)
class EvalSet:
    name: str
    language: str  # ISO 639-1
    kind: str  # what the documents are, for the table
    cases: list[Case]


def python_faq(limit: int | None) -> list[Case]:
    pairs = faq_pairs()
    return [Case(p.question, p.answer, "answer.rst") for p in pairs][:limit]


def git_faq(limit: int | None) -> list[Case]:
    """Each question of gitfaq(7) (an indented line ending in `?` in a section) and the
    paragraphs under it up to the next question."""
    page = MAN / "man7" / "gitfaq.7.gz"
    if not page.is_file():
        raise FileNotFoundError(f"{page} is missing: apt-get install git-man")
    cases: list[Case] = []
    question: str | None = None
    pending = ""  # a question so far: it may wrap onto a second line
    body: list[str] = []
    for line in [*render(page).splitlines(), "END"]:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        # A section's own paragraphs start 7 columns in, an answer's 11, a heading at 0.
        if stripped and indent in (0, 7):
            if question and _dedent(body):
                cases.append(Case(question, _dedent(body), "answer.txt"))
            question, body = None, []
            pending = f"{pending} {stripped}".strip() if indent == 7 else ""
            if pending.endswith("?"):
                question, pending = pending, ""
        else:
            pending = ""
            if question is not None:
                body.append(line)
    return cases[:limit]


def debian_packages(limit: int | None, status: Path = DPKG_STATUS) -> list[Case]:
    """The packages installed here (dpkg's status file): the synopsis, the long description.
    One package per source package (binary packages of one source share their text)."""
    seen_sources: set[str] = set()
    found: list[tuple[str, Case]] = []
    for record in status.read_text(encoding="utf-8", errors="replace").split("\n\n"):
        fields = _control_fields(record)
        package = fields.get("Package", "")
        if not package or package.startswith(HELD_OUT) or "Description" not in fields:
            continue
        source = fields.get("Source", package).split()[0]
        synopsis, _, rest = fields["Description"].partition("\n")
        long = "\n".join(
            "" if line.strip() == "." else line.removeprefix(" ") for line in rest.splitlines()
        ).strip()
        if source in seen_sources or len(long) < MIN_DOCUMENT_CHARS:
            continue
        seen_sources.add(source)
        found.append((package, Case(synopsis.strip(), long, f"{package}.txt")))
    return _distinct(_sampled(found, limit))[:limit]


def manual_pages(language: str, limit: int | None) -> list[Case]:
    """Pages of sections 1 and 8 (commands) in `language` ("en": the untranslated ones)."""
    root = MAN if language == "en" else MAN / language
    files = sorted(p for s in ("man1", "man8") for p in (root / s).glob("*.gz") if p.is_file())
    if not files:
        raise FileNotFoundError(f"no manual pages in {root}: apt-get install manpages-{language}")
    cases: list[Case] = []
    families: dict[str, int] = {}
    for path in sorted(files, key=_hashed):
        if limit is not None and len(cases) >= limit * 2:  # twice: repeats are dropped below
            break
        family = re.split(r"[-_.]", path.name, maxsplit=1)[0]
        families[family] = families.get(family, 0) + 1
        if families[family] > PER_FAMILY:
            continue
        case = _page_case(path)
        if case is not None:
            cases.append(case)
    return _distinct(cases)[:limit]


def _page_case(path: Path) -> Case | None:
    sections = _sections(render(path))
    name = next((sections[h] for h in NAME_HEADINGS if h in sections), "")
    description = next((sections[h] for h in DESCRIPTION_HEADINGS if h in sections), "")
    parts = _DASH.split(" ".join(name.split()), maxsplit=1)
    if len(parts) != 2 or len(description) < MIN_DOCUMENT_CHARS or len(parts[1]) < 8:
        return None
    return Case(parts[1].strip(), description, path.name.split(".")[0] + ".txt")


def render(page: Path) -> str:
    """The page as man-db shows it, plain text (its pipeline: preconv, groff, col)."""
    head = subprocess.run(["zcat", str(page)], capture_output=True, check=True).stdout[:200]
    if head.startswith(b".so "):  # an alias of another page
        return ""
    env = {**os.environ, "MANWIDTH": "100", "MAN_KEEP_FORMATTING": "", "LC_ALL": "C.UTF-8"}
    done = subprocess.run(
        ["man", "--nh", "--nj", "-l", str(page)], capture_output=True, env=env, timeout=60
    )
    return done.stdout.decode("utf-8", errors="replace")


def _sections(text: str) -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines()[1:]:  # the first line is the page's header
        if _HEADING.match(line):
            current = sections.setdefault(line.strip(), [])
        elif current is not None:
            current.append(line)
    return {heading: _dedent(lines) for heading, lines in sections.items()}


def _dedent(lines: list[str]) -> str:
    """Lines of one section as paragraphs: indentation dropped, blank lines kept."""
    text = "\n".join(line.strip() for line in lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _control_fields(record: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    key = None
    for line in record.splitlines():
        if line.startswith((" ", "\t")) and key is not None:
            fields[key] += "\n" + line
        elif ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def _hashed(path: Path) -> str:
    return hashlib.sha256(path.name.encode()).hexdigest()


def _sampled(found: list[tuple[str, Case]], limit: int | None) -> list[Case]:
    ordered = sorted(found, key=lambda item: hashlib.sha256(item[0].encode()).hexdigest())
    return [case for _, case in ordered][: None if limit is None else limit * 2]


def _distinct(cases: list[Case]) -> list[Case]:
    """Cases whose question and document are each unlike every other's (a repeated query has
    no one right answer)."""
    questions: dict[str, int] = {}
    documents: dict[str, int] = {}
    for case in cases:
        questions[case.question.casefold()] = questions.get(case.question.casefold(), 0) + 1
        documents[case.document] = documents.get(case.document, 0) + 1
    return [c for c in cases if questions[c.question.casefold()] == documents[c.document] == 1]


SETS: dict[str, tuple[str, str, Callable[[int | None], list[Case]]]] = {
    "python-faq": ("en", "FAQ answers, reStructuredText", python_faq),
    "git-faq": ("en", "FAQ answers, a manual page's text", git_faq),
    "debian-packages": ("en", "package descriptions, text", debian_packages),
    "man-en": ("en", "manual pages' DESCRIPTION, text", lambda n: manual_pages("en", n)),
    "man-de": ("de", "manual pages' DESCRIPTION, text", lambda n: manual_pages("de", n)),
    "man-fr": ("fr", "manual pages' DESCRIPTION, text", lambda n: manual_pages("fr", n)),
    "man-es": ("es", "manual pages' DESCRIPTION, text", lambda n: manual_pages("es", n)),
}
MIN_CASES = 15  # a set with fewer is not reported (one question would be seven points)


def build(names: list[str], limit: int | None) -> Iterator[EvalSet | str]:
    """Each named set, or a line saying why it was left out (its files are not here)."""
    for name in names:
        language, kind, builder = SETS[name]
        try:
            cases = builder(limit)
        except FileNotFoundError as missing:
            yield f"{name}: left out ({missing})"
            continue
        if len(cases) < MIN_CASES:
            yield f"{name}: left out ({len(cases)} questions; at least {MIN_CASES} are needed)"
            continue
        yield EvalSet(name, language, kind, cases)
