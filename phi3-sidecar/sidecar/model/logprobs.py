"""Log probabilities of the generated tokens (ipc.Generate.logprobs), on both paths.

Which distribution: the one the token was chosen from, after the processing that chooses it:
the model's logits with the repetition penalty applied, the end tokens banned while the reply
is shorter than its minimum, and every token a grammar does not allow (structured output, tool
calls) removed; then divided by the temperature (1 for a greedy reply, whose token is the most
likely of that distribution); then normalised (log-softmax, in float64). top_k and top_p are
not applied: they cut the set a sampled token is then drawn from, and the values would stop
being comparable between requests. A token the grammar forces (the only one it allows) has
log probability 0.

- Batched path (batch/row.py): `BatchGeneration.take` hands the row it chose from.
- Generator path (generator/generation.py): onnxruntime-genai 0.18's `Generator.get_logits()`
  returns a copy of the logits the next `generate_next_token()` chooses from, before its processing
  (computing them early changes nothing: the step then uses them); the penalty and the ban are
  applied here as the Generator applies them (batch.sampling.penalize_repeats), and a grammar's mask
  comes from an llguidance matcher of the same grammar that follows the reply (`shadow`),
  since onnxruntime-genai's own is not readable. Tokens it forces in front of a sampled one
  are listed with log probability 0. A request with log probabilities takes no prompt-lookup
  drafts (a drafted step checks several tokens in one call).

The end token is not listed (it is no text). A token whose text holds any part of a stop
sequence is left out: its text is never shown, so neither is the token; the entries are held
back with the text a stop filter holds, and dropped with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from pathlib import Path

import numpy as np

from sidecar.ipc import Finish, TokenLogprob
from sidecar.model.stops import StopFilter

log = logging.getLogger("sidecar.model.logprobs")


class TokenTexts:
    """Each token id's bytes (what the model's tokenizer writes for it alone), made on first
    use: from tokenizer.json as llguidance reads it (a SentencePiece word-start marker is a
    space, a byte-fallback token its byte), else the tokenizer's own decode of each id."""

    def __init__(self, tokenizer_json: Path, decode: Callable[[int], str]) -> None:
        self._path = tokenizer_json
        self._decode = decode
        self._table: list[bytes] | None = None

    def table(self, vocab_size: int) -> list[bytes]:
        if self._table is None or len(self._table) < vocab_size:
            self._table = self._read(vocab_size)
        return self._table

    def _read(self, vocab_size: int) -> list[bytes]:
        try:
            import llguidance

            plain = llguidance.LLTokenizer(str(self._path))
            known = plain.vocab_size
            return [plain.decode_bytes([i]) if i < known else b"" for i in range(vocab_size)]
        except Exception as exc:  # the tokenizer's own decode: word-start spaces may be lost
            log.warning(
                "token texts from the tokenizer's decode",
                extra={"fields": {"reason": type(exc).__name__}},
            )
            return [self._decode(i).encode("utf-8", "replace") for i in range(vocab_size)]


class ReplyLogprobs:
    """One reply's entries: each chosen token's log probability and the `top` most likely
    tokens at its place, released as the text they make is shown."""

    def __init__(self, top: int, texts: TokenTexts, temperature: float | None) -> None:
        self.top = top
        self._texts = texts
        self._temperature = temperature or 1.0  # greedy: the logits' own distribution
        self._held: list[TokenLogprob] = []  # made, not yet released (a stop filter holds text)

    def chosen(self, logits: np.ndarray, token: int, banned: Collection[int] = ()) -> None:
        """`token` was chosen from `logits` (one row, after the penalty and the grammar's
        mask: -inf for what it does not allow), with the `banned` ids not allowed either."""
        row = np.asarray(logits, dtype=np.float64).reshape(-1)
        if banned:
            row = row.copy()
            row[list(banned)] = -np.inf
        scaled = (row - row.max()) / self._temperature
        logprobs = scaled - np.log(np.exp(scaled).sum())
        texts = self._texts.table(len(row))
        top: tuple[tuple[bytes, float], ...] = ()
        if self.top:
            count = min(self.top, len(row))
            best = np.argpartition(-logprobs, count - 1)[:count]
            ordered = sorted(best.tolist(), key=lambda i: (-logprobs[i], i))
            top = tuple((texts[i], float(logprobs[i])) for i in ordered if logprobs[i] > -np.inf)
        self._held.append(TokenLogprob(texts[token], float(logprobs[token]), top))

    def forced(self, token: int, vocab_size: int) -> None:
        """A token the grammar forced: the only one it allowed."""
        text = self._texts.table(vocab_size)[token]
        self._held.append(TokenLogprob(text, 0.0, ((text, 0.0),) if self.top else ()))

    def take(self, stops: StopFilter, finish: Finish | None) -> tuple[TokenLogprob, ...]:
        """The entries to send now: none while the reply's stop filter holds text back (they
        wait with it), none ever when a stop sequence ended the reply (nothing of the text it
        held, nor of the stop, is shown)."""
        if finish == "stop":
            self._held.clear()
        if (finish is None and stops.holding) or not self._held:
            return ()
        out, self._held = tuple(self._held), []
        return out
