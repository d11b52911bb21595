"""The batched path, set up as the settings ask: its decoder and scheduler (or None where it
cannot drive the model's decoder), and its KV memory (KV_MEMORY_MB, KV_COMPACT,
PROMPT_CACHE_DIR, PROMPT_CACHE_DISK_MB, PROMPT_CACHE_EXACT): the tiers attached to the new
BatchScheduler, and the one bound sized once the model is loaded (kv/tiers.py says what they
do)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from sidecar.ipc import CacheStats
from sidecar.model.batch.decoder import BatchDecoder, DecoderSpec, Unsupported, read_spec
from sidecar.model.batch.passages import warm
from sidecar.model.batch.scheduler import CACHE_SLOTS, BatchScheduler
from sidecar.model.generator.path import folder_error
from sidecar.model.kv import compact as kv_compact
from sidecar.model.kv import rotary
from sidecar.model.kv.compact import Encoding
from sidecar.model.kv.disk import DiskTier, Shape, model_fingerprint
from sidecar.model.kv.passages import PassageStore, Reuse
from sidecar.model.kv.prompt_cache import PromptCache
from sidecar.model.kv.shared_prefix import read_declared
from sidecar.model.memory import chosen_kv_bound
from sidecar.model.prompt.builder import Prompt

log = logging.getLogger("sidecar.model.batch_setup")  # the name its log lines always had


@dataclass(frozen=True)
class KvOptions:
    memory_bytes: int  # KV_MEMORY_MB; 0: chosen from the memory limit once loaded
    encoding: Encoding | None  # None: no compact tier (KV_COMPACT=off)
    cache_dir: Path | None
    disk_bytes: int

    @classmethod
    def chosen(
        cls,
        *,
        kv_memory_mb: int,
        kv_compact: str,
        exact: bool,
        cache_dir: Path | None,
        disk_mb: int,
    ) -> KvOptions:
        # Lossless where replies must be exact (PROMPT_CACHE_EXACT), whatever KV_COMPACT says.
        encoding = "fp32" if exact and kv_compact != "off" else kv_compact
        return cls(
            kv_memory_mb * 2**20,
            None if encoding == "off" else cast(Encoding, encoding),
            cache_dir,
            disk_mb * 2**20,
        )


@dataclass(frozen=True)
class PassageOptions:
    """The passage store (kv/passages.py): PASSAGE_KV_MB, PASSAGE_DISK_MB,
    PASSAGE_RECOMPUTE_TOKENS, PASSAGE_REUSE."""

    ram_bytes: int = 0  # 0: off
    disk_bytes: int = 0
    recompute: int = 0
    reuse: Reuse = "exact"

    @classmethod
    def of(cls, settings: Any) -> PassageOptions:  # settings.Settings
        return cls(
            settings.passage_kv_mb * 2**20,
            settings.passage_disk_mb * 2**20,
            settings.passage_recompute_tokens,
            settings.passage_reuse,
        )


@dataclass(frozen=True)
class BatchOptions:
    rows: int  # DECODE_BATCH_ROWS
    concurrency: int  # MAX_CONCURRENCY: a KV slot each, and CACHE_SLOTS more when cached
    threads: int
    session_options: Mapping[str, Any]
    max_length: int
    chunk: int  # PREFILL_CHUNK
    cached: bool  # the conversation cache has a budget (PROMPT_CACHE_MB)
    exact: bool
    unscoped: bool
    kv: KvOptions
    eos_ids: frozenset[int]
    new_stream: Callable[[], Any]  # a tokenizer stream per reply
    vocab_size: int
    passages: PassageOptions = PassageOptions()
    draft_tokens: int = 0  # PROMPT_LOOKUP_TOKENS (batch/drafts.py)


def batch_path(
    path: Path, genai_config: Mapping[str, Any], options: BatchOptions
) -> BatchScheduler | None:
    """The batched path, or None (logged) where it cannot drive this model's decoder."""
    try:
        spec = read_spec(genai_config)
        slots = options.concurrency + (CACHE_SLOTS if options.cached else 0)
        config = {k: str(v) for k, v in options.session_options.items() if k.startswith("session.")}
        decoder = BatchDecoder(path, spec, config, options.threads, slots, options.max_length)
    except Unsupported as exc:
        log.warning(
            "batched decode is off: every reply gets a Generator",
            extra={"fields": {"reason": str(exc)}},
        )
        return None
    except Exception as exc:
        raise folder_error(path, exc) from exc
    cache = PromptCache(0, decoder.pool.bytes_per_token, options.max_length, options.chunk)
    cache.exact, cache.unscoped = options.exact, options.unscoped
    scheduler = BatchScheduler(
        decoder,
        cache,
        rows=options.rows,
        chunk=options.chunk,
        eos_ids=options.eos_ids,
        new_stream=options.new_stream,
        vocab_size=options.vocab_size,
    )
    attach_tiers(scheduler, path, spec, options.kv, threads=options.threads, cached=options.cached)
    scheduler.draft_tokens = options.draft_tokens
    scheduler.passages = passage_store(path, spec, options)
    return scheduler


