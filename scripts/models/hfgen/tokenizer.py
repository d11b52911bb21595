"""tokenizer.json made offline with the `tokenizers` package, in one of the two shapes the
families publish:

- byte-level BPE (Llama 3, Qwen2): GPT-2's byte alphabet, no unknown token;
- SentencePiece-style BPE with byte fallback (Llama 2, Mistral, Phi-3, Gemma): pieces spelled
  with "▁" for a space, characters outside the vocabulary as <0xNN> byte tokens, and (except
  Gemma) a "▁" put in front of the text.

Merges are learnt from scripts/models/modelgen's small multilingual corpus, deterministically, so the
same size always gives the same vocabulary. Special tokens come last, in the family's order.
"""

from __future__ import annotations

import itertools
import json
import unicodedata
from collections.abc import Sequence
from typing import Any, Literal

from scripts.models.modelgen.vocab import CORPUS, byte_chars, learn_merges, merge_word

Style = Literal["byte_level", "sentencepiece", "gemma"]
SPACE = "\u2581"  # ▁, SentencePiece's space


def build_tokenizer(
    style: Style,
    merges: int,
    leading: Sequence[str],
    specials: Sequence[tuple[str, bool]],
    bos: str | None,
) -> dict[str, Any]:
    """The parsed tokenizer.json: `leading` special tokens get the first ids (SentencePiece's
    <unk> <s> </s>), then the base alphabet and `merges` learnt pieces, then `specials`
    (content, special). With `bos`, encoding with special tokens puts it in front (the
    post-processor the families ship; chat templates write it themselves)."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    if style == "byte_level":
        base = byte_chars()
        learnt = learn_merges(merges)
        vocab = {t: i for i, t in enumerate([*leading, *base, *(a + b for a, b in learnt)])}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=learnt))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    else:
        prefix = style == "sentencepiece"
        pieces, learnt = _sentencepiece_vocab(merges, prefix)
        byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
        vocab = {t: i for i, t in enumerate([*leading, *byte_tokens, *pieces])}
        unk = "<unk>" if "<unk>" in leading else None
        tok = Tokenizer(models.BPE(vocab=vocab, merges=learnt, byte_fallback=True, unk_token=unk))
        steps = [normalizers.Prepend(SPACE)] if prefix else []
        tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE)])
        strip = [decoders.Strip(" ", 1, 0)] if prefix else []
        tok.decoder = decoders.Sequence(
            [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
        )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in leading])
    tok.add_tokens([AddedToken(t, special=special, normalized=False) for t, special in specials])
    if bos is not None:
        bos_id = tok.token_to_id(bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    data: dict[str, Any] = json.loads(tok.to_str())
    return data


def _sentencepiece_vocab(merges: int, prefix: bool) -> tuple[list[str], list[tuple[str, str]]]:
    """Single characters of the corpus, then BPE merges of "▁"-spelled words."""
    words: dict[tuple[str, ...], int] = {}
    for line in CORPUS.strip().splitlines():
        text = (SPACE if prefix else "") + line.replace(" ", SPACE)
        for piece in text.split(SPACE):
            if piece:
                key = tuple(SPACE + piece)
                words[key] = words.get(key, 0) + 1
    chars = sorted({c for word in words for c in word})
    learnt: list[tuple[str, str]] = []
    known = set(chars)
    while len(learnt) < merges:
        counts: dict[tuple[str, str], int] = {}
        for word, n in words.items():
            for pair in itertools.pairwise(word):
                if _may_merge(*pair):
                    counts[pair] = counts.get(pair, 0) + n
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        if best[0] + best[1] not in known:
            learnt.append(best)
            known.add(best[0] + best[1])
        words = {merge_word(w, best): n for w, n in words.items()}
    return [*chars, *(a + b for a, b in learnt)], learnt


def _may_merge(left: str, right: str) -> bool:
    """As SentencePiece splits text by Unicode script: a piece is letters of one script or
    digits, with at most a leading "▁"; punctuation and symbols stay single characters."""
    if SPACE in right or _kind(right) is None:
        return False
    rest = left[1:] if left.startswith(SPACE) else left
    return rest == "" or _kind(rest) == _kind(right)


def _kind(text: str) -> str | None:
    kinds = set()
    for char in text:
        category = unicodedata.category(char)
        if category[0] == "L":
            kinds.add(unicodedata.name(char, "?").split()[0])
        elif category[0] == "N":
            kinds.add("DIGIT")
        else:
            return None
    return kinds.pop() if len(kinds) == 1 else None
