"""Structured replies on the batched path (batch/scheduler.py): the `llguidance` package's
matcher masks each guided row's logits before its token is chosen, so the reply follows its
grammar by construction, without onnxruntime-genai's Generator (and the second copy of the
weights its model is).

The grammar is built as onnxruntime-genai 0.18 builds it (src/constrained_logits_processor.cpp):
guidance kind "json_schema" is the schema as given (llguidance's JSON compiler, its default
options: the schema's own `x-guidance` applies), "regex" a regex, "lark_grammar" a Lark
grammar; the tokenizer is the model folder's tokenizer.json with the configuration's
vocabulary size, and the only end token the grammar allows is the first of genai_config.json's
`eos_token_id`. A grammar that fails to build is the same GuidanceRefused (llguidance's
message on one line) as on the Generator path.

What differs from the Generator path, on purpose:
- The grammar state lives in the row's matcher, made fresh when the reply starts, not in the
  KV cache: a guided reply may continue any cached prefix of its scope, and leaves its slot to
  any later request of the scope.
- Forced tokens (`Guidance.ff_tokens`, on by default): the tokens the grammar forces after a
  chosen token are taken at once (`RowGuide.forced`, llguidance's fast-forward, as
  onnxruntime-genai takes them) and read with it in the row's next model call, a run of tokens
  read as a prompt is (batch/step.py), so a guided reply takes no more model calls than
  on the Generator path. With `ff_tokens` off they are taken one per step (the mask then
  allows only the forced token). The tests find greedy guided replies the Generator path's
  token for token, forced tokens on or off.
- When the matcher stops (nothing can follow), the reply ends at once with finish "eos", the
  end token counted as the Generator path counts the end token it would generate next.
- A mask that leaves a row nothing to choose (the grammar allows only the end token while
  `min_new_tokens` forbids it, or the matcher fails) ends the reply with finish "error",
  never with a token outside the grammar.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from pathlib import Path

import llguidance
import numpy as np
from llguidance.numpy import (
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    fill_next_token_bitmask,
)

from sidecar.ipc import Generate, Guidance
from sidecar.model.guidance import refusal

log = logging.getLogger("sidecar.model.batch")


class Grammars:
    """One model's llguidance tokenizer, and the matchers built with it."""

    def __init__(self, tokenizer_json: Path, vocab_size: int, eos_token: int) -> None:
        """`vocab_size`: the model's logits per row (0: unknown, the tokenizer's)."""
        self.vocab_size = vocab_size
        self.unavailable: str | None = None  # why guided requests go to the Generator path
        self._tokenizer: llguidance.LLTokenizer | None = None
        try:
            self._tokenizer = _tokenizer(tokenizer_json, vocab_size, eos_token)
            self.vocab_size = self._tokenizer.vocab_size
        except Exception as exc:  # llguidance says only that it failed, in its own words
            self.unavailable = " ".join(str(exc).split())[:300] or type(exc).__name__
            log.warning(
                "llguidance cannot read this model's tokenizer: guided requests get a Generator",
                extra={"fields": {"reason": self.unavailable}},
            )

    def matcher(self, guidance: Guidance) -> RowGuide:
        """A fresh matcher for one reply; guidance.GuidanceRefused when the grammar cannot be
        built."""
        assert self._tokenizer is not None, "guided requests go to the Generator path"
        try:
            if guidance.kind == "json_schema":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(guidance.data)
            elif guidance.kind == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(guidance.data)
            else:
                grammar = llguidance.LLMatcher.grammar_from_lark(guidance.data)
        except (ValueError, TypeError) as exc:  # not a JSON object
            raise refusal(exc) from exc
        matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise refusal(RuntimeError(matcher.get_error()))
        return RowGuide(matcher, self.vocab_size, fast_forward=guidance.ff_tokens)


class RowGuide:
    """One guided reply's matcher and its token mask."""

    def __init__(
        self, matcher: llguidance.LLMatcher, vocab_size: int, *, fast_forward: bool = False
    ) -> None:
        self._matcher = matcher
        self._mask = allocate_token_bitmask(1, vocab_size)
        self.fast_forward = fast_forward  # Guidance.ff_tokens: forced runs taken at once

    @property
    def stopped(self) -> bool:
        """Nothing can follow what the reply holds: it is complete."""
        return bool(self._matcher.is_stopped())

    def masked(self, logits: np.ndarray, banned: Collection[int] = ()) -> np.ndarray | None:
        """A copy of the row's logits with every token the grammar does not allow next (and
        the `banned` ones) at -inf; None when no token is left (or the matcher failed)."""
        if self._matcher.is_error():
            return None
        fill_next_token_bitmask(self._matcher, self._mask, 0)
        out = np.array(logits, dtype=np.float32, copy=True)
        apply_token_bitmask_inplace(out, self._mask[0])
        if banned:
            out[list(banned)] = -np.inf
        if self._matcher.is_error() or not np.isfinite(out.max()):
            return None
        return out

    def forced(self) -> list[int]:
        """The tokens the grammar forces next (none without `fast_forward`), consumed; an
        empty list if the matcher refused them (`masked` then finds it in error)."""
        if not self.fast_forward or self._matcher.is_error() or self._matcher.is_stopped():
            return []
        tokens = [int(t) for t in self._matcher.compute_ff_tokens()]
        if tokens and not self._matcher.consume_tokens(tokens):
            return []
        return tokens

    def consume(self, token: int) -> bool:
        """Advance the grammar by the chosen token; False if the matcher refused it."""
        return bool(self._matcher.consume_token(token)) and not self._matcher.is_error()

    @property
    def error(self) -> str:
        return str(self._matcher.get_error()) or "the grammar allows no token here"


def follows(grammars: Grammars | None, request: Generate) -> bool:
    """Whether the batched path can follow this request's grammar: a model whose tokenizer
    llguidance cannot read has its guided requests served by a Generator (logged once, at
    load), whose own llguidance then builds the grammar or refuses it."""
    return request.guidance is None or (grammars is not None and grammars.unavailable is None)


def _tokenizer(path: Path, vocab_size: int, eos_token: int) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for the folder's tokenizer.json, where only the tokens the file
    marks `special` are special. Read directly, llguidance takes every added token as special
    (one it cannot match as text) yet its tokenizer still writes such a token for its text, so
    a grammar holding "<tool_call>" (Qwen2's added, non-special token) forces a token it then
    refuses. Ids past the tokenizer's own (the model's padding of its vocabulary) are empty:
    never allowed."""
    plain = llguidance.LLTokenizer(str(path))
    size = vocab_size or plain.vocab_size
    known = plain.vocab_size
    spec = json.loads(path.read_text(encoding="utf-8"))
    special = [int(t["id"]) for t in spec.get("added_tokens") or () if t.get("special")]
    tokens = [plain.decode_bytes([i]) if i < known else b"" for i in range(size)]
    source = _TokenSource(tokens, [i for i in special if i < size], eos_token, plain)
    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(source), n_vocab=size, eos_token=eos_token
    )


class _TokenSource:
    """What llguidance.TokenizerWrapper reads: each id's bytes, the special ids, the end
    token, and how text is tokenized (the tokenizer's own way)."""

    bos_token_id = None

    def __init__(
        self,
        tokens: list[bytes],
        special_token_ids: list[int],
        eos_token_id: int,
        plain: llguidance.LLTokenizer,
    ) -> None:
        self.tokens = tokens
        self.special_token_ids = special_token_ids
        self.eos_token_id = eos_token_id
        self._plain = plain

    def __call__(self, text: bytes) -> list[int]:
        return list(self._plain.tokenize_bytes(text))