def passage_store(path: Path, spec: DecoderSpec, options: BatchOptions) -> PassageStore | None:
    """The passage store (None: PASSAGE_KV_MB=0), its disk part in PROMPT_CACHE_DIR's
    `passages/` folder with what an earlier worker left there; exact reuse only, with the
    reason logged and on /readyz, where the model's attention cannot take moved keys
    (kv/rotary.py)."""
    wanted = options.passages
    if not wanted.ram_bytes:
        return None
    try:
        moves: rotary.Rotary | None = rotary.read(path, spec.filename, spec.head_size)
        reason = None
    except rotary.NotRotatable as exc:
        moves, reason = None, str(exc)
    encoding = options.kv.encoding or "fp16"
    store = PassageStore(
        moves, wanted.ram_bytes, encoding, wanted.recompute, wanted.reuse, reason=reason
    )
    cache_dir = options.kv.cache_dir
    if cache_dir is not None and wanted.disk_bytes:
        shape = Shape(spec.layers, spec.kv_heads, spec.head_size, encoding)
        fingerprint = model_fingerprint(path, spec.filename, f"passages {shape}")
        name = "passage store disk tier"
        disk = DiskTier(cache_dir / "passages", wanted.disk_bytes, fingerprint, shape, name)
        store.disk = disk if disk.enabled else None
        if store.disk is not None:
            store.adopt(disk.scan())
    fields = {"mode": store.mode, "reason": reason, "ram_bytes": wanted.ram_bytes}
    fields |= {"encoding": encoding, "recompute_tokens": wanted.recompute}
    fields["disk"] = str(store.disk.directory) if store.disk is not None else None
    log.info("passage store", extra={"fields": fields})
    return store


def passage_reuse(batch: BatchScheduler | None) -> str:
    """What /readyz says of the passage store (ipc.Phase.passage_reuse)."""
    store = batch.passages if batch is not None else None
    if store is None or batch is None or batch.cache.exact:
        return "off"
    if store.reuse == "moved" and store.reason is not None:  # asked for, not possible
        return f"{store.mode} (keys cannot move: {store.reason})"
    return store.mode


def warm_passages(
    batch: BatchScheduler | None, prompt: Prompt, scope: str | None
) -> tuple[int, str | None]:
    """Note a warm request's run to be read into the passage store while idle (ipc.Generate.warm;
    batch/passages.py warm): its tokens, or 0 and why not."""
    if batch is None or batch.cache.exact:
        return 0, "the passage store is off (it needs batched decode, PROMPT_CACHE_EXACT off)"
    return warm(batch.passages, prompt, scope)


def attach_tiers(
    scheduler: BatchScheduler,
    folder: Path,
    spec: DecoderSpec,
    options: KvOptions,
    *,
    threads: int,
    cached: bool,
) -> None:
    """The compact encoding, and the disk tier with the conversations earlier workers left
    there for this model (`cached` False: the cache is off, so no disk tier)."""
    kv_compact.THREADS = threads
    scheduler.tiers.encoding = options.encoding
    if options.cache_dir is None or options.encoding is None or not cached:
        return
    shape = Shape(spec.layers, spec.kv_heads, spec.head_size, options.encoding)
    fingerprint = model_fingerprint(folder, spec.filename, f"{shape}")
    disk = DiskTier(options.cache_dir, options.disk_bytes, fingerprint, shape)
    scheduler.tiers.disk = disk
    scheduler.adopt_stored(disk.scan())


def size_kv_memory(batch: BatchScheduler, options: KvOptions, max_length: int) -> int:
    """Set the one KV bound (KV_MEMORY_MB, or from the container's memory: memory.py) once the
    model is loaded; the context capped to what it holds (a reply alone always fits)."""
    bound, fields = chosen_kv_bound(options.memory_bytes)
    store = batch.passages
    if not options.memory_bytes and store is not None and store.enabled:
        # The passage store's RAM beside the bound: a bound chosen from the memory limit is
        # chosen that much smaller, and the store takes at most half of what it would have been
        store.bound_bytes = min(store.bound_bytes, bound // 2)
        bound -= store.bound_bytes
        fields["passage_kv_bytes"] = store.bound_bytes
    batch.memory.bound_bytes = bound
    capped = max(1, min(max_length, bound // batch.pool.bytes_per_token))
    fields |= {
        "context_tokens": capped,
        "path": "batched",
        "compact": options.encoding or "off",
        # None too when its directory was refused or could not be made (kv/folder.py)
        "disk_tier": str(options.cache_dir)
        if batch.tiers.disk is not None and batch.tiers.disk.enabled
        else None,
    }
    log.info("kv memory", extra={"fields": fields})
    return capped


def cache_stats(batch: BatchScheduler | None, cache: PromptCache, memory: Any) -> CacheStats:
    """What the engine reports of its cache and KV bound (ipc.CacheStats): the batched path's
    cache, tiers and bound, else the Generator path's cache and `memory` (its bound)."""
    if batch is None:
        return CacheStats(**asdict(cache.stats()), **memory.stats())
    stats = CacheStats(**asdict(batch.cache.stats()), **batch.tiers.stats(), **batch.memory.stats())
    if batch.passages is None:
        return stats
    store = batch.passages.stats()
    return dataclasses.replace(
        stats, **{f"passage_{name}": value for name, value in asdict(store).items()}
    )


def prepare_idle(
    batch: BatchScheduler | None, shared: Sequence[str], fit: Any, headroom_tokens: int
) -> None:
    """After the warm-up: the declared shared prefixes read (SHARED_PREFIXES,
    kv/shared_prefix.py; `fit`: PromptBuilder.fit), and the room kept for a new chat while the
    worker is idle (kv/idle.py): `headroom_tokens`, a short prompt and a default reply."""
    if batch is None:
        return
    read_declared(batch, shared, lambda turns: list(fit(turns, 1, batch.pool.length).ids))
    batch.idle.headroom_tokens = headroom_tokens
