"""Prompt-lookup drafts (PROMPT_LOOKUP_TOKENS): onnxruntime-genai 0.18's n-gram speculative
decoding. When the last tokens of the sequence occurred before (in the prompt or the reply),
the tokens that followed them there are proposed as a draft, and one model call checks them
all: a reply that copies its prompt (an edit, a summary, code) gets several tokens a call.

A miss costs a verify call that yields one token, so the drafts are bounded: the draft length
adapts down to one token after misses and drafting pauses (cooldown) after a run of them.
Greedy generations only: verifying drafts consumes the sampler's random numbers differently,
so a seeded sampled reply would change with the setting. The generator still hands out one
token per generate_next_token call (accepted drafts are queued), so the worker's loop, stop
sequences and cancellation are unchanged.

Verifying k drafts computes their K/V in one call; like a chunked prefill (kv/prompt_cache.py,
"Exactness"), that differs from one token at a time in the last bits, so a greedy reply can
differ at a near tie. On the generated `tiny` model replies are identical
(tests/sidecar/model/generator/test_sidecar_drafts.py); the real model's agreement is in
docs/benchmarks/variants.md.
"""

from __future__ import annotations

from typing import Any

from sidecar.ipc import Drafts

# An n-gram of 3 tokens must match before a draft is proposed: 2 proposes more often and is
# accepted less (measured on the generated models); the draft length adapts down to this.
NGRAM_SIZE = 3
MIN_ADAPTIVE_TOKENS = 1


def use_prompt_lookup(params: Any, max_draft_tokens: int) -> None:
    """Turn drafts on for the generator made from `params` (og.GeneratorParams); 0: off."""
    if max_draft_tokens:
        params.set_speculative_options(
            max_draft_tokens=max_draft_tokens,
            ngram_size=NGRAM_SIZE,
            min_adaptive_k=MIN_ADAPTIVE_TOKENS,
            cooldown=True,
        )


def draft_counts(generator: Any) -> Drafts:
    """The generator's counts since it was made (they survive rewinds, so a cached generator's
    counts for one request are the difference of two readings)."""
    stats = generator.get_speculative_stats()
    # Decode calls: verify (and re-anchor) calls when a draft was proposed, plain steps when not.
    steps = int(stats["target_forward_passes"]) + int(stats["standard_fallback_steps"])
    return Drafts(int(stats["draft_tokens_evaluated"]), int(stats["draft_tokens_accepted"]), steps)
