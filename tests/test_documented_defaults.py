"""No page states a default the code does not have: every statement of a setting's default in
the docs is compared with the sidecar's `Settings` and the chat app's `reference()`.

What counts as a statement of a default, as the pages phrase them:

- `NAME=value` within a few words of "default" in the same clause (up to a `;`): "by default
  (`MAX_CONCURRENCY=4`; ...)", "the default `PROMPT_CACHE_MB=2048`", "(`DECODE_BATCH_ROWS=4`,
  the default)"; so a clause about a default names other values without `=` ("`DECODE_BATCH_ROWS`
  1 against 4, the default");
- "`NAME` (default `value`)", "`NAME`, value by default", "`NAME`: `value` by default",
  "`NAME` stays value (...) by default";
- "by default `NAME` is value".

A sentence about a default that has changed says so ("then the default", "the default until
...", "the old defaults") and is left alone. A value that is no literal of the setting's type
("default: the model's context length") is not compared. A name both services read (PORT,
HOST, ...) may state either one's default.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatapp import settings as app_settings
from sidecar.settings import Settings

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "ARCHITECTURE.md", REPO / "CONTRIBUTING.md"]
PAGES += sorted((REPO / "docs").rglob("*.md")) + sorted((REPO / "infra").rglob("*.md"))
PAGES += sorted((REPO / "scripts").rglob("README.md"))

HISTORIC = re.compile(
    r"\bthen the defaults?\b|\bdefaults? (?:then|until|at the time)\b|\b(?:was|were) the "
    r"defaults?\b|\b(?:old|former|earlier) defaults?\b|\bbecame the defaults?\b",
    re.I,
)
VALUE = r"(?P<value>`[^`\n]+`|[\w./:+-]+)"
NEAR = 40  # characters between `NAME=value` and "default" for the one to speak of the other


def defaults() -> dict[str, list[Any]]:
    """Each setting's default in each service that reads it."""
    found: dict[str, list[Any]] = {}
    for name, field in Settings.model_fields.items():
        if not field.is_required() and field.default_factory is None:
            found.setdefault(name.upper(), []).append(field.default)
    for name, _kind, default, _meaning in app_settings.reference():
        found.setdefault(name, []).append(default)
    return found


DEFAULTS = defaults()
NAMES = "|".join(sorted(map(re.escape, DEFAULTS), key=len, reverse=True))
ASSIGNED = re.compile(rf"\b(?P<name>{NAMES})=(?P<value>[^\s`,;)|]+)")
DEFAULT = re.compile(r"\bdefaults?\b", re.I)
FORMS = [
    re.compile(rf"`(?P<name>{NAMES})`\s*\((?:the\s+)?default:?\s+{VALUE}"),
    re.compile(
        rf"`(?P<name>{NAMES})`[,:]?\s+(?:stays\s+|is\s+)?(?P<value>`[^`\n]+`|\d[\d,.]*)"
        r"(?:\s+[A-Za-z]+)?(?:\s+\([^)]*\))?\s+by default"
    ),
    re.compile(rf"by default,?\s+`(?P<name>{NAMES})`\s+is\s+{VALUE}", re.I),
]


