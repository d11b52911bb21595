"""Choosing the next token from a row of logits, for the batched path (batch/scheduler.py).

The documented meaning of the request fields: no temperature (or 0, or one below
ipc.MIN_TEMPERATURE: the caller passes None then) is greedy, the first of the highest logits
(onnxruntime-genai's greedy search picks the same one). Otherwise the logits, less the highest
one, are divided by the temperature (so every value is 0 or below: no temperature overflows
them, and exp() never sees inf - inf); top_k keeps the k most likely tokens (0 or absent: all);
top_p keeps the most likely ones until their probability adds up to top_p (at least one);
one token is drawn from what is left, walked in vocabulary order (`_kept`). Each request has
its own random generator, seeded with its seed, so a seeded request gets the same reply
whatever else runs at the same time.

A repetition penalty (onnxruntime-genai's `repetition_penalty`, llama.cpp's `repeat_penalty`)
is applied first, with the usual meaning: the logit of every token already in the sequence
(prompt included) is divided by the penalty if positive, multiplied by it if negative. It runs in
float32, the logits' type; the APIs bound it to 0.1-10 (web/chat_completions/llamacpp_fields.py), so
a finite logit stays finite.

Logits that hold NaN or +inf (a model that overflowed, a penalty beyond those bounds), or none
that is finite, give no token: NonFiniteLogits, which ends that reply alone (batch/step.py).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import numpy as np


class NonFiniteLogits(ArithmeticError):
    """A row's logits hold NaN or +inf, or nothing but -inf: no token can be chosen."""


class Sampler:
    def __init__(
        self,
        temperature: float | None,
        top_k: int | None,
        top_p: float | None,
        seed: int | None,
    ) -> None:
        self.temperature = temperature or 0.0
        self.top_k = top_k or 0
        self.top_p = 1.0 if top_p is None else top_p
        self._random = np.random.default_rng(seed)

    def pick(self, logits: np.ndarray, banned: Collection[int] = ()) -> int:
        """The next token from one row of logits; `banned` ids are never chosen (the EOS ids
        while the reply is shorter than its minimum)."""
        if banned:
            logits = logits.copy()
            logits[list(banned)] = -np.inf
        top = float(np.max(logits))  # NaN if any logit is NaN
        if not math.isfinite(top):
            raise NonFiniteLogits(f"the highest logit is {top}")
        if not self.temperature:
            return int(np.argmax(logits))
        # The highest logit first: every value is then 0 or below (-inf for a banned token),
        # whatever the temperature divides, and the first of the order is exp(0) = 1.
        scaled = (logits.astype(np.float64) - top) / self.temperature
        kept = self._kept(scaled)
        probabilities = np.exp(scaled[kept])
        probabilities /= probabilities.sum()
        return int(kept[self._random.choice(len(kept), p=probabilities)])

    def _kept(self, scaled: np.ndarray) -> np.ndarray:
        """The ids top_k and top_p keep, in vocabulary order: the draw walks them in that
        order, not by likelihood, so that two logits a last bit apart (a row decoded alone or
        in a batch on a CPU whose kernels differ there, tests/support/kernels.py) swap no
        places and the same seed lands on the same token."""
        if not 0 < self.top_k < len(scaled) and self.top_p >= 1.0:
            return np.arange(len(scaled))
        order = np.argsort(-scaled, kind="stable")
        if 0 < self.top_k < len(order):
            order = order[: self.top_k]
        if self.top_p < 1.0:
            probabilities = np.exp(scaled[order])
            probabilities /= probabilities.sum()
            keep = int(np.searchsorted(np.cumsum(probabilities), self.top_p)) + 1
            order = order[:keep]
        return np.sort(order)


def penalize_repeats(logits: np.ndarray, seen: Sequence[int], penalty: float) -> np.ndarray:
    """The logits with the tokens of `seen` penalised (a copy; float32 arithmetic)."""
    ids = np.unique(np.asarray(seen, dtype=np.int64))
    out = logits.astype(np.float32, copy=True)
    factor = np.float32(penalty)
    chosen = out[ids]
    out[ids] = np.where(chosen < 0, chosen * factor, chosen / factor)
    return out
