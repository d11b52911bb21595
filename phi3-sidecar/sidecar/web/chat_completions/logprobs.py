"""Log probabilities on the wire: the worker's ipc.TokenLogprob entries (which distribution
they describe: model/logprobs.py) as OpenAI's APIs write them.

A token is bytes (one may hold part of a character): `token` is its text, with the bytes of an
incomplete character written as \\xNN escapes, and `bytes` its UTF-8 bytes, as OpenAI sends
both. Values are natural logarithms; a token the grammar forced has 0.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

from sidecar.ipc import TokenLogprob


def token_text(token: bytes) -> str:
    return token.decode("utf-8", "backslashreplace")


def alternative(token: bytes, logprob: float) -> dict[str, Any]:
    return {"token": token_text(token), "logprob": logprob, "bytes": list(token)}


def entry(logprob: TokenLogprob) -> dict[str, Any]:
    """Chat Completions' `logprobs.content` item, also the Responses API's `output_text`
    logprobs item."""
    top = [alternative(token, value) for token, value in logprob.top]
    return alternative(logprob.token, logprob.logprob) | {"top_logprobs": top}


def entries(logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    return [entry(lp) for lp in logprobs]


class Legacy:
    """/v1/completions' `logprobs` objects of one reply, chunk by chunk: parallel lists, each
    alternative keyed by its text (two tokens with one text keep the likelier), and
    `text_offset`, the character of the choice's text where each token starts (the first at
    `offset`: the prompt's length when it is echoed). A token that completes a character
    started by an earlier one starts after it."""

    def __init__(self, offset: int = 0) -> None:
        self._offset = offset
        self._decoder = codecs.getincrementaldecoder("utf-8")("ignore")

    def chunk(self, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        offsets, tops = [], []
        for logprob in logprobs:
            offsets.append(self._offset)
            self._offset += len(self._decoder.decode(logprob.token))
            top: dict[str, float] = {}
            for token, value in logprob.top:
                top.setdefault(token_text(token), value)  # best first: the first of a text wins
            tops.append(top)
        return {
            "tokens": [token_text(lp.token) for lp in logprobs],
            "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": tops,
            "text_offset": offsets,
        }