def sentences(text: str) -> Iterator[tuple[int, str]]:
    """(line number, sentence) of the page's prose and table rows; code blocks left out."""
    paragraph: list[tuple[int, str]] = []
    fenced = False

    def flush() -> Iterator[tuple[int, str]]:
        if paragraph:
            joined = " ".join(line.strip() for _, line in paragraph)
            for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z(`*\[])", joined):
                yield paragraph[0][0], sentence
            paragraph.clear()

    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            yield from flush()
        elif fenced:
            continue
        elif line.startswith("|") or not line.strip() or line.startswith("#"):
            yield from flush()
            if line.startswith("|"):
                yield number, line
        else:
            if re.match(r"\s*(?:[-*]|\d+\.) ", line):  # a list item starts a paragraph
                yield from flush()
            paragraph.append((number, line))
    yield from flush()


def claims(text: str) -> Iterator[tuple[int, str, str, str]]:
    """(line, name, value, sentence) of every default the text states."""
    for number, sentence in sentences(text):
        if "default" not in sentence.lower() or HISTORIC.search(sentence):
            continue
        for form in FORMS:
            for match in form.finditer(sentence):
                yield number, match["name"], match["value"].strip("`"), sentence
        for clause in sentence.split(";"):
            said = [(m.start(), m.end()) for m in DEFAULT.finditer(clause)]
            for match in ASSIGNED.finditer(clause):
                gaps = [max(start - match.end(), match.start() - end) for start, end in said]
                if gaps and min(gaps) <= NEAR:
                    yield number, match["name"], match["value"], sentence


def agrees(value: str, default: Any) -> bool | None:
    """Whether `value` is `default`; None when `value` is no literal of the setting's type."""
    if isinstance(default, bool):
        words = {"true": True, "1": True, "on": True, "false": False, "0": False, "off": False}
        return None if value.lower() not in words else words[value.lower()] == default
    if isinstance(default, int | float):
        try:
            return math.isclose(float(value.replace(",", "")), float(default))
        except ValueError:
            return None
    if "..." in value:
        return None  # a value left out: `MODEL_PATH=/home/models/...`
    if default is None:
        return value.lower() in ("unset", "none", "")
    return value == str(default)


def test_the_forms_find_what_the_pages_write() -> None:
    text = (
        "Old: it runs one reply at a time by default (`MAX_CONCURRENCY=1`; then FIFO).\n\n"
        "One reply at a time (`MAX_CONCURRENCY=1`, then the default).\n\n"
        "A tier (`PROMPT_CACHE_DISK_MB`, 4096 by default, oldest first) and `KV_COMPACT`: `int8` "
        "by default. It reads `MODEL_PATH` (default `/home/models/x`). `DECODE_BATCH_ROWS` 1 "
        "against 4, the default.\n\n"
        "```sh\nMAX_CONCURRENCY=9 python -m sidecar   # not the default\n```\n"
        "| `QUEUE_SIZE=3` | by default |\n"
    )
    found = [(name, value) for _, name, value, _ in claims(text)]
    assert found == [
        ("MAX_CONCURRENCY", "1"),
        ("PROMPT_CACHE_DISK_MB", "4096"),
        ("KV_COMPACT", "int8"),
        ("MODEL_PATH", "/home/models/x"),
        ("QUEUE_SIZE", "3"),
    ]
    far = "By default it keeps them; set `PROMPT_CACHE_UNSCOPED=false` so that nothing is kept."
    assert list(claims(far)) == []  # another clause
    words = "The default is on, and only after many more words about probes and scrapers"
    assert list(claims(words + " do we set `API_KEY_PROBES=true`.")) == []
    assert agrees("4,096", 4096) and agrees("int8", "int8") and not agrees("1", 4)
    assert agrees("the model's length", 1024) is None and agrees("true", True)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_default_a_page_states_is_the_code_s(page: Path) -> None:
    wrong = []
    for number, name, value, sentence in claims(page.read_text(encoding="utf-8")):
        verdicts = [agrees(value, default) for default in DEFAULTS[name]]
        if None in verdicts and not any(verdicts):
            continue  # no literal: "default: the model's context length"
        if not any(verdicts):
            shown = " or ".join(repr(default) for default in DEFAULTS[name])
            wrong.append(f"line {number}: {name}={value}, the default is {shown}: {sentence}")
    assert not wrong, "\n".join(wrong)


def test_the_pages_state_defaults() -> None:
    """The scan reads what it should: the pages do state defaults in these forms."""
    stated = {name for page in PAGES for _, name, _, _ in claims(page.read_text())}
    assert {"MAX_CONCURRENCY", "DECODE_BATCH_ROWS", "PROMPT_CACHE_MB", "KV_COMPACT"} <= stated
