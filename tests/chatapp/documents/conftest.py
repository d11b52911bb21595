"""A real WordPiece tokenizer (the `tokenizers` library, BERT's pipeline) for passage sizes,
a migrated store on each engine with two owners, and a file that takes seconds to read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

from chatapp.store import Store, migrate
from chatapp.store.users import ensure_user
from tests.chatapp.documents import make_files

WORDS = (
    "the kettle boils a litre of water in three minutes descale once a month in hard water "
    "areas with citric acid warranty lasts months from the date on the receipt table setting "
    "temperature green black tea python programming language interpreter"
)


@pytest.fixture(scope="session")
def wordpiece_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a BERT-style tokenizer.json ([CLS] text [SEP], lower case, WordPiece)."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=300, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    )
    tokenizer.train_from_iterator([WORDS] * 20, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[
            ("[CLS]", tokenizer.token_to_id("[CLS]")),
            ("[SEP]", tokenizer.token_to_id("[SEP]")),
        ],
    )
    # As MiniLM's tokenizer.json does: truncation at the encoder's limit, which counting must undo.
    tokenizer.enable_truncation(max_length=16)
    folder = tmp_path_factory.mktemp("wordpiece")
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    """A migrated store on each engine (tests/conftest.py's `database_url`: SQLite, PostgreSQL)."""
    store = Store.open(database_url)
    migrate.upgrade(store.engine)
    yield store
    store.close()


@pytest.fixture
def owners(store: Store) -> tuple[int, int]:
    """Two users' ids: the libraries that must never meet."""
    with store.session(write=True) as session:
        return ensure_user(session, "alice").id, ensure_user(session, "bob").id


@pytest.fixture(scope="session")
def slow_docx() -> bytes:
    """80 KB of zip, 19 MB of one-letter runs (under 20 times its size counted as a mebibyte):
    about 5 s of reading on a 2-vCPU EPYC, to be cancelled, timed out or killed meanwhile."""
    return make_files.runs_docx(19_000_000)
