"""The most bytes of text one token can stand for, read from tokenizer.json: the cheap check that
refuses an over-long prompt before it is tokenized (builder.PromptBuilder.fit).

A prompt of B bytes of user text takes at least ceil(B / L) tokens when no token covers more
than L bytes. That holds only where L is really a bound, so it is None (no cheap check; the
prompt is tokenized, off the step loop: prompt/process.py) unless:
- the normalizer cannot make text shorter (none, Prepend, or a Replace whose replacement is no
  shorter than what it replaces: SentencePiece's " " -> "\u2581"); NFKC, Lowercase, Strip and the
  like may shrink text (a fullwidth letter of 3 bytes becomes 1), so they turn the check off;
- every piece of text has a token: a byte-level BPE (GPT-2's), or a BPE with byte fallback
  (Llama's, Phi-3's). A tokenizer without either may fuse a run of unknown characters into
  one unknown token of any length.
A byte-level vocabulary writes each byte as one character (so L is a piece's characters);
otherwise a piece's UTF-8 length is at least the bytes it stands for ("\u2581" is 3 bytes for one
space, "<0x41>" 6 for one byte): L may be larger than the truth, never smaller.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def max_token_bytes(tokenizer_json: Path) -> int | None:
    """L (above) for the tokenizer in `tokenizer_json`; None where no bound is known."""
    try:
        data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not _never_shrinks(data.get("normalizer")):
        return None
    model = data.get("model") or {}
    vocab = model.get("vocab")
    byte_level = _mentions(data.get("pre_tokenizer"), "ByteLevel") or _mentions(
        data.get("decoder"), "ByteLevel"
    )
    if model.get("type") != "BPE" or not isinstance(vocab, dict) or not vocab:
        return None
    if not (byte_level or model.get("byte_fallback")):
        return None
    if byte_level:
        return max(len(piece) for piece in vocab)
    return max(len(piece.encode("utf-8", "surrogatepass")) for piece in vocab)


def _never_shrinks(normalizer: Any) -> bool:
    if normalizer is None:
        return True
    if not isinstance(normalizer, dict):
        return False
    kind = normalizer.get("type")
    if kind == "Sequence":
        return all(_never_shrinks(n) for n in normalizer.get("normalizers") or [])
    if kind == "Prepend":
        return True
    if kind == "Replace":
        pattern = (normalizer.get("pattern") or {}).get("String")
        content = normalizer.get("content")
        return (
            isinstance(pattern, str)
            and isinstance(content, str)
            and (len(content.encode("utf-8")) >= len(pattern.encode("utf-8")))
        )
    return False


def _mentions(part: Any, kind: str) -> bool:
    """Whether a pre-tokenizer or decoder (or a Sequence of them) is of `kind`."""
    if not isinstance(part, dict):
        return False
    if part.get("type") == kind:
        return True
    inner = part.get("pretokenizers") or part.get("decoders") or []
    return any(_mentions(p, kind) for p in inner)
