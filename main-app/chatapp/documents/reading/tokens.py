"""How many tokens the encoder makes of a text: its own tokenizer, or a bound that never errs low.

A passage longer than the encoder's limit is cut silently by the encoder (its end is never
embedded, so it cannot be found), hence every passage is measured before it is kept.

- `EncoderTokens(path)`: the encoder's `tokenizer.json` (the folder `EMBED_TOKENIZER` names,
  usually the sidecar's `EMBED_MODEL_PATH`), read with the `tokenizers` library: the exact
  count, special tokens ([CLS], [SEP]) included. Read at the first count, not at start: on
  App Service the app may start before its sidecar has downloaded the encoder into the /home
  they share; until the file is there each count is the bound below (logged once). No
  document is cut one way and resumed the other: while the file is missing the sidecar's
  encoder, which loads from it, is not serving either, so such a document fails
  `embeddings_failed` (its passages dropped) and a retry cuts it again with the tokenizer.
- `ByteBound()`: without the tokenizer, the text's UTF-8 bytes plus 2. No tokenizer an encoder
  uses makes more than one token per byte (WordPiece makes at most one per character, a word
  of more than 100 characters counted by its pieces, `split_long_words`; byte-level BPE at
  most one per byte), plus two special tokens. It is safe and about four times too cautious
  for English prose: passages come out a quarter of the size they could be. The app uses it
  only when it has no tokenizer: not EMBED_TOKENIZER, nor the model service's own
  (documents/sizing.py, which says so on /healthz).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# The name its log lines have always carried, not the module's path.
log = logging.getLogger("chatapp.documents.tokens")

# The kinds of text the app embeds, as the sidecar's `input_type` names them: its prompts' names
PROMPT_KINDS = ("query", "passage")


class TokenCounter(Protocol):
    def count(self, text: str) -> int:
        """Tokens the encoder makes of `text`, special tokens included; never an undercount."""
        ...


class ByteBound:
    def count(self, text: str) -> int:
        return len(text.encode("utf-8")) + 2


class EncoderTokens:
    def __init__(self, path: str | Path) -> None:
        file = Path(path)
        if file.is_dir() or file.suffix != ".json":  # the encoder's folder, there or not yet
            file = file / "tokenizer.json"
        self.file = file
        self._tokenizer: Tokenizer | None = None
        self._missing_logged = False

    @property
    def loaded(self) -> bool:
        return self._tokenizer is not None

    def _load(self) -> Tokenizer | None:
        from tokenizers import Tokenizer

        if not self.file.is_file():
            if not self._missing_logged:
                self._missing_logged = True
                log.warning("encoder tokenizer not there yet", extra={"path": str(self.file)})
            return None
        tokenizer = Tokenizer.from_file(str(self.file))
        # A tokenizer.json may carry the encoder's truncation (256 for MiniLM): counting must see
        # the whole text, or a long passage would look short.
        tokenizer.no_truncation()
        tokenizer.no_padding()
        split_long_words(tokenizer)
        self._tokenizer = tokenizer
        return tokenizer

    def count(self, text: str) -> int:
        tokenizer = self._tokenizer or self._load()
        if tokenizer is None:
            return ByteBound().count(text)
        return len(tokenizer.encode(text).ids)


def split_long_words(tokenizer: Tokenizer) -> None:
    """The sidecar's rule (sidecar/embeddings/encoder.py, kept equal by tests/test_contracts.py):
    a word longer than a WordPiece tokenizer's `max_input_chars_per_word` is read as pieces of
    that many characters, each a word of its own, instead of one [UNK]. The sidecar counts such
    a word by its pieces' tokens, so a passage measured here must be too, or it would be
    refused as too long there."""
    from tokenizers import Regex, models, pre_tokenizers

    model = tokenizer.model
    if not isinstance(model, models.WordPiece):
        return
    longest = int(model.max_input_chars_per_word)
    pieces = pre_tokenizers.Split(Regex(f".{{1,{longest}}}"), behavior="isolated")
    first = tokenizer.pre_tokenizer
    tokenizer.pre_tokenizer = pieces if first is None else pre_tokenizers.Sequence([first, pieces])


def encoder_limit(path: str | Path) -> int | None:
    """The most tokens the encoder in folder `path` reads, by the sidecar's rule
    (sidecar/embeddings/folder.py `_max_tokens`): sentence-transformers' `max_seq_length`,
    else the tokenizer's `model_max_length`, capped by the model's `max_position_embeddings`."""
    folder = Path(path)
    folder = folder if folder.is_dir() else folder.parent

    def read(name: str, key: str) -> int | None:
        try:
            value = json.loads((folder / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            return None
        # transformers writes a huge number for "no limit"
        return value if isinstance(value, int) and 0 < value < 1_000_000 else None

    limit = read("sentence_bert_config.json", "max_seq_length")
    limit = limit or read("tokenizer_config.json", "model_max_length")
    positions = read("config.json", "max_position_embeddings")
    if limit and positions:
        return min(limit, positions)
    return limit or positions


def encoder_prompts(path: str | Path) -> dict[str, str]:
    """The prompts of the encoder in folder `path` (its config_sentence_transformers.json, as
    the sidecar reads them: sidecar/embeddings/folder.py), for the kinds the app sends."""
    folder = Path(path)
    folder = folder if folder.is_dir() else folder.parent
    try:
        prompts = json.loads((folder / "config_sentence_transformers.json").read_text())["prompts"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if not isinstance(prompts, dict):
        return {}
    return {k: v for k, v in prompts.items() if k in PROMPT_KINDS and isinstance(v, str) and v}


def prompt_tokens(counter: TokenCounter, prompt: str) -> int:
    """The tokens `prompt` adds before a text, never an undercount: what it adds before a word,
    or its own tokens without the special ones, whichever is more (a prompt ends with a space,
    which a tokenizer that splits at spaces reads as a word of its own at a text's end: one
    token more than it costs before a text, e.g. e5's "query: ", 3 before a text, 4 alone)."""
    if not prompt:
        return 0
    before_a_word = counter.count(prompt + "x") - counter.count("x")
    alone = counter.count(prompt) - counter.count("")
    return max(before_a_word, alone, 0)


def passage_tokens(path: str | None, setting: int) -> int:
    """EMBED_MAX_TOKENS, lowered to the encoder's own limit when its folder says one."""
    limit = encoder_limit(path) if path else None
    return min(setting, limit) if limit else setting


def counter_for(path: str | None) -> TokenCounter:
    """The exact counter when `path` (EMBED_TOKENIZER) is set, else the safe bound."""
    return EncoderTokens(path) if path else ByteBound()
