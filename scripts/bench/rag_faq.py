"""The retrieval evaluation set: the Python FAQ's questions and their answers, and the measures.

Debian's python3.11-doc installs the FAQ's reStructuredText sources
(`/usr/share/doc/python3.11/html/_sources/faq/*.rst.txt`). Each section whose heading ends in
`?` is one pair: the heading is the query, the section's text without the heading is the one
document that answers it. A retriever ranks documents for each query; `score` gives
recall@1/3/5 (the right document among the first k) and MRR@10 (the mean of 1/rank, 0 past 10).

The same set and measures as the Open WebUI baseline in issue 44 (recall@5 0.959, MRR@10
0.852, recall@1 0.769).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FAQ = Path("/usr/share/doc/python3.11/html/_sources/faq")
_UNDERLINE = re.compile(r"^([=\-~^*+#\"'`])\1{2,}\s*$")


@dataclass(frozen=True)
class Pair:
    source: str  # the FAQ page, e.g. "programming"
    question: str
    answer: str


def faq_pairs(folder: Path = FAQ) -> list[Pair]:
    """Every (question, answer) of the FAQ pages, in page and reading order."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is missing: apt-get install python3.11-doc")
    pairs: list[Pair] = []
    for page in sorted(folder.glob("*.rst.txt")):
        pairs.extend(_page_pairs(page.name.removesuffix(".rst.txt"), page.read_text()))
    return pairs


def _page_pairs(source: str, text: str) -> list[Pair]:
    lines = text.splitlines()
    # A heading is a line of text underlined (and maybe overlined) by a run of punctuation at
    # least as long as it.
    starts = [
        i
        for i in range(len(lines) - 1)
        if lines[i].strip()
        and not _UNDERLINE.match(lines[i])
        and _UNDERLINE.match(lines[i + 1])
        and len(lines[i + 1].strip()) >= len(lines[i].strip())
    ]
    pairs = []
    for index, start in enumerate(starts):
        title = lines[start].strip()
        end = starts[index + 1] if index + 1 < len(starts) else len(lines)
        body = lines[start + 2 : end]
        if body and index + 1 < len(starts) and _UNDERLINE.match(lines[end - 1] if end else ""):
            body = body[:-1]  # the next heading's overline
        answer = "\n".join(body).strip()
        if title.endswith("?") and answer:
            pairs.append(Pair(source, title, answer))
    return pairs


@dataclass(frozen=True)
class Scores:
    queries: int
    recall_at_1: float
    recall_at_3: float
    recall_at_5: float
    mrr_at_10: float


def rank_of(wanted: int, ranking: list[int]) -> int | None:
    """The 1-based place of `wanted` in `ranking` (document ids, best first, repeats dropped)."""
    seen: list[int] = []
    for document in ranking:
        if document not in seen:
            seen.append(document)
            if document == wanted:
                return len(seen)
    return None


def score(ranks: list[int | None]) -> Scores:
    """The measures over every query's rank of its right document (None: not found)."""
    n = len(ranks)

    def recall(k: int) -> float:
        return sum(1 for r in ranks if r is not None and r <= k) / n

    mrr = sum(1 / r for r in ranks if r is not None and r <= 10) / n
    return Scores(n, round(recall(1), 3), round(recall(3), 3), round(recall(5), 3), round(mrr, 3))
