"""What dense and keyword search share: the keyword query a question becomes, and fusion.

- `keyword_terms(question)`: the words of a question, lower-cased, as the OR of quoted terms
  (SQLite FTS5's query syntax, each word stemmed in the question's languages: `language.py`;
  PostgreSQL's `websearch_to_tsquery` takes the same words joined by " or " and stems them in
  SQL). Quoting makes every word a plain term: nothing a person types is read as query
  syntax (`NEAR`, `*`, `:`, parentheses).
- `fuse(rankings, k=60)`: reciprocal rank fusion (Cormack et al., 2009): each ranking gives an
  item 1/(k + rank); the sum orders the result. It needs no score calibration between BM25 and
  cosine, which is why it is the usual way to combine them.
- `blend(dense, keyword, document_of, weight)`: relative score fusion, the default
  (`DOCUMENT_SEARCH=hybrid`, issue 55). Each method's scores are scaled to 0-1 over its own
  candidates' documents (min-max of each document's best: the best 1, the last 0; none of
  the engine's scale is kept, so BM25 and PostgreSQL's ts_rank_cd blend alike); a passage's
  score is `(1 - weight)` times its scaled cosine plus `weight` times its document's best
  scaled keyword score (a document whose words match lifts every passage of it the encoder
  found; a passage found by words alone has its own). Unlike RRF it keeps how far apart the
  scores are: a weak keyword match moves little, which is what RRF got wrong on the English
  sets (docs/benchmarks/rag.md).
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from chatapp.documents.language import stems

_WORD = re.compile(r"\w+", re.UNICODE)
# Words too common to tell passages apart; BM25's IDF weighs them down anyway, but each costs a
# posting-list scan.
_STOPWORDS = (
    "a an and are as at be by can do does for from how i if in is it of on or so that the "
    "this to was what when where which who why will with you your my me"
)
STOPWORDS = frozenset(_STOPWORDS.split(" "))

Item = TypeVar("Item", bound=Hashable)


def keyword_words(question: str, limit: int = 32) -> list[str]:
    words: list[str] = []
    for word in _WORD.findall(question.lower()):
        if word not in STOPWORDS and word not in words:
            words.append(word)
    return words[:limit]


def fts5_query(question: str, languages: Sequence[str] = ()) -> str | None:
    """The FTS5 MATCH expression for a question, its words stemmed in each of `languages`
    (none: as they are); None when it has no searchable word."""
    words = keyword_words(question)
    terms = list(dict.fromkeys(s for language in languages for s in stems(words, language)))
    terms = terms or words
    return " OR ".join(f'"{term}"' for term in terms) if terms else None


def fuse(rankings: Sequence[Sequence[Item]], k: int = 60) -> list[tuple[Item, float]]:
    scores: dict[Item, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda pair: -pair[1])


def blend(
    dense: Sequence[tuple[Item, float]],
    keyword: Sequence[tuple[Item, float]],
    document_of: Mapping[Item, Hashable],
    weight: float,
) -> list[tuple[Item, float]]:
    """Relative score fusion of `dense` (item, cosine) and `keyword` (item, engine score),
    higher-is-better each; `document_of` maps every item to its document. Best first."""
    cosine = _scaled(dense, document_of)
    words = _scaled(keyword, document_of)
    document_words: dict[Hashable, float] = {}
    for item, scaled in words.items():
        document = document_of[item]
        document_words[document] = max(document_words.get(document, 0.0), scaled)
    scores = {
        item: (1 - weight) * scaled + weight * document_words.get(document_of[item], 0.0)
        for item, scaled in cosine.items()
    }
    for item, scaled in words.items():
        scores.setdefault(item, weight * scaled)
    return sorted(scores.items(), key=lambda pair: -pair[1])


def _scaled(
    ranked: Sequence[tuple[Item, float]], document_of: Mapping[Item, Hashable]
) -> dict[Item, float]:
    """Scores scaled over the candidates' documents: the best document's best passage 1, the
    lowest document's best 0, a passage below that 0 (a document's second passage does not set
    the scale: on the suite, scaling over passages moved answers down). All 1 when they tie."""
    if not ranked:
        return {}
    best: dict[Hashable, float] = {}
    for item, score in ranked:
        document = document_of[item]
        best[document] = max(best.get(document, score), score)
    low, high = min(best.values()), max(best.values())
    if high <= low:
        return {item: 1.0 for item, _ in ranked}
    return {item: max(0.0, (score - low) / (high - low)) for item, score in ranked}


def library_languages(session: Session, owner_id: int) -> list[str]:
    """The languages of the owner's documents read so far (documents.language), the
    commonest first."""
    from chatapp.documents.models import Document

    found = session.execute(
        select(Document.language)
        .where(Document.owner_id == owner_id, Document.language.is_not(None))
        .group_by(Document.language)
        .order_by(func.count().desc(), Document.language)
    ).scalars()
    return [language for language in found if language]
