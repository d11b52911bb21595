"""Structured replies in the model worker: what a request's guidance (ipc.Guidance, built by
web/structured/guidance.py) changes about its generator. engine.py makes the onnxruntime-genai
calls.

Facts of onnxruntime-genai 0.18 this relies on (checked on the installed wheel; the docs'
"Structured output" section repeats them):
- `GeneratorParams.set_guidance(kind, data, enable_ff_tokens)` compiles the grammar when the
  Generator is made; a bad schema or grammar raises there ("Error creating grammar: ...").
- The grammar advances only on generated tokens (appended prompt tokens do not touch it), it
  is reset by `rewind_to`, and after the reply it stopped with, appending more tokens without
  a rewind fails ("compute_mask() called after stop"). So a guided generator continued from
  the conversation cache is always rewound first, by at least one token.
- With forced tokens on, one `generate_next_token` may add several tokens (the forced ones
  computed in the same model call): the new tokens of a step are read from the sequence. They
  are appended without a length check, and a run past the generator's max_length fails inside
  onnxruntime, so a generator that may fast-forward gets FF_MARGIN tokens of room more than
  its request needs; where the context cannot give that, forced tokens are turned off for the
  request (the reply follows the same grammar, one step a token).
"""

from __future__ import annotations

from dataclasses import replace

from sidecar.ipc import Guidance

# Room beyond a request's own tokens for the forced tokens of its last step (the longest run a
# grammar forces at once: a long property name or constant).
FF_MARGIN = 128


class GuidanceRefused(Exception):
    """onnxruntime-genai could not build the grammar; str() is its reason, on one line."""


def fitted(guidance: Guidance | None, needed: int, max_length: int) -> Guidance | None:
    """The guidance a request of `needed` tokens runs with: forced tokens only where the
    generator can hold FF_MARGIN more tokens."""
    if guidance is None or not guidance.ff_tokens or needed + FF_MARGIN <= max_length:
        return guidance
    return replace(guidance, ff_tokens=False)


def room(guidance: Guidance | None) -> int:
    """The tokens a generator needs beyond its request's for this guidance."""
    return FF_MARGIN if guidance is not None and guidance.ff_tokens else 0


def refusal(error: BaseException) -> GuidanceRefused:
    """The error onnxruntime-genai raised for a grammar, as one line for the client (a regex
    error spans lines: the pattern, a caret, the reason)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return GuidanceRefused(text.removeprefix("Error creating grammar: ")[:300])
