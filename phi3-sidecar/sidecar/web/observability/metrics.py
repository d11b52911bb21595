"""GET /metrics (Prometheus text format, written by prometheus-client).

Counters of every generation request (the names /metrics had before histograms came), gauges
read when scraped (gauges.py), and the distributions an operator watches, by API (`predict`,
`v1`) and outcome (`eos`, `stop`, `length`, `time_limit`, `cancelled`, `error`, `rejected`), as
vLLM names them:

- `sidecar_time_to_first_token_seconds`: from the request's arrival to its first piece of text
  (body, queue, prefill);
- `sidecar_inter_token_latency_seconds`: between two pieces of one reply, on the model worker's
  clock (a piece is one token; a character spread over several tokens comes as one piece);
- `sidecar_request_duration_seconds`: the whole request, end to end, refusals included;
- `sidecar_queue_wait_seconds`: from asking for a slot to getting one;
- `sidecar_request_prompt_tokens`, `sidecar_request_generated_tokens`: sizes per request.

What an attack costs others (issue 46): the model side's time on each refused request
(`sidecar_refusal_work_seconds`, by whether the byte bound refused it before any tokenization),
the characters tokenized to build prompts, and the time requests waited for room under the KV
bound before they started (`sidecar_kv_wait_seconds`).

Images (images/decoding.py): those of requests that reached the model, the prompt tokens that stood
for them, and the requests refused for their images, by reason (errors.REFUSALS' image reasons);
the memory the images of requests in flight hold, and its bound (images/memory.py).

The Responses API's stored responses (responses/store.py): entries, the bytes they really take
(RESPONSE_STORE_MB is counted in these), those evicted to make room and those not kept.

And the connections (guards/connections.py, guards/listener.py): open ones and the cap, idle ones
closed for a new one, requests refused over the cap, and accept errors (out of descriptors).

Embeddings (/v1/embeddings): requests by outcome, inputs, tokens, and each request's time.

Label values come from fixed sets only: never a request id, never text.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from sidecar.web.observability.gauges import (
    ConnectionsCollector,
    Gauges,
    GaugesCollector,
    ImageMemoryCollector,
    ResponseStoreCollector,
)

if TYPE_CHECKING:
    from sidecar.web.guards.connections import Connections
    from sidecar.web.images.memory import ImageMemory
    from sidecar.web.observability.record import RequestRecord
    from sidecar.web.responses.store import ResponseStore


# The routes that generate, and their `api` label; their requests are counted however they end.
GENERATION_PATHS = {
    "/predict": "predict",
    "/v1/chat/completions": "v1",
    "/v1/completions": "v1",
    "/v1/responses": "v1",
}
EMBEDDINGS_PATH = "/v1/embeddings"  # counted apart: sidecar_embedding_*
EMBEDDING_OUTCOMES = ("ok", "rejected", "cancelled", "error")
OUTCOMES = ("eos", "stop", "length", "time_limit", "cancelled", "error", "rejected")
_LABELS = ("api", "outcome")

# Seconds: a token of a small model takes milliseconds, a long prefill on a CPU minutes.
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
_TOKEN_GAP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)
_QUEUE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
_TOKEN_BUCKETS = tuple(2**n for n in range(4, 18))  # 16 ... 131072
_GENERATED_BUCKETS = (1, 2, 4, 8, *_TOKEN_BUCKETS[:-4])  # 1 ... 8192
_EMBEDDING_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_RESTORE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10)
_WORK_BUCKETS = (0.0001, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# How a refused request was ruled out: by the byte bound before any tokenization, or once its
# prompt was built (model/prompt/process.py)
REFUSAL_CHECKS = ("byte_bound", "built")
# Where a request's prompt tokens came from (ipc.CacheTier, and the rest read by the model)
TOKEN_SOURCES = ("ram", "compact", "disk", "recomputed")
# Why a request's images were refused: the refusals' reasons (errors.REFUSALS), whose /predict
# type is the reason itself, as the request's record has it (error_type).
IMAGE_REFUSALS = (
    "invalid_image",
    "image_too_large",
    "too_many_images",
    "unsupported_image_url",
    "image_input_unsupported",
    "images_busy",
)


class Metrics:
    """One registry per app (tests build several apps in one process)."""

    def __init__(
        self,
        *,
        prompt_cache: bool,
        connections: Connections | None = None,
        response_store: ResponseStore | None = None,
        image_memory: ImageMemory | None = None,
    ) -> None:
        # No `_created` series beside every counter and histogram: Prometheus does not need
        # them in this format (a process-wide switch of prometheus-client; idempotent).
        disable_created_metrics()
        self.prompt_cache = prompt_cache  # hits and misses mean something only when it is on
        self.registry = CollectorRegistry()
        self._gauges = GaugesCollector()
        self.registry.register(self._gauges)
        if connections is not None:
            self.registry.register(ConnectionsCollector(connections))
        if response_store is not None:
            self.registry.register(ResponseStoreCollector(response_store))
        if image_memory is not None:
            self.registry.register(ImageMemoryCollector(image_memory))

        def counter(name: str, help_text: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, help_text, labels, registry=self.registry)

        def histogram(name: str, help_text: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, help_text, _LABELS, buckets=buckets, registry=self.registry)

        self.requests = counter(
            "sidecar_requests",
            "Finished generation requests (every generation route together) by outcome.",
            ("outcome",),
        )
        for outcome in OUTCOMES:
            self.requests.labels(outcome)
        self.reply_faults = counter(
            "sidecar_reply_faults",
            "Replies ended (outcome error) by a fault of their own step: an exception, logits "
            "that hold NaN, a grammar that left no token. The replies beside them went on.",
        )
        self.generated_tokens = counter("sidecar_generated_tokens", "Tokens generated.")
        self.prompt_tokens = counter("sidecar_prompt_tokens", "Prompt tokens processed.")
        self.tokens_after_disconnect = counter(
            "sidecar_tokens_after_disconnect",
            "Tokens generated after a client disconnect was noticed.",
        )
        self.cached_prompt_tokens = counter(
            "sidecar_cached_prompt_tokens",
            "Prompt tokens not read again: the conversation cache held them.",
        )
        self.cache_hits = counter(
            "sidecar_prompt_cache_hits", "Requests that continued a cached generator."
        )
        self.cache_misses = counter(
            "sidecar_prompt_cache_misses", "Requests that read their whole prompt (cache on)."
        )
        self.tokens_by_source = counter(
            "sidecar_prompt_tokens_by_source",
            "Prompt tokens by where they came from: ram (the conversation's KV slot), compact "
            "(compact RAM), disk (the disk tier), recomputed (read by the model).",
            ("source",),
        )
        for source in TOKEN_SOURCES:
            self.tokens_by_source.labels(source)
        self.restore_time = Histogram(
            "sidecar_kv_restore_seconds",
            "Putting a kept conversation back into a KV slot, by the tier it came from.",
            ("tier",),
            buckets=_RESTORE_BUCKETS,
            registry=self.registry,
        )
        # Prompt-lookup drafts (PROMPT_LOOKUP_TOKENS): acceptance is accepted / checked, tokens
        # per model call is draft_reply_tokens / draft_reply_steps.
        self.draft_tokens = counter(
            "sidecar_draft_tokens", "Prompt-lookup draft tokens the model checked."
        )
        self.accepted_draft_tokens = counter(
            "sidecar_draft_tokens_accepted", "Prompt-lookup draft tokens the model accepted."
        )
        self.draft_reply_tokens = counter(
            "sidecar_draft_reply_tokens", "Tokens generated by replies decoded with drafts."
        )
        self.draft_reply_steps = counter(
            "sidecar_draft_reply_steps", "Model calls of the replies decoded with drafts."
        )
        self.images = counter(
            "sidecar_images", "Images of generation requests that reached the model."
        )
        self.image_tokens = counter(
            "sidecar_image_tokens", "Prompt tokens that stood for images (in prompt_tokens too)."
        )
        self.image_refusals = counter(
            "sidecar_image_refusals",
            "Generation requests refused for their images, by reason (docs/api.md's refusals).",
            ("reason",),
        )
        for reason in IMAGE_REFUSALS:
            self.image_refusals.labels(reason)
        self.refusal_work = Histogram(
            "sidecar_refusal_work_seconds",
            "The model side's time on a request it refused (building its prompt), by check: "
            "byte_bound (ruled out by its size before any tokenization) or built.",
            ("check",),
            buckets=_WORK_BUCKETS,
            registry=self.registry,
        )
        for check in REFUSAL_CHECKS:
            self.refusal_work.labels(check)
        self.tokenized_chars = counter(
            "sidecar_tokenized_chars",
            "Characters tokenized to build prompts of requests that started (a conversation's "
            "kept tokens are not read again).",
        )
        self.kv_paused = counter(
            "sidecar_kv_paused_seconds",
            "Seconds running replies waited for room to grow their KV reservation under the "
            "bound (KV_MEMORY_MB; model/kv/bound.py): their streams were silent meanwhile.",
        )
        self.kv_wait = histogram(
            "sidecar_kv_wait_seconds",
            "From a request reaching the model worker to its start: the time it waited for room "
            "under the KV bound (KV_MEMORY_MB); 0 for most.",
            _QUEUE_BUCKETS,
        )
        self.ttft = histogram(
            "sidecar_time_to_first_token_seconds",
            "From a request's arrival to its first piece of text.",
            _LATENCY_BUCKETS,
        )
        self.token_gap = histogram(
            "sidecar_inter_token_latency_seconds",
            "Between two pieces of text of one reply, as the model worker made them.",
            _TOKEN_GAP_BUCKETS,
        )
        self.duration = histogram(
            "sidecar_request_duration_seconds",
            "A generation request from arrival to its last byte, refusals included.",
            _LATENCY_BUCKETS,
        )
        self.queue_wait = histogram(
            "sidecar_queue_wait_seconds",
            "From asking for a generation slot to getting one.",
            _QUEUE_BUCKETS,
        )
        self.prompt_size = histogram(
            "sidecar_request_prompt_tokens",
            "Prompt tokens of a request (cached ones included).",
            _TOKEN_BUCKETS,
        )
        self.generated_size = histogram(
            "sidecar_request_generated_tokens",
            "Tokens generated for a request.",
            _GENERATED_BUCKETS,
        )

        # /v1/embeddings (embeddings/api.py): requests, inputs, tokens and time
        self.embedding_requests = counter(
            "sidecar_embedding_requests",
            "Finished /v1/embeddings requests by outcome (ok, rejected, cancelled: the client "
            "left, error).",
            ("outcome",),
        )
        for outcome in EMBEDDING_OUTCOMES:
            self.embedding_requests.labels(outcome)
        self.embedding_inputs = counter(
            "sidecar_embedding_inputs", "Inputs embedded (strings or token lists)."
        )
        self.embedding_tokens = counter("sidecar_embedding_tokens", "Tokens the encoder read.")
        self.embedding_duration = Histogram(
            "sidecar_embedding_duration_seconds",
            "A /v1/embeddings request from arrival to its last byte, refusals included.",
            buckets=_EMBEDDING_BUCKETS,
            registry=self.registry,
        )

    def observe(self, record: RequestRecord) -> None:
        if record.path == EMBEDDINGS_PATH:
            self._observe_embeddings(record)
            return
        api = GENERATION_PATHS.get(record.path)
        if api is None:
            return
        outcome = record.outcome or "unknown"
        self.requests.labels(outcome).inc()
        if record.fault is not None:
            self.reply_faults.inc()
        self.generated_tokens.inc(record.generated_tokens or 0)
        self.prompt_tokens.inc(record.prompt_tokens or 0)
        self.tokens_after_disconnect.inc(record.tokens_after_disconnect or 0)
        if record.error_type in IMAGE_REFUSALS:
            self.image_refusals.labels(record.error_type).inc()
        if record.image_tokens is not None:  # a request with images reached the model
            self.images.inc(record.images or 0)
            self.image_tokens.inc(record.image_tokens)
        if record.cached_tokens is not None:  # the request reached the model
            self.cached_prompt_tokens.inc(record.cached_tokens)
            if self.prompt_cache:
                (self.cache_hits if record.cached_tokens else self.cache_misses).inc()
            if record.cached_tokens and record.cache_tier in TOKEN_SOURCES:
                self.tokens_by_source.labels(record.cache_tier).inc(record.cached_tokens)
            recomputed = (record.prompt_tokens or 0) - record.cached_tokens
            self.tokens_by_source.labels("recomputed").inc(max(0, recomputed))
            if record.restore_ms is not None and record.cache_tier in ("compact", "disk"):
                self.restore_time.labels(record.cache_tier).observe(record.restore_ms / 1000)
        if record.refusal_ms is not None:
            check = "byte_bound" if record.byte_bound else "built"
            self.refusal_work.labels(check).observe(record.refusal_ms / 1000)
        self.tokenized_chars.inc(record.tokenized_chars or 0)
        self.kv_paused.inc((record.kv_paused_ms or 0) / 1000)
        if record.decode_steps is not None:
            self.draft_tokens.inc(record.draft_tokens or 0)
            self.accepted_draft_tokens.inc(record.accepted_draft_tokens or 0)
            self.draft_reply_tokens.inc(record.generated_tokens or 0)
            self.draft_reply_steps.inc(record.decode_steps)
        labels = (api, outcome)
        if record.duration_ms is not None:
            self.duration.labels(*labels).observe(record.duration_ms / 1000)
        if record.queue_wait_ms is not None:
            self.queue_wait.labels(*labels).observe(record.queue_wait_ms / 1000)
        if record.kv_wait_ms is not None:
            self.kv_wait.labels(*labels).observe(record.kv_wait_ms / 1000)
        if record.ttft_ms is not None:
            self.ttft.labels(*labels).observe(record.ttft_ms / 1000)
        if record.prompt_tokens is not None:
            self.prompt_size.labels(*labels).observe(record.prompt_tokens)
        if record.generated_tokens is not None and record.prompt_tokens is not None:
            self.generated_size.labels(*labels).observe(record.generated_tokens)
        times = record.piece_times
        if len(times) > 1:
            gaps = self.token_gap.labels(*labels)
            for earlier, later in itertools.pairwise(times):
                gaps.observe(later - earlier)

    def _observe_embeddings(self, record: RequestRecord) -> None:
        outcome = record.outcome if record.outcome in EMBEDDING_OUTCOMES else "error"
        self.embedding_requests.labels(outcome).inc()
        if outcome == "ok":
            self.embedding_inputs.inc(record.embedding_inputs or 0)
            self.embedding_tokens.inc(record.prompt_tokens or 0)
        if record.duration_ms is not None:
            self.embedding_duration.observe(record.duration_ms / 1000)

    def render(self, gauges: Gauges) -> str:
        self._gauges.latest = gauges
        return generate_latest(self.registry).decode()
