"""The sidecar's settings: read once from the environment into one typed object.

`Settings()` reads the environment; tests build `Settings(model_path=..., ...)` directly and pass
it to `create_app`. Nothing else in the package reads the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sidecar import catalog
from sidecar.embeddings import catalog as encoder_catalog

LogLevel = Literal["debug", "info", "warning", "error"]


class Settings(BaseSettings):
    """Every field is an environment variable of the same name in upper case (MODEL_PATH, ...)."""

    model_config = SettingsConfigDict(
        case_sensitive=False, extra="ignore", frozen=True, protected_namespaces=()
    )

    model_path: Path = Field(
        default=Path("/home/models") / catalog.DEFAULT.folder,
        description="Folder that holds genai_config.json, the ONNX model and the tokenizer; with "
        "MODEL_DOWNLOAD, the download root (the model lands in MODEL_PATH/MODEL_SUBFOLDER).",
    )
    models_file: Path | None = Field(
        default=None,
        description="Several models by name (docs/api.md, 'Several models'): a TOML file, one "
        "[[models]] table per model (id, path, aliases, pinned, system_prompt, temperature, "
        "idle_unload_s, kv_memory_mb, passage_kv_mb). The first pinned model is the default "
        "and loads at start; the others load when first asked for, each in a worker process "
        "of its own, within MODELS_MEMORY_BYTES. Unset: MODEL_PATH alone, one model.",
    )
    models_memory_bytes: int = Field(
        default=0,
        ge=0,
        description="With MODELS_FILE: the bytes the resident models may hold together "
        "(each one's measured memory once loaded, its weights before, plus its KV_MEMORY_MB and "
        "PASSAGE_KV_MB); the least recently used model that is not pinned and not answering "
        "is unloaded to make room. 0: the memory limit less a margin (10%, at least 1 GiB) "
        "and the web process.",
    )
    model_load_wait_s: float = Field(
        default=300.0,
        gt=0,
        le=3600,
        description="With MODELS_FILE: how long a request for a model that is not loaded "
        "waits for it to load (its stream says so meanwhile) before a 503.",
    )
    model_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The model's name in /v1/models, /readyz and replies; default: the model "
        "folder's name (for a downloaded catalog model, the folder it was downloaded into).",
    )
    model_device: Literal["cpu", "cuda"] = Field(
        default="cpu",
        description="Where the model runs: cpu, or cuda (an NVIDIA GPU; needs the image's cuda "
        "target, onnxruntime-genai-cuda, and a model folder built for CUDA).",
    )
    provider_options: dict[str, str] = Field(
        default_factory=dict,
        description="onnxruntime-genai's options for the MODEL_DEVICE provider, as a JSON "
        'object of strings, e.g. {"device_id": "0", "enable_cuda_graph": "0"} for cuda.',
    )
    host: str = Field(default="0.0.0.0", min_length=1, description="Interface to listen on.")
    port: int = Field(default=8000, ge=1, le=65535, description="TCP port to listen on.")
    max_length: int | None = Field(
        default=None,
        ge=16,
        description="Token budget of prompt plus reply; default (and upper bound): the model's "
        "context length.",
    )
    max_new_tokens: int = Field(
        default=1024, ge=1, le=131072, description="Reply length when a request does not say."
    )
    num_threads: int = Field(
        default=0,
        ge=0,
        le=256,
        description="onnxruntime intra-op threads; 0 = the CPUs this process may use: its CPU "
        "affinity or its cgroup CPU quota, whichever is smaller (cpus.py). onnxruntime-genai's "
        "own default, half the cores, runs at half speed on a 2-vCPU plan.",
    )
    thread_spinning: bool = Field(
        default=True,
        description="Let onnxruntime's pool threads busy-wait for the next operator instead of "
        "sleeping: faster decode at a small cost to other processes on the same CPUs, and no "
        "cost when idle (docs/benchmarks/cpu-configuration.md, 'Spinning'). Off for plans where "
        "other busy processes share the CPUs.",
    )
    max_concurrency: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Replies that run at once; more wait in the queue (QUEUE_SIZE). On a CPU "
        "they decode together, DECODE_BATCH_ROWS to a model call; each holds KV cache for its "
        "tokens (about 0.75 MiB a token for Phi-3-mini, counted in PROMPT_CACHE_MB's budget "
        "once the reply is over). 4 measured on 2 vCPUs: each of 4 users decodes at about half "
        "the speed of one alone (docs/benchmarks/users.md, 'Batched decode').",
    )
    prefill_chunk: int = Field(
        default=64,
        ge=16,
        le=131072,
        description="Prompt tokens appended per worker step. The worker reads cancellations and "
        "gives the other generations their turn between steps, so a prefill is cut into chunks: "
        "a cancellation lands within one chunk, and other replies get a token per chunk while a "
        "long prompt is read. Each call has a fixed cost (three calls of 64 for a 130-token "
        "prompt took 7-13% more CPU time than one, docs/benchmarks/prefill-calls.md), so on the "
        "batched path a prompt that is all the worker has to do is read 512 tokens a call "
        "(this value if larger; always this value with PROMPT_CACHE_EXACT). 0 is refused; a "
        "value over the prompt's length appends it in one call.",
    )
    decode_batch_rows: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Replies decoded together in one model call per step. 1: each reply has its "
        "own onnxruntime-genai Generator and they take turns (N replies each get 1/N of the "
        "speed); also what MODEL_DEVICE=cuda runs with, whatever "
        "this says. More than 1 (CPU only): the decoder runs in onnxruntime directly over KV "
        "buffers the worker owns, every active reply advances one token per call, and a "
        "joining prompt is read in PREFILL_CHUNK chunks between the others' steps. Decode "
        "reads all weights once per call, so rows are cheap until compute catches up "
        "(ARCHITECTURE.md, 'Batched decode'): a step of 4 rows gave 2.0 to 2.8 times the "
        "tokens of one on a 2-vCPU AMD EPYC. Greedy replies are the same either way; a seeded "
        "sampling reply is the sidecar's sampler's for that seed, not onnxruntime-genai's. "
        "Structured output and tool calls are batched too (llguidance). A decoder the direct "
        "path does not know keeps a Generator, and so does a vision model (phi3v: its decoder "
        "reads embeddings): there N replies take turns at 1/N of the speed each, and a prompt's "
        "images are one step the others wait for (docs/models.md). Set it to MAX_CONCURRENCY "
        "to batch every active reply.",
    )
    worker_stall_s: float = Field(
        default=60.0,
        ge=1.0,
        le=3600.0,
        description="Seconds the model worker may go without finishing a step (a token, or a "
        "chunk of PREFILL_CHUNK prompt tokens) while it is ready, before the watchdog fails its "
        "replies, kills it and starts another. Keep it above the longest step: one prompt chunk "
        "on the slowest CPU the sidecar runs on. A replacement worker still loading is replaced "
        "too when it reports no progress for this plus twice the first worker's load time.",
    )
    worker_stall_image_s: float = Field(
        default=120.0,
        ge=0.0,
        le=3600.0,
        description="Seconds more the model worker may go without a step, per image, while a "
        "reply with images has not made its first token: on a vision model the prompt's images, "
        "and every token before them, are read in one step (about 1,300 to 2,650 tokens an "
        "image, then the image encoder; docs/benchmarks/images.md says how long on which CPU).",
    )
    prompt_cache_mb: int = Field(
        default=2048,
        ge=0,
        le=1024 * 1024,
        description="RAM for the conversation cache, in MiB: the KV of conversations kept "
        "between requests, so that each chat turn reads only its new tokens. With batched "
        "decode, idle conversations move from their KV slot (0.75 MiB a token for Phi-3-mini) "
        "to compact RAM (KV_COMPACT) and then to PROMPT_CACHE_DIR, least recently used first, "
        "and only the bytes they really hold count; on the Generator path every generator "
        "counts, in use or idle, for its whole length. 0 turns the cache off; it is off "
        "whatever this says on a model whose generators cannot be rewound (phi3v, a vision "
        "model: cache_reason no_rewind). The kept "
        "conversations also stay within KV_MEMORY_MB with the running replies. "
        "docs/conversation-cache.md.",
    )
    kv_memory_mb: int = Field(
        default=0,
        ge=0,
        le=1024 * 1024,
        description="The one bound on all KV memory, in MiB: every running reply reserves the KV "
        "of its prompt and max_tokens when it starts, and the reservations plus the kept "
        "conversations' RAM never exceed it. A request that does not fit moves kept "
        "conversations down (compact, disk, dropped) or waits for a running reply to end; the "
        "context is capped to what the bound holds. On the Generator path (a vision model, "
        "DECODE_BATCH_ROWS=1) the generators the conversation cache does not keep reserve "
        "theirs, beside PROMPT_CACHE_MB set aside; on a GPU it holds only when set. 0: chosen "
        "at start from the memory the container may use (its cgroup limit, else the "
        "machine's) less the loaded model and a margin (a tenth, at least 1 GiB); logged and "
        "in /metrics. docs/conversation-cache.md.",
    )
    kv_compact: Literal["int8", "fp16", "fp32", "off"] = Field(
        default="int8",
        description="How idle conversations are kept in RAM and on disk, with batched decode: "
        "int8 (per token and head, 3.8x fewer bytes than fp32), fp16 (2x), fp32 (lossless); how "
        "close a chat continued from each stays to fp32: docs/benchmarks/quality.md, 'Compact KV: "
        "quality of a restored conversation' (python -m scripts.bench quality --kv-restore). "
        "off: idle conversations stay in their KV slot until dropped; no disk tier. "
        "PROMPT_CACHE_EXACT=true keeps them in fp32 whatever this says.",
    )
    prompt_cache_dir: Path | None = Field(
        default=None,
        description="The conversation cache's disk tier: a directory (made 0700; files 0600 "
        "with random names) where conversations pushed out of RAM are written and read back "
        "when their users return, instead of the chat being read again. Unset: off. Files "
        "written for the loaded model are kept across restarts; others of the tier's own names "
        "are deleted at start, and nothing else there is touched. A symbolic link, a directory "
        "another user owns, or one that is not private and holds other files is refused (one "
        "error line; the cache runs in RAM only). "
        "App Service: the container's local /tmp, or a mounted volume. With batched decode.",
    )
    prompt_cache_disk_mb: int = Field(
        default=4096,
        ge=1,
        le=1024 * 1024,
        description="The most the disk tier (PROMPT_CACHE_DIR) holds, in MiB; the least "
        "recently used conversations' files go first.",
    )
    prompt_cache_exact: bool = Field(
        default=False,
        description="Reuse only what a fresh prefill would compute bit for bit, so a greedy "
        "reply is always the one an uncached run gives (on a CPU with AVX-512 VNNI; with AVX2 "
        "only, up to a near tie: docs/models.md); each turn then re-reads the previous "
        "reply. Off: the next turn of a chat continues after every cached token, as llama.cpp "
        "does (a reply may differ from an uncached one at rare near-ties). Regenerated replies "
        "and edited messages are exact either way.",
    )
    prompt_lookup_tokens: int = Field(
        default=0,
        ge=0,
        le=16,
        description="Prompt-lookup drafts: the most tokens one decode step proposes, copied "
        "from where the reply's last tokens occurred before (the prompt or the reply); one "
        "model call checks them all, so replies that repeat their prompt (quoted passages, "
        "edits, summaries, code) decode several tokens a call. 0 turns it off. On the batched "
        "path (the default) a reply drafts while it decodes alone, whatever its sampling, "
        "grammar or log probabilities (a draft token is taken only where the reply's own "
        "choice is that token); on the Generator path (DECODE_BATCH_ROWS=1, a GPU) greedy "
        "requests without response_format or tools only. The draft length adapts down and "
        "drafting pauses after misses. Ignored (logged) on a vision model. "
        "docs/benchmarks/prompt-lookup.md.",
    )
    prompt_cache_unscoped: bool = Field(
        default=True,
        description="Let requests without a scope (no `cache_scope`, `prompt_cache_key` or "
        "`user`) share one cache pool. Whoever shares a pool can tell from `cached_tokens` (and "
        "the timing) whether a prompt begins with what another request sent: an exact oracle. "
        "On by default because only the chat app reaches the sidecar on App Service, and the app "
        "never sends an unscoped request; false where other clients call the sidecar: unscoped "
        "requests then use no cache.",
    )
    shared_prefixes: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="System messages the operator's apps send with every chat (the app's "
        "instructions, a grounded answer's rules), as a JSON list of strings. Each is read once "
        "at start and kept (its KV, counted against KV_MEMORY_MB); a new chat whose messages "
        "open with one starts from it and reads only the rest (batched path). It is not counted "
        "in `cached_tokens`; the timing can still tell a caller that the system message it sent "
        "is one of these, whole: list none that callers must not be able to confirm "
        "(docs/conversation-cache.md).",
    )
    passage_kv_mb: int = Field(
        default=1024,
        ge=0,
        le=1024 * 1024,
        description="The passage store (batched path; docs/documents.md, 'Passages read "
        "once'): RAM, in MiB, for the K/V of grounded requests' passages (their `passages`): "
        "a grounded prompt not found whole is read, up to its last passage, while the worker "
        "is idle, and later prompts that hold those tokens take them from here "
        "(PASSAGE_REUSE); least recently used out first. Counted beside the KV bound: a bound "
        "chosen from the memory limit is chosen this much smaller. 0: off. Kept in "
        "KV_COMPACT's encoding (fp16 where that is off).",
    )
    passage_disk_mb: int = Field(
        default=4096,
        ge=0,
        le=1024 * 1024,
        description="The most the passage store keeps on disk, in MiB, in PROMPT_CACHE_DIR's "
        "`passages/` folder (the conversation tier's rules: private, only its own files, "
        "every read checked), so it survives a restart. 0 or no PROMPT_CACHE_DIR: RAM only.",
    )
    passage_reuse: Literal["exact", "moved"] = Field(
        default="exact",
        description="How the passage store serves a later prompt: exact (a prompt that holds "
        "the same tokens from its first up to one of a stored run's passages, e.g. the same "
        "question again, or one whose best passages are the same: copied as they are); moved "
        "(also each passage that stands elsewhere, after the same system message: its keys "
        "rotated to where it now stands and its first PASSAGE_RECOMPUTE_TOKENS read again; an "
        "approximation whose quality gate is in docs/benchmarks/passages.md). A model whose "
        "attention cannot take moved keys keeps to exact (/readyz: passage_reuse says why).",
    )
    passage_recompute_tokens: int = Field(
        default=16,
        ge=0,
        le=4096,
        description="Tokens at the start of each stored passage read again with the prompt's "
        "real context instead of taken from the store (EPIC's recomputed first tokens). The "
        "default is chosen by the quality gate in docs/benchmarks/passages.md.",
    )
    reply_time_limit_s: float = Field(
        default=210.0,
        ge=0.0,
        le=86400.0,
        description="Seconds from a generation request's arrival (queue wait included) after "
        "which its reply ends, within one token, as if it reached its length limit "
        '(finish_reason "length"; outcome time_limit in the log line and /metrics). App '
        "Service's front end cuts every request at 230 s; the chat app's relay at "
        "RELAY_TIME_LIMIT (220 s), so the sidecar's own end comes first. 0: no limit.",
    )
    queue_size: int = Field(
        default=8, ge=0, le=4096, description="Requests that may wait for a free slot; beyond: 503."
    )
    max_connections: int = Field(
        default=512,
        ge=1,
        le=1_000_000,
        description="Client connections held open at once (web/guards/connections.py). A "
        "connection that opens at the cap first closes the one idle longest (a kept-alive "
        "connection waiting for its next request: its client reconnects, as after a keep-alive "
        "timeout); when none is idle its request is answered 503 too_many_connections "
        "(`Retry-After: 2`, `Connection: close`), except /healthz, /readyz and /metrics, which "
        "are answered as usual and closed. Lowered at start to the open-files limit less "
        "64 descriptors kept for the process and for those answers (the start log line "
        "`connections` says the cap and why); the soft open-files limit is raised to the hard "
        "one first.",
    )
    stream_start_after_s: float = Field(
        default=2.0,
        ge=0.0,
        le=10.0,
        description="Seconds a streamed /v1/chat/completions request may wait for its reply to "
        "start (in the queue, or for the model worker) before its stream starts anyway: the "
        'status 200, the headers and the first chunk (delta {"role": "assistant", "content": '
        '""}), then STREAM_KEEPALIVE_S chunks. A refusal after that (not_ready, '
        "context_length_exceeded, ...) is an error event in the stream instead of an HTTP "
        "status (docs/api.md). Clients that read with a timeout (30 s in App Service's "
        "tutorial apps) get their first byte in time. 0: every stream starts at once.",
    )
    stream_keepalive_s: float = Field(
        default=5.0,
        gt=0.0,
        le=10.0,
        description="Seconds a /v1/chat/completions stream may stay silent (waiting in the "
        "queue, reading a long prompt, holding a tool call until it is complete) before it "
        'sends a chunk with delta {"content": ""}, which clients add as no text. Not on '
        "/predict, whose text stream has no room for one.",
    )
    progress_interval_s: float = Field(
        default=1.0,
        ge=0.2,
        le=2.0,
        description="Seconds between two progress events while a prompt of 256 tokens or more "
        'is read: {"progress": {"read", "total", "seconds_left"}} lines on /predict\'s NDJSON '
        "form, a chunk with a `progress` member on /v1/chat/completions streams; `read` is "
        "estimated between the model worker's reports, one per call of up to 512 tokens "
        "(docs/api.md, 'Prompt reading progress'). At most 2: the chat page shows them.",
    )
    max_body_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=16 * 1024 * 1024,
        description="Largest request body (/predict, /v1/chat/completions, /v1/completions, "
        "/v1/responses) not counting its images' data URLs; beyond: 413. A body with images "
        "may be larger by MAX_IMAGES data URLs of MAX_IMAGE_BYTES each (base64, 4/3 of the "
        "bytes): 64 KiB + 4 x 7.2 MB by default (docs/api.md, 'Images').",
    )
    max_images: int = Field(
        default=4,
        ge=0,
        le=64,
        description="Images one request may hold, earlier turns' included (each is read "
        "again with every turn); beyond: 400 too_many_images. Each costs about 2,000 to 2,700 "
        "prompt tokens on Phi-3.5-vision whatever its size (docs/api.md, 'Images'). 0 refuses "
        "every image.",
    )
    max_image_bytes: int = Field(
        default=5 * 1024 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description="Largest image, in bytes of the file (after base64 decoding); beyond: 400 "
        "image_too_large.",
    )
    max_image_pixels: int = Field(
        default=7680 * 4320,
        ge=1,
        le=178_956_970,
        description="Most pixels (width x height) an image may have, checked from its header "
        "before it is decoded (a few KB of PNG can declare 30000 x 30000 pixels); beyond: 400 "
        "image_too_large. Default: an 8K UHD frame (33,177,600).",
    )
    image_memory_mb: int = Field(
        default=1024,
        ge=1,
        le=1024 * 1024,
        description="Memory for the images of requests in flight in the web process, in MiB, "
        "counted before any image is decoded from what its header says (20 bytes a pixel of "
        "the request's largest image while they are decoded, 4 a pixel and its file for each) "
        "and, once decoded, as the PNGs they became, until the request ends. A request whose "
        "images do not fit now: 503 images_busy with Retry-After (not queued); one whose "
        "images need more than all of it: 400 image_too_large. Four 12-megapixel photos need "
        "about 430 MiB to be decoded. web/images/memory.py.",
    )
    response_store_mb: int = Field(
        default=64,
        ge=0,
        le=64 * 1024,
        description="Memory for the Responses API's stored responses (`store`, "
        "`previous_response_id`, GET/DELETE /v1/responses/{id}), in MiB of the memory they "
        "really take in the web process (each kept as its encoded JSON): a restart empties it. "
        "Each API key is guaranteed an equal share (this / the number of keys) and may use free "
        "room beyond it; when full, the least recently used response of the key furthest over "
        "its share goes first, so one key's flood never evicts another's within its share. "
        "Each belongs to its API key, and is continued only in its `prompt_cache_key`/`user` "
        "scope (docs/api.md). 0: nothing is stored (`previous_response_id` is then always a "
        "404).",
    )
    request_headers_timeout_s: float = Field(
        default=5.0,
        ge=0.5,
        le=300.0,
        description="Seconds a client has to send a request's headers, from the connection "
        "opening or the previous response ending; then the connection is closed (web/"
        "guards/deadlines.py). Slow and idle clients cannot hold sockets past it.",
    )
    request_body_timeout_s: float = Field(
        default=10.0,
        ge=1.0,
        le=3600.0,
        description="Seconds a client has to send a request's whole body, from the end of its "
        "headers; then 408 request_timeout and the connection is closed (a body nobody reads "
        "is closed 2 s later). A stalled or endless body cannot hold a socket past it.",
    )
    # Embeddings (sidecar/embeddings/, web/embeddings/api.py): off unless an encoder is set.
    embed_model_path: Path | None = Field(
        default=None,
        description="Folder of an encoder for POST /v1/embeddings: a sentence-transformers "
        "folder with its ONNX export (onnx/model.onnx, tokenizer.json, modules.json, "
        "1_Pooling/config.json; docs/models.md, 'Encoders'). Unset (and no EMBED_MODEL_ID): "
        "no embeddings are served. With MODEL_DOWNLOAD and EMBED_MODEL_ID, the download goes "
        "here.",
    )
    embed_model_id: str | None = Field(
        default=None,
        description="A catalog encoder (sidecar/embeddings/catalog.py: all-minilm-l6-v2, "
        "bge-small-en-v1.5, e5-small-v2, nomic-embed-text-v1.5): sets the default of "
        "EMBED_MODEL_PATH (/home/models/<name>) and, with MODEL_DOWNLOAD, fetches it there "
        "from the Hugging Face Hub when the folder is not complete.",
    )
    embed_model_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The encoder's name in /v1/models, /readyz and replies; default: "
        "EMBED_MODEL_ID, else the folder's name.",
    )
    embed_threads: int = Field(
        default=0,
        ge=0,
        le=64,
        description="Threads that run the encoder, each a whole model call at a time; 0 = the "
        "CPUs this process may use (as NUM_THREADS). They run at a lower CPU priority "
        "(EMBED_NICE), so they take the CPUs a chat leaves idle.",
    )
    embed_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="How much lower the encoder threads' CPU priority is than the chat's (Linux "
        "nice, per thread): at 10 a chat keeps about 90 % of a core the encoder also wants, "
        "and an idle machine gives the encoder everything (ARCHITECTURE.md, 'Embeddings'). "
        "0: the same priority as the chat.",
    )
    embed_batch_tokens: int = Field(
        default=2048,
        ge=16,
        le=1_048_576,
        description="Most tokens in one encoder call, padding included (inputs are sorted by "
        "length first): bigger batches compute a little faster, smaller ones let a query in "
        "sooner beside an index run.",
    )
    embed_max_inputs: int = Field(
        default=2048,
        ge=1,
        le=65536,
        description="Most inputs (strings or token lists) in one /v1/embeddings request, "
        "OpenAI's own bound; beyond: 400 too_many_inputs.",
    )
    embed_max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        le=256 * 1024 * 1024,
        description="Largest /v1/embeddings request body; beyond: 413. An index run of 2,048 "
        "chunks of about 1,000 characters is about 2 MB.",
    )
    embed_max_chars: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        le=256 * 1024 * 1024,
        description="Most characters of text in one /v1/embeddings request, its inputs "
        "together, checked before any is tokenized (the tokenizer holds 100 to 200 bytes a "
        "character while it reads); beyond: 400 too_many_characters. Each input has its own "
        "bound too: the encoder's token limit times 100 characters. An index run of 2,048 "
        "chunks of about 1,000 characters is about 2 million.",
    )
    embed_queue_size: int = Field(
        default=32,
        ge=0,
        le=4096,
        description="/v1/embeddings requests that may wait for the encoder beside the one "
        "running; beyond: 503 overloaded.",
    )
    embed_matryoshka: bool | None = Field(
        default=None,
        description="The encoder was trained so that a vector's first N numbers are an "
        "embedding too (Matryoshka): `dimensions` is then served by cutting and renormalising. "
        "Default: what EMBED_MODEL_ID's catalog entry says (nomic-embed-text-v1.5), else off: "
        "`dimensions` other than the model's own is then a 400.",
    )
    # Speech to text (sidecar/speech/, web/audio/): off unless a speech model is set.
    speech_model_path: Path | None = Field(
        default=None,
        description="Folder of a Whisper model in CTranslate2's form (model.bin, config.json, "
        "tokenizer.json, vocabulary.txt: what `python -m scripts.models.make_real_model --model "
        "whisper-tiny-en` writes) for POST /v1/audio/transcriptions and `input_audio` parts "
        "(docs/speech.md). Unset: no speech is served (the route answers 404 "
        "speech_not_served, /readyz and /v1/models say so).",
    )
    speech_model_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The speech model's name in /v1/models, /readyz and replies; default: the "
        "folder's name.",
    )
    speech_threads: int = Field(
        default=0,
        ge=0,
        le=64,
        description="CPU threads one transcription computes on (CTranslate2's); 0 = the CPUs "
        "this process may use (as NUM_THREADS). They run at SPEECH_NICE.",
    )
    speech_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="How much lower speech's CPU priority is than the chat's (Linux nice, per "
        "thread, inherited by CTranslate2's threads): at 10 a chat keeps about 90 % of a core "
        "speech also wants. 0: the same priority as the chat.",
    )
    speech_compute_type: Literal["int8", "float32"] = Field(
        default="int8",
        description="The precision CTranslate2 computes in (the weights are converted at "
        "load): int8 is about twice float32's speed on CPUs with VNNI "
        "(docs/benchmarks/speech.md).",
    )
    speech_beam_size: int = Field(
        default=1,
        ge=1,
        le=10,
        description="Whisper's beam width: 1 is greedy (the fastest); 5 is faster-whisper's "
        "default, a few words better on hard audio at several times the compute.",
    )
    speech_vad: bool = Field(
        default=True,
        description="Silero VAD (inside faster-whisper's wheel) skips the silence before "
        "transcribing: faster on recordings with pauses, and no words invented in silence.",
    )
    speech_max_bytes: int = Field(
        default=25 * 1024 * 1024,
        ge=1024,
        le=512 * 1024 * 1024,
        description="Largest audio file (OpenAI's 25 MB): a /v1/audio/transcriptions upload, "
        "or an `input_audio` part after base64; beyond: 413 audio_too_large.",
    )
    speech_max_seconds: float = Field(
        default=300.0,
        ge=1.0,
        le=7200.0,
        description="Longest audio one request may hold, its parts together, read from the "
        "decoded samples (a header's claim is not trusted); beyond: 400 audio_too_long.",
    )
    speech_queue_size: int = Field(
        default=8,
        ge=0,
        le=1024,
        description="Transcriptions that may wait beside the one running; beyond: 503 overloaded.",
    )
    write_timeout_s: float = Field(
        default=30.0,
        ge=1.0,
        le=3600.0,
        description="Seconds a client may leave the sidecar unable to write to it (it stopped "
        "reading: the socket's buffers are full) before its connection is closed, its reply "
        "cancelled in the model worker (the request's log line: outcome cancelled, closed "
        "write_timeout) and counted (sidecar_write_timeouts_total). A client that reads, "
        "however slowly, is never cut: each byte it takes restarts the count. Without it, "
        "each such connection held its buffers (about 10 MB) and its reply for as long as it "
        "stayed.",
    )
    send_buffer_kb: int = Field(
        default=256,
        ge=0,
        le=65536,
        description="The kernel's send buffer of each client connection (SO_SNDBUF, in KiB; "
        "Linux doubles it): what a client that stops reading can leave queued in the kernel, "
        "besides the 64 KiB asyncio holds, until WRITE_TIMEOUT_S closes it. Autotuned, Linux "
        "let it grow to 4 MiB a connection (1.7 MB seen on a loopback). 256 KiB streams a reply "
        "far faster than a model writes it at any round-trip time. 0: the kernel's autotuning.",
    )
    log_level: LogLevel = Field(default="info", description="debug, info, warning or error.")
    log_prompts: bool = Field(
        default=False,
        description="Put prompt and reply text in the logs (debugging only), and the model "
        "worker's exception messages, which may quote them; off, a failure is logged by its "
        "exception's type.",
    )
    model_download: bool = Field(
        default=False,
        description="Download the model into MODEL_PATH at start when it has no complete model.",
    )
    model_id: str | None = Field(
        default=None,
        description="A catalog model (sidecar/catalog.py; `phi3-download --list`): sets the "
        "defaults of MODEL_REPO_ID, MODEL_SUBFOLDER and MODEL_PATH to that entry's.",
    )
    model_repo_id: str = Field(
        default=catalog.DEFAULT.repo_id,
        min_length=1,
        description="Hugging Face repository for MODEL_DOWNLOAD.",
    )
    model_subfolder: str = Field(
        default=catalog.DEFAULT.subfolder,
        description="Folder inside that repository which holds the model.",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="Require `Authorization: Bearer <key>`; several keys comma-separated. Off by "
        "default (on App Service only the main container is reachable from outside); turn it on "
        "when the sidecar's port is published (web/guards/access.py). Set but empty, blank or "
        "only commas: refused at start (unset it to turn authentication off). The start log line "
        "`access` says whether authentication is on.",
    )
    api_key_probes: bool = Field(
        default=False,
        description="Require the API key on /healthz, /readyz and /metrics too (they are open by "
        "default, for probes and scrapers).",
    )
    allowed_hosts: str = Field(
        default="localhost,127.0.0.1,[::1]",
        min_length=1,
        description="Host header values accepted, comma-separated: names, `*.example.com`, or "
        "`*` for any; others get 400 invalid_host, against DNS rebinding. The default, the "
        "loopback names (any port), is how the app reaches the sidecar in the product "
        "(http://localhost:8000); a sidecar reached by another name needs it listed. /healthz, "
        "/readyz and /metrics answer any name (probes and scrapers).",
    )
    # Telemetry (web/observability/telemetry.py): traces only when one of the three destinations
    # is set.
    otel_exporter_otlp_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="OpenTelemetry's standard variable: send spans over OTLP/HTTP (protobuf) to "
        "this collector, at its /v1/traces (`http://localhost:4318`).",
    )
    otel_exporter_otlp_traces_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="The full URL for spans, used as it is (instead of "
        "OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces).",
    )
    otel_exporter_otlp_protocol: Literal["http/protobuf"] = Field(
        default="http/protobuf",
        description="OTLP over HTTP with protobuf bodies, the only one installed (a collector "
        "takes it on port 4318); anything else is refused rather than ignored.",
    )
    applicationinsights_connection_string: SecretStr | None = Field(
        default=None,
        description="Send spans to this Application Insights resource (Azure Monitor), App "
        "Service's convention for the variable.",
    )
    traces_file: Path | None = Field(
        default=None,
        description="Append spans to this file as OTLP JSON lines, for sites without a network "
        "to a collector: ship the file later (an OpenTelemetry collector reads it with its "
        "otlpjsonfile receiver).",
    )
    otel_service_name: str = Field(
        default="phi3-sidecar",
        min_length=1,
        description="OpenTelemetry's service.name of these spans.",
    )
    otel_sdk_disabled: bool = Field(
        default=False,
        description="OpenTelemetry's standard switch: true turns tracing off whatever is set.",
    )
    engine_factory: str = Field(
        default="sidecar.model.engine:load_engine",
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="module:function that builds the engine in the model worker (tests use it "
        "to inject faults).",
    )

    @property
    def api_keys(self) -> tuple[str, ...]:
        raw = self.api_key.get_secret_value() if self.api_key is not None else ""
        return tuple(key.strip() for key in raw.split(",") if key.strip())

    @property
    def allowed_host_patterns(self) -> tuple[str, ...]:
        """The ALLOWED_HOSTS patterns, lower case; empty when any host is accepted."""
        patterns = tuple(p.strip().lower() for p in self.allowed_hosts.split(",") if p.strip())
        return () if "*" in patterns else patterns

    @property
    def served_model_name(self) -> str:
        """MODEL_NAME, else the model folder's name; for a folder downloaded from the catalog
        (<root>/<entry folder>/<subfolder>) the name of the folder it was downloaded into."""
        if self.model_name:
            return self.model_name
        path = self.model_path
        if self.model_subfolder:
            subfolder = Path(self.model_subfolder.strip("/"))
            if path.parts[-len(subfolder.parts) :] == subfolder.parts:
                path = path.parents[len(subfolder.parts) - 1]
        return path.name or str(path)

    @property
    def tracing(self) -> bool:
        """Whether spans go anywhere (else no OpenTelemetry SDK is even imported)."""
        destinations = (
            self.otel_exporter_otlp_endpoint,
            self.otel_exporter_otlp_traces_endpoint,
            self.applicationinsights_connection_string,
            self.traces_file,
        )
        return not self.otel_sdk_disabled and any(d is not None for d in destinations)

    @model_validator(mode="before")
    @classmethod
    def _encoder_catalog_defaults(cls, data: object) -> object:
        """EMBED_MODEL_ID fills in EMBED_MODEL_PATH unless it is set."""
        if not isinstance(data, dict):
            return data
        name = next((v for k, v in data.items() if k.lower() == "embed_model_id"), None)
        if not name:
            return data
        if name not in encoder_catalog.ENTRIES:
            known = ", ".join(encoder_catalog.ENTRIES)
            raise ValueError(f"EMBED_MODEL_ID {name!r} is not in the catalog; known: {known}")
        if any(k.lower() == "embed_model_path" for k in data):
            return data
        folder = Path("/home/models") / encoder_catalog.ENTRIES[name].folder
        return {**data, "embed_model_path": folder}

    @model_validator(mode="before")
    @classmethod
    def _catalog_defaults(cls, data: object) -> object:
        """MODEL_ID fills in what it names, unless the variable itself is set."""
        if not isinstance(data, dict):
            return data
        name = next((v for k, v in data.items() if k.lower() == "model_id"), None)
        if not name:
            return data
        if name not in catalog.ENTRIES:
            raise ValueError(
                f"MODEL_ID {name!r} is not in the catalog; known: " + ", ".join(catalog.ENTRIES)
            )
        entry = catalog.ENTRIES[name]
        given = {k.lower() for k in data}
        defaults = {
            "model_repo_id": entry.repo_id,
            "model_subfolder": entry.subfolder,
            "model_path": Path("/home/models") / entry.folder,
        }
        return {**{k: v for k, v in defaults.items() if k not in given}, **data}

    @field_validator("api_key")
    @classmethod
    def _some_key(cls, value: SecretStr | None) -> SecretStr | None:
        """API_KEY="" or " , " once turned authentication off without a word: refused."""
        if value is not None and not any(k.strip() for k in value.get_secret_value().split(",")):
            raise ValueError(
                "API_KEY is set but holds no key (it is empty, blank or only commas); unset it "
                "to run without authentication, or give one or more keys, comma-separated"
            )
        return value

    @field_validator("model_device", mode="before")
    @classmethod
    def _lower_device(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value
