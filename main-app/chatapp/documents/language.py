"""A text's language, for keyword search, and the words keyword search keeps of it.

Keyword search stems words (“boiling” and “boils” both “boil”), and a stemmer is one
language's: English rules cut German words wrongly (“Häuser” is not “häus”) and leave French
plurals apart. So each document's language is detected when it is read (`detect`, stored on
the document and its passages), its passages are indexed by that language's stemmer, and a
question is searched with its own language's (`question_languages`).

- The languages: Snowball's stemmers, by the names PostgreSQL's text search configurations
  have (`english`, `german`, ...); `simple` (no stemming) when none is clear.
- `detect(text)`: a count of each language's commonest words (articles, pronouns,
  prepositions) among the text's first 2,000 words, the language with the most, when it has
  at least `least` of them and clearly more than the next. Documents are long, so this is
  reliable for them; a question is short, so one that says too little is searched in the
  languages of the library it searches.
- `keywords(text, language)`: the text's words, lower-cased (as a question's: `ranking.py`)
  and stemmed, joined by spaces:
  what SQLite's FTS5 indexes (its tokenizer then only splits and folds accents); PostgreSQL
  stems in SQL with the same algorithms (its `to_tsvector(language, ...)`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

SIMPLE = "simple"
_COMMON = {
    "english": "the and of to in is that it for was with on as are be this have not or by from "
    "but at which you they were been has their will would there can",
    "german": "der die und das ist nicht zu den ein ich sie es mit sich auf für von dem des eine "
    "wird auch als werden oder bei nach wenn kann sind wie über einer einem",
    "french": "le la les et des est un une du que pour dans pas qui sur ne se au avec il par "
    "sont ce plus ou elle être aux cette vous nous",
    "spanish": "el los las y del que en es un una por para con no se al lo como más pero sus su "
    "está son este esta",
    "italian": "il di che è e per un una non sono del della con si da gli nel anche come più "
    "questo alla dei delle",
    "dutch": "het een en van is dat op te zijn niet met voor die er wordt ook als bij aan om "
    "worden naar",
    "portuguese": "o os do da dos das que em um uma para com não é se por mais como ao pelo "
    "pela são está",
}
COMMON = {language: frozenset(words.split()) for language, words in _COMMON.items()}
LANGUAGES = (*COMMON, SIMPLE)
# Letters and digits: an underscore splits words, as FTS5's unicode61 tokenizer splits them
# ("sys_path" is "sys" and "path", each stemmed as the question's "sys.path" is).
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
SAMPLE_WORDS = 2000


def detect(text: str, least: int = 3) -> str:
    """The text's language (a key of COMMON), or SIMPLE when none is clear."""
    counts = dict.fromkeys(COMMON, 0)
    for number, match in enumerate(_WORD.finditer(text.casefold())):
        if number >= SAMPLE_WORDS:
            break
        word = match.group()
        for language, common in COMMON.items():
            if word in common:
                counts[language] += 1
    ranked = sorted(counts.items(), key=lambda pair: -pair[1])
    (best, most), (_, next_most) = ranked[0], ranked[1]
    return best if most >= least and most > next_most * 1.2 else SIMPLE


def document_language(passages: Iterable[str]) -> str:
    """A document's language from its passages' texts, in order (the first few suffice)."""
    sample: list[str] = []
    for text in passages:
        sample.append(text)
        if sum(len(t) for t in sample) > SAMPLE_WORDS * 8:  # words of about 8 characters
            break
    return detect("\n".join(sample))


def question_languages(question: str, library: Sequence[str]) -> list[str]:
    """The language a question is searched in: its own when its words say so and the library
    holds documents in it, else the library's commonest (`library`: its documents' languages,
    the commonest first; English for a library of none or of unclear ones). One language: a
    question's words stemmed in several at once matched more of the wrong passages
    (docs/benchmarks/rag.md)."""
    own = detect(question, least=1)
    if own != SIMPLE and own in library:
        return [own]
    known = [language for language in library if language != SIMPLE]
    return known[:1] or ["english"]


@cache
def _stemmer(language: str) -> Any:
    import snowballstemmer  # type: ignore[import-untyped]  # ships no types

    return snowballstemmer.stemmer(language)


def stems(words: list[str], language: str) -> list[str]:
    """Each word's stem in `language` (a word holding an underscore: each of its parts')."""
    words = [piece for word in words for piece in _WORD.findall(word)]
    if language not in COMMON:
        return words
    stemmed: list[str] = _stemmer(language).stemWords(words)
    return stemmed


def keywords(text: str, language: str) -> str:
    """The text's words, lower-cased and stemmed in `language`, joined by spaces."""
    return " ".join(stems(_WORD.findall(text.lower()), language))
