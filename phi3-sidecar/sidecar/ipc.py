"""What crosses the boundary between the web process (sidecar/web/) and the model worker
process (sidecar/model/): how the worker is started, and the messages (pickled over pipes).

Web -> worker: Generate, Cancel, Stop, Ping. Per-request messages carry the request's `key`.
Worker -> web: Phase (load progress), then per request either Rejected, or Started, any number
of Reading (a long prompt being read) and Piece, and one End; CacheStats after a change; Pong
for each Ping (read between two steps, so a worker that stops answering is noticed:
web/generation/model_client.py's watchdog).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

# The model process's entry point, by name: the web process never imports model code
# (onnxruntime-genai, the tokenizer, the prompt builder), only this module.
WORKER_ENTRY = "sidecar.model.worker:main"


def resolve(entry: str) -> Callable[..., Any]:
    """The function named by `module:function`."""
    module, _, name = entry.partition(":")
    function: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return function


def run(entry: str, *args: object) -> None:
    """A process target that imports `module:function` in the new process and calls it."""
    resolve(entry)(*args)


Role = Literal["system", "user", "assistant"]
# "restarting": the worker died or stopped answering and is being replaced (the web process
# sets it); "failed": the model cannot load, and waiting will not help.
PhaseName = Literal[
    "starting", "downloading", "loading", "warming_up", "ready", "restarting", "failed"
]
# eos: the model ended its reply; stop: a stop sequence did; length: the token budget did;
# time_limit: the request's deadline did (REPLY_TIME_LIMIT_S: App Service's front end cuts a
# request at 230 s, so the reply ends cleanly before that).
Finish = Literal["eos", "stop", "length", "time_limit", "cancelled", "error"]
# Why the worker refuses a request; the web process decides the status (web/errors.py).
# overloaded: the request waited for KV memory (KV_MEMORY_MB) until its deadline.
# invalid_image: the model's image processor refused an image the web process let through.
Refusal = Literal[
    "context_length_exceeded",
    "unencodable_prompt",
    "start_failed",
    "invalid_guidance",
    "overloaded",
    "invalid_image",
]
# Where a turn's cached tokens came from (model/kv/tiers.py): its KV slot, compact RAM, the
# disk tier; None: nothing was reused (the prompt is read, "recomputed").
CacheTier = Literal["ram", "compact", "disk"]
GuidanceKind = Literal["json_schema", "regex", "lark_grammar"]

# The most alternatives a token's log probabilities list (OpenAI's top_logprobs bound).
MAX_TOP_LOGPROBS = 20

# A temperature below this is greedy, as 0 or none is (vLLM's bound, _SAMPLING_EPS): dividing
# logits by less only overflows (1.8e-307 made inf, then NaN) and samples nothing greedy would
# not pick. Both APIs accept 0 to 2 (web/generation/messages.py); the chat app applies the same
# floor before it sends (chatapp/relay/wire.py; tests/test_contracts.py keeps the two equal).
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True, slots=True)
class Guidance:
    """A grammar every token of the reply must follow (onnxruntime-genai's llguidance), built
    by the web process from the request (web/structured/guidance.py). All three fields are part of
    what a conversation cache entry matches: a generator keeps its grammar for life."""

    kind: GuidanceKind
    data: str  # the JSON Schema or Lark grammar, as text
    # Tokens the grammar forces (keys, punctuation) are appended without a decode step each.
    ff_tokens: bool = True


# Whose a scope is. With API_KEY set, the web process (web/generation/pipeline.py) gives the
# worker every scope as its owner's (the API key's fingerprint, web/guards/access.py), so that no
# client can name another key's scope (read its cached prefix through `cached_tokens`), and a
# request without a scope joins its owner's own unscoped pool. Without an owner (API_KEY unset),
# scopes are as the routes name them. An owner is any string without "/" (a later principal, such
# as a signed-in user of the app within the app's key, makes a longer owner, never a new rule
# here).
OWNER = "owner:"


def owned_scope(owner: str, scope: str | None) -> str | None:
    """`scope` as the worker gets it: within `owner`'s own, or unchanged without an owner."""
    if not owner:
        return scope
    return f"{OWNER}{owner}" if scope is None else f"{OWNER}{owner}/{scope}"


def in_unscoped_pool(scope: str | None) -> bool:
    """Whether `scope` is an unscoped pool (model/kv/prompt_cache.py's rules for one): the shared
    one (None) or an owner's own (a request of that owner that named no scope)."""
    return scope is None or (scope.startswith(OWNER) and "/" not in scope)


@dataclass(frozen=True, slots=True)
class Generate:
    request_id: str  # for log lines
    messages: tuple[tuple[Role, str], ...]
    max_new_tokens: int
    min_new_tokens: int = 0
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    # Who may reuse this conversation's cached tokens (model/kv/prompt_cache.py); None: the
    # shared unscoped pool. `cache_scope` is the scope's one internal name in both services;
    # the names clients send stay as documented (docs/api.md) and map to it: the chat page's
    # `conversation_id` (chatapp/relay/wire.py puts it in the payload's `cache_scope`, sent as
    # /predict's `cache_scope` or /v1's `prompt_cache_key`); /predict's `cache_scope`
    # ("scope:" + it, web/predict/api.py); /v1's `prompt_cache_key` ("key:" + it), else
    # `user` ("user:" + it, web/chat_completions/schemas.py). With API_KEY set, its owner's:
    # owned_scope.
    cache_scope: str | None = None
    stop: tuple[str, ...] = ()  # stop sequences (model/stops.py)
    guidance: Guidance | None = None  # structured output (JSON Schema, tool calls)
    # False: this request neither reads from nor leaves anything in the conversation cache
    # (llama.cpp's `cache_prompt: false`).
    use_cache: bool = True
    repetition_penalty: float | None = None  # onnxruntime-genai's; None or 1.0: off
    # time.monotonic() (one clock for both processes) after which the worker ends the reply
    # with finish "time_limit", between two steps; None: no deadline.
    deadline: float | None = None
    # Log probabilities (model/logprobs.py): None, none; n (0 to MAX_TOP_LOGPROBS), each
    # generated token's and the n most likely tokens at its place, sent with its Piece.
    logprobs: int | None = None
    # A plain prompt (/v1/completions): its text, or its token ids, read as they are, with no
    # chat template; `messages` is then empty.
    prompt: str | tuple[int, ...] | None = None
    # Images (issue 36): PNG bytes the web process decoded, checked and re-encoded
    # (web/images/decoding.py), so the worker never hands unchecked bytes to the image processor
    # (a malformed JPEG makes libjpeg exit the process). `image_slots[i]` places image i:
    # (index into `messages`, character offset into that message's text); the worker puts
    # the model's own image tag there. Text in the messages is always plain text, even when
    # it looks like a tag.
    images: tuple[bytes, ...] = ()
    image_slots: tuple[tuple[int, int], ...] = ()
    # A grounded request's passages (issue 54): texts that stand verbatim in its messages, whose
    # K/V the passage store (model/kv/passages.py) keeps and puts back wherever they stand;
    # `passage_scope`: whose store they are in (with API_KEY set, within its owner's:
    # owned_scope), so no owner's request finds another's passages.
    passages: tuple[str, ...] = ()
    passage_scope: str | None = None
    # Only note the passages to be read into the store while idle (the app's library warmed
    # ahead of questions, web/passages/api.py): no reply; the worker answers `Warmed`.
    warm: bool = False
    key: int = 0  # unique per request (X-Request-Id may repeat); the web process sets it

    @property
    def sampling(self) -> bool:
        """Whether the reply is sampled: the one rule every path reads (the sampler, the
        Generator's do_sample, the conversation cache's sampling mode)."""
        return self.temperature is not None and self.temperature >= MIN_TEMPERATURE


@dataclass(frozen=True, slots=True)
class Cancel:
    key: int
    # time.monotonic() (one clock for all processes) right after the web process noticed the
    # disconnect and queued this message; the worker counts tokens it finished after that.
    noticed_at: float


@dataclass(frozen=True, slots=True)
class Stop:
    pass


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class Pong:
    pass


@dataclass(frozen=True, slots=True)
class Phase:
    name: PhaseName
    reason: str | None = None
    context_length: int | None = None
    # Whether the loaded model reads images (a vision type, e.g. phi3v); set with "ready".
    image_input: bool = False
    # The passage store (model/kv/passages.py), set with "ready": "rotated" (stored passages
    # placed where prompts hold them), "exact: <why>" (the model's attention cannot take moved
    # keys: every passage is read), or "off" (PASSAGE_KV_MB=0, PROMPT_CACHE_EXACT, no batched
    # path)
    passage_reuse: str = "off"

    @property
    def ready(self) -> bool:
        return is_ready(self.name)


def is_ready(phase: PhaseName) -> bool:
    """The one test of readiness: the worker loaded the model and generated a warm-up token."""
    return phase == "ready"


@dataclass(frozen=True, slots=True)
class Rejected:
    key: int
    reason: Refusal
    message: str
    limit_tokens: int | None = None
    # What the refusal cost (issue 46): seconds the worker's side spent on the request before
    # refusing it (building its prompt, in the prompt process or in the worker), and whether
    # the byte bound refused it before any tokenization (model/prompt/token_bound.py)
    spent_s: float = 0.0
    byte_bound: bool = False


@dataclass(frozen=True, slots=True)
class Started:
    key: int
    prompt_tokens: int
    dropped_messages: int
    max_new_tokens: int
    cached_tokens: int = 0  # leading prompt tokens the conversation cache already held
    cache_reason: str = ""  # why those, or none (model/kv/prompt_cache.py, REASONS)
    cache_tier: CacheTier | None = None  # where those came from
    restore_s: float = 0.0  # the time it took to put them back into a KV slot
    image_tokens: int = 0  # prompt tokens that stand for images (counted in prompt_tokens)
    # Characters of text tokenized to build the prompt (0: its tokens were kept from an
    # earlier turn, or given as ids) and the seconds that took (model/prompt/process.py)
    tokenized_chars: int = 0
    prepare_s: float = 0.0
    # Seconds it waited for room under the KV bound (KV_MEMORY_MB) before it started
    kv_wait_s: float = 0.0
    # Seconds its start spent moving kept conversations down a tier (compacting them, writing
    # them to the disk tier) for its room, and how many it compacted and wrote
    room_s: float = 0.0
    room_moves: tuple[int, int] = (0, 0)
    # Prompt tokens whose K/V came from the passage store (model/kv/passages.py), not read
    passage_cached_tokens: int = 0


# A prompt with at least this many tokens to read (after what a cache held) is reported as it is
# read (Reading), and /predict's NDJSON and /v1's streams say how far it is (issue 54).
READING_REPORT_TOKENS = 256


@dataclass(frozen=True, slots=True)
class Reading:
    """How far the worker is in reading a prompt of READING_REPORT_TOKENS or more: sent when
    its reading starts and after each of its calls, until its first token. The web process
    estimates `read` within the call under way from `rate` (web/generation/progress.py)."""

    key: int
    read: int  # prompt tokens read so far (what a cache held is not counted)
    total: int  # prompt tokens to read in all (the same)
    # Prompt tokens the call that comes next reads (PREFILL_CHUNK, ALONE_CHUNK, or fewer at the
    # end): an estimate never runs past read + call_tokens
    call_tokens: int
    # Tokens a second this prompt was read at so far (its own calls and the others' steps
    # between them); before its first call, the worker's last such rate; None: none yet
    rate: float | None
    at: float  # time.monotonic() when it was sent: one clock for both processes


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log probability, and the most likely tokens at its place (best
    first), in the distribution it was chosen from (model/logprobs.py says which). A token is
    its bytes: one may hold part of a character."""

    token: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Piece:
    key: int
    text: str
    generated: int = 0  # tokens generated so far (a reply cut off by a crash still counts them)
    # time.monotonic() when the worker made the piece's last token: the time between tokens
    # for /metrics, on the clock of the process that made them.
    at: float = 0.0
    # Generate.logprobs: the tokens whose text this piece (or an earlier one) carries; a piece
    # may hold tokens and no text yet (part of a character)
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Drafts:
    """Prompt-lookup drafts of one reply (model/generator/drafts.py, PROMPT_LOOKUP_TOKENS): draft
    tokens the model checked, those it accepted, and the model calls its tokens took."""

    checked: int
    accepted: int
    steps: int

    def since(self, earlier: Drafts) -> Drafts:
        return Drafts(
            self.checked - earlier.checked,
            self.accepted - earlier.accepted,
            self.steps - earlier.steps,
        )


@dataclass(frozen=True, slots=True)
class End:
    key: int
    finish: Finish
    generated_tokens: int
    tokens_per_s: float | None
    tokens_after_cancel: int | None = None
    drafts: Drafts | None = None  # None: the reply was generated without drafts
    # finish "error" from a fault in this reply's own step (an exception, logits that hold
    # NaN, a grammar that left no token): the exception's type name, never its message. The
    # replies beside it went on. None for any other end (a dead worker's too).
    fault: str | None = None
    # Seconds the reply waited, once started, for room to grow its KV reservation under the
    # bound (model/kv/bound.py): its stream was silent meanwhile
    kv_paused_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Warmed:
    """A warm request's answer (Generate.warm): the prompt's tokens up to its last passage's
    end now waiting to be read into the passage store (0: none, `reason` says why)."""

    key: int
    tokens: int
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class CacheStats:
    """The conversation cache after a change: generators kept, their KV bytes, evictions."""

    entries: int = 0
    bytes: int = 0
    evictions: int = 0
    # What one token of a generator's KV cache costs, measured on the model's own KV tensors
    # (their type: fp32, int8, ...; layers, KV heads, head size) at warm-up; reported with
    # the rest after each reply (0 before the first).
    bytes_per_token: int = 0
    # With batched decode (model/kv/tiers.py): idle conversations kept in compact RAM and on
    # the disk tier, the one KV bound, what running replies reserved of it, and how many
    # requests have had to wait for it.
    compact_entries: int = 0
    compact_bytes: int = 0
    disk_entries: int = 0
    disk_bytes: int = 0
    kv_memory_bytes: int = 0
    kv_reserved_bytes: int = 0
    kv_waits: int = 0
    kv_pauses: int = 0  # times a running reply waited to grow its reservation (kv/bound.py)
    # The passage store (model/kv/passages.py): passages in RAM and their bytes (with the
    # reading prefixes), on disk, found and not found in requests, waiting to be read
    passage_entries: int = 0
    passage_bytes: int = 0
    passage_disk_entries: int = 0
    passage_disk_bytes: int = 0
    passage_hits: int = 0
    passage_misses: int = 0
    passage_wanted: int = 0
    passage_warming: int = 0  # runs to warm (PASSAGE_WARM) waiting for idle time and room


ToWorker = Generate | Cancel | Stop | Ping
FromWorker = Phase | Rejected | Started | Reading | Piece | End | Warmed | CacheStats | Pong
