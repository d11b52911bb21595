"""A text's language and the stems keyword search keeps of it (documents/language.py)."""

from __future__ import annotations

import pytest

from chatapp.documents.index.ranking import fts5_query
from chatapp.documents.language import (
    SIMPLE,
    detect,
    document_language,
    keywords,
    question_languages,
)

TEXTS = {
    "english": "The kettle boils a litre of water in three minutes, and it switches itself off.",
    "german": "Der Wasserkocher kocht einen Liter Wasser in drei Minuten und schaltet sich ab.",
    "french": "La bouilloire fait bouillir un litre d'eau en trois minutes et elle s'arrête.",
    "spanish": "El hervidor calienta un litro de agua en tres minutos y se apaga con su botón.",
}


@pytest.mark.parametrize(("language", "text"), TEXTS.items())
def test_a_paragraph_says_its_language(language: str, text: str) -> None:
    assert detect(text) == language
    assert document_language([text, text]) == language


def test_too_few_words_or_a_tie_is_simple() -> None:
    assert detect("Wasserkocher 3000") == SIMPLE
    assert detect("la") == SIMPLE  # French, Spanish and Italian alike
    assert detect("") == SIMPLE


def test_a_question_is_searched_in_its_own_language_else_its_library_s() -> None:
    library = ["french", "german"]  # the commonest first
    assert question_languages("Wie lange hält der Wasserkocher?", library) == ["german"]
    assert question_languages("Wasserkocher", library) == ["french"]
    # "do" is Portuguese too: a language the library does not hold is not the question's
    assert question_languages("How do I descale it?", ["english"]) == ["english"]
    assert question_languages("Wasserkocher", [SIMPLE, "german"]) == ["german"]
    assert (
        question_languages("Wasserkocher", []) == question_languages("x", [SIMPLE]) == ["english"]
    )


def test_stems_are_the_language_s_own() -> None:
    assert keywords("Häuser", "german") == keywords("Hauses", "german") == "haus"
    assert keywords("Häuser", "english") == "häuser"  # English rules leave them apart
    assert keywords("boiling kettles", "english") == "boil kettl"
    assert keywords("Häuser", SIMPLE) == "häuser"
    assert fts5_query("Häusern", ["german"]) == '"haus"'
    assert fts5_query("Häusern", ["german", "english"]) == '"haus" OR "häusern"'
    assert fts5_query("Häusern") == '"häusern"'  # no language: the words as they are
