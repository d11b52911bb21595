"""The llama.cpp server fields that /v1/chat/completions accepts, and what each means here.

App Service's built-in model sidecar extension is llama.cpp's server on localhost:11434, and
the apps written for it (Microsoft's "tutorial-ai-slm" samples) send llama.cpp's own fields
with their OpenAI-style requests, e.g. {"stream": true, "cache_prompt": false, "n_predict":
150}. They are accepted here so that such an app works against this sidecar unchanged.
OpenAI's own fields keep their meaning (an absent temperature is greedy here, where llama.cpp
samples at 0.8; docs/api.md, "llama.cpp server fields", lists every difference).

With llama.cpp's meaning (the fields are declared in chat_completions/schemas.py, in one block):
  n_predict       the reply's length limit, as max_tokens. -1 (llama.cpp's default, "no
                  limit") is as absent: MAX_NEW_TOKENS, bounded by the context. 0 (llama.cpp:
                  read the prompt, write nothing) is refused. Given with a max_tokens or
                  max_completion_tokens of another value: 400 naming n_predict.
  cache_prompt    false: this request neither reads from nor leaves anything in the
                  conversation cache (its prompt is read in full; its generator is dropped at
                  the end). true, llama.cpp's default, is as absent.
  repeat_penalty  onnxruntime-genai's repetition_penalty: each token already in the sequence
                  (prompt and reply; llama.cpp looks at the last 64 only) has its score divided
                  by it (multiplied, if negative); 1.0 is off, 0.1 to 10 (float32 arithmetic).
                  Greedy and sampled alike.
  top_k 0, seed -1   llama.cpp's "no top-k cut" and "a random seed": as absent.
  stop, top_k, seed  as before (OpenAI's or /predict's meaning; they agree with llama.cpp's).

Accepted with any value of their type and ignored (IGNORED): llama.cpp's other sampling knobs
and reply extras, which this engine does not have (onnxruntime-genai 0.18 has no min_p, for
one). Without a temperature the reply is greedy and none of the samplers would change it.
Anything else that is not an OpenAI field keeps the 400 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

# n_predict: -1 means "no limit of its own" (llama.cpp's default); 0 is refused with a reason.
PredictLimit = Annotated[int, Field(ge=-1, le=131072)]
# It runs in float32, the logits' type (model/batch/sampling.py): bounded both ways, so that
# dividing or multiplying a logit by it changes the logit tenfold at most and never overflows (7e-39
# made an inf logit, then a NaN probability).
MIN_REPEAT_PENALTY, MAX_REPEAT_PENALTY = 0.1, 10.0
RepeatPenalty = Annotated[
    float,
    Field(ge=MIN_REPEAT_PENALTY, le=MAX_REPEAT_PENALTY, description="1.0: off; 0.1 to 10"),
]

# llama.cpp's "off" values of fields that this API also has: the same as leaving them out.
_OFF = {"top_k": 0, "seed": -1, "n_predict": -1}

_NUMBER = "a number"
_INTEGER = "an integer"
_BOOLEAN = "true or false"
_LIST = "a list"
_ANY = "any value"
# llama.cpp server fields accepted and ignored, with the JSON type each must have. Their
# meaning is llama.cpp's (tools/server/README.md); none of them has one here.
IGNORED: dict[str, str] = {
    # samplers onnxruntime-genai does not have
    "min_p": _NUMBER,
    "typical_p": _NUMBER,
    "dynatemp_range": _NUMBER,
    "dynatemp_exponent": _NUMBER,
    "top_n_sigma": _NUMBER,
    "repeat_last_n": _INTEGER,
    "dry_multiplier": _NUMBER,
    "dry_base": _NUMBER,
    "dry_allowed_length": _INTEGER,
    "dry_penalty_last_n": _INTEGER,
    "dry_sequence_breakers": _LIST,
    "xtc_probability": _NUMBER,
    "xtc_threshold": _NUMBER,
    "mirostat": _INTEGER,
    "mirostat_tau": _NUMBER,
    "mirostat_eta": _NUMBER,
    "min_keep": _INTEGER,
    "samplers": _LIST,
    # the server's slots, its KV cache handling and its reply extras
    "n_keep": _INTEGER,
    "n_cache_reuse": _INTEGER,
    "id_slot": _INTEGER,
    "n_probs": _INTEGER,
    "post_sampling_probs": _BOOLEAN,
    "return_tokens": _BOOLEAN,
    "return_progress": _BOOLEAN,
    "timings_per_token": _BOOLEAN,
    "t_max_predict_ms": _INTEGER,
    "chat_template_kwargs": _ANY,
}


def _has_type(value: object, kind: str) -> bool:
    if kind == _ANY:
        return True
    if kind == _BOOLEAN:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == _INTEGER:
        return isinstance(value, int)
    if kind == _NUMBER:
        return isinstance(value, int | float)
    return isinstance(value, list)


def accept(data: dict[str, Any]) -> dict[str, Any]:
    """The body without the ignored fields and the "off" values (a copy); ValueError naming a
    field whose value has the wrong type or cannot be served."""
    data = dict(data)
    for name, kind in IGNORED.items():
        value = data.pop(name, None)
        if value is not None and not _has_type(value, kind):
            raise ValueError(f"{name}: must be {kind} (accepted and ignored)")
    for name, off in _OFF.items():
        value = data.get(name)
        if value == off and not isinstance(value, bool):
            del data[name]
    n_predict = data.get("n_predict")
    if n_predict == 0 and not isinstance(n_predict, bool):
        raise ValueError(
            "n_predict: 0 (read the prompt and write nothing) is not supported; give 1 or "
            "more, or -1 for the default length"
        )
    cache_prompt = data.get("cache_prompt")
    if cache_prompt is True or cache_prompt is None:  # llama.cpp's default, or null
        data.pop("cache_prompt", None)
    return data


def reply_limit(
    n_predict: int | None, max_tokens: int | None, max_completion_tokens: int | None
) -> int | None:
    """The reply's length limit the request gives (None: the default); ValueError naming
    n_predict when it differs from OpenAI's limit."""
    openai = max_completion_tokens or max_tokens
    if n_predict is not None and openai is not None and n_predict != openai:
        name = "max_completion_tokens" if max_completion_tokens else "max_tokens"
        raise ValueError(
            f"n_predict: {n_predict} differs from {name} {openai}; give one of them (or the "
            "same value in both)"
        )
    return openai or n_predict
