"""onnxruntime-genai behind a small interface. The only module that imports it.

It runs in the model worker process only (see worker.py), so the GIL that every Generator call
holds never stalls the web process's event loop.

A generation reads its prompt in chunks (PREFILL_CHUNK tokens, one chunk per step) before it
generates a token per step: one append of a long prompt is minutes of Phi-3-mini on a CPU, and
the worker can act only between steps, so a cancellation would wait for the whole prefill and
the other generations' replies would freeze meanwhile. Chunked, a cancellation lands within one
chunk and the others' tokens interleave with the chunks. The greedy tokens are the same.
"""

from __future__ import annotations

import os

os.environ["ORT_DISABLE_TELEMETRY"] = "1"  # before the import: it phones home otherwise

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import onnxruntime_genai as og

from sidecar.ipc import CacheStats, Drafts, Finish, Generate
from sidecar.model.batch_decoder import BatchDecoder, Unsupported, read_spec
from sidecar.model.batch_guidance import Grammars
from sidecar.model.batch_scheduler import CACHE_SLOTS, BatchGeneration, BatchScheduler, serves
from sidecar.model.cpus import cpu_budget
from sidecar.model.drafts import draft_counts, use_prompt_lookup
from sidecar.model.family import read_facts
from sidecar.model.folder import ModelFolderError, first_line, read_genai_config
from sidecar.model.guidance import fitted, refusal, room
from sidecar.model.prompt import Prompt, PromptBuilder
from sidecar.model.prompt_cache import ROUND_TOKENS, Entry, PromptCache
from sidecar.model.stops import StopFilter
from sidecar.settings import Settings

log = logging.getLogger("sidecar.model.engine")


class Engine:
    """One loaded model and tokenizer; hands out independent generations."""

    def __init__(
        self,
        path: Path,
        *,
        num_threads: int = 0,
        thread_spinning: bool = True,
        max_length: int | None = None,
        prefill_chunk: int = 64,
        prompt_cache_mb: int = 0,
        prompt_cache_exact: bool = False,
        prompt_cache_unscoped: bool = True,
        device: str = "cpu",
        provider_options: Mapping[str, str] | None = None,
        prompt_lookup_tokens: int = 0,
        default_new_tokens: int = 1024,
        decode_batch_rows: int = 1,
        max_concurrency: int = 1,
    ):
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be positive, not {prefill_chunk}")
        self.prefill_chunk = prefill_chunk
        self.prompt_lookup_tokens = prompt_lookup_tokens
        genai_config = read_genai_config(path)
        self.context_length = int(genai_config["model"]["context_length"])
        self.max_length = min(max_length or self.context_length, self.context_length)
        self.num_layers = int(genai_config["model"]["decoder"]["num_hidden_layers"])
        self.vocab_size = int(genai_config["model"].get("vocab_size") or 0)  # 0: unknown
        # A KV cache that is not one buffer shared by past and present (a quantized KV cache
        # on the CPU) cannot be rewound to its whole length once a token was generated
        # ("Requested length of rewind is greater than the current length"): the cache then
        # counts one token fewer as reusable after each generated token.
        shared = genai_config.get("search", {}).get("past_present_share_buffer", True)
        self.rewind_slack = 0 if shared else 1
        # Sized after the warm-up measured a token's KV bytes; off (budget 0) until then.
        self.cache = PromptCache(0, 1, self.max_length, prefill_chunk, prompt_cache_exact)
        self._cache_budget = prompt_cache_mb * 2**20
        self.cache_unscoped = prompt_cache_unscoped
        # The spare generator made while loading holds a short prompt and a default reply.
        self._spare_needed = default_new_tokens + ROUND_TOKENS
        config = og.Config(str(path))
        self.session_options = session_options(num_threads, thread_spinning)
        overlay = {"model": {"decoder": {"session_options": self.session_options}}}
        config.overlay(json.dumps(overlay))
        use_device(config, device, provider_options or {})
        self._config, self._path, self._device = config, path, device
        # With batched decode the decoder's weights live in batch_decoder.py's session; the
        # Generator's model (the same weights again) is loaded only if a request needs it.
        batching = decode_batch_rows > 1 and device == "cpu"
        self._model = None if batching else self._load_model()
        self.tokenizer = og.Tokenizer(self._model if self._model is not None else config)
        template = _TemplateTokenizer(self.tokenizer)
        self.facts = read_facts(
            path, genai_config, template, self.tokenizer.eos_token_ids, self.tokenizer.bos_token_id
        )
        log.info("model", extra={"fields": self.facts.log_fields()})
        self.eos_ids = self.facts.eos_ids
        self.prompts = PromptBuilder(
            template,
            self.facts.added_tokens,
            self.facts.bos_id,
            system_role=self.facts.system_role,
        )
        # DECODE_BATCH_ROWS > 1: replies the direct path serves are batched (batch_scheduler.py)
        # and own the conversation cache's budget; the Generator path keeps no cache then.
        self.batch: BatchScheduler | None = None
        self.grammars: Grammars | None = None  # guided replies on the batched path
        if decode_batch_rows > 1:
            self.batch = self._batch_path(
                path, genai_config, device, decode_batch_rows, max_concurrency, num_threads
            )
        if self.batch is not None:
            self.grammars = Grammars(
                path / "tokenizer.json",
                self.vocab_size,
                _first_eos(genai_config, self.eos_ids),
            )
        if self.batch is None and self._model is None:
            self._model = self._load_model()

    @property
    def model(self) -> og.Model:
        """onnxruntime-genai's model, loaded on first use when batched decode is on."""
        if self._model is None:
            log.info("loading the Generator's model for a request batched decode does not serve")
            self._model = self._load_model()
        return self._model

    def _load_model(self) -> og.Model:
        try:
            return og.Model(self._config)
        except Exception as exc:
            if self._device != "cpu":
                raise DeviceUnavailable(device_error(self._device, exc)) from exc
            raise self._folder_error(exc) from exc

    def _folder_error(self, exc: Exception) -> ModelFolderError:
        """The model's files cannot be loaded (by onnxruntime-genai, or by the batched
        path's session, which reads the same decoder): one sentence for /readyz."""
        return ModelFolderError(
            f"onnxruntime-genai could not load the model in {str(self._path)!r}: "
            f"{first_line(exc)}; "
            "check that the folder is complete (download it again)"
        )

    def start(self, request: Generate, *, cached: bool = True) -> Generation | BatchGeneration:
        """Render and fit the prompt (may raise PromptTooLong), then continue a cached
        generator (or KV slot) that holds the prompt's beginning, or make a new one."""
        prompt = self.prompts.fit(request.messages, request.max_new_tokens, self.max_length)
        # PROMPT_CACHE_UNSCOPED=false: a request without a scope neither reuses nor leaves
        # anything, so the shared pool (an oracle for what others sent) does not exist.
        cached = cached and request.use_cache
        cached = cached and (request.cache_scope is not None or self.cache_unscoped)
        if self.batch is not None and serves(request) and self._batch_guides(request):
            # The grammar first: a refused one (GuidanceRefused) takes no slot
            guidance, grammars = request.guidance, self.grammars
            guide = grammars.matcher(guidance) if grammars and guidance else None
            generation = self.batch.start(prompt, request, cached=cached)
            generation.guide = guide
            return generation
        return Generation(self, prompt, request, cached=cached and self.batch is None)

    def _batch_guides(self, request: Generate) -> bool:
        """Whether the batched path can follow this request's grammar: a model whose tokenizer
        llguidance cannot read has its guided requests served by a Generator (logged once, at
        load), whose own llguidance then builds the grammar or refuses it."""
        return request.guidance is None or (
            self.grammars is not None and self.grammars.unavailable is None
        )

    def _batch_path(
        self,
        path: Path,
        genai_config: Mapping[str, Any],
        device: str,
        rows: int,
        concurrency: int,
        threads: int,
    ) -> BatchScheduler | None:
        """The batched path, or None (logged) where it cannot serve this model exactly."""
        try:
            if device != "cpu":
                raise Unsupported(f"MODEL_DEVICE={device}: the batched path is CPU only")
            spec = read_spec(genai_config)
            slots = concurrency + (CACHE_SLOTS if self._cache_budget else 0)
            options = self.session_options.items()
            config = {k: str(v) for k, v in options if k.startswith("session.")}
            decoder = BatchDecoder(
                path, spec, config, threads or cpu_budget().count, slots, self.max_length
            )
        except Unsupported as exc:
            log.warning(
                "batched decode is off: every reply gets a Generator",
                extra={"fields": {"reason": str(exc)}},
            )
            return None
        except Exception as exc:
            raise self._folder_error(exc) from exc
        cache = PromptCache(0, decoder.pool.bytes_per_token, self.max_length, self.prefill_chunk)
        cache.exact = self.cache.exact
        return BatchScheduler(
            decoder,
            cache,
            rows=rows,
            chunk=self.prefill_chunk,
            eos_ids=self.eos_ids,
            new_stream=self.tokenizer.create_stream,
            vocab_size=self.vocab_size,
        )

    def warm_up(self) -> None:
        """Read a short prompt and generate one token (not cached); size the KV cache's
        tokens from what the model really allocated."""
        request = Generate("warm-up", (("user", "Hi"),), max_new_tokens=1)
        prompt = self.prompts.fit(request.messages, 1, self.max_length)
        if self.batch is None:
            generation = Generation(self, prompt, request, cached=False)
            while generation.step() is None:
                pass
            self.cache.bytes_per_token = self._kv_bytes_per_token(generation)
            generation.release(reusable=False)
            self.cache.budget_bytes = self._cache_budget
            self._make_spare()
            return
        batched = self.batch.start(prompt, request, cached=False)
        while batched.finish is None:
            self.batch.step()
        batched.release(reusable=False)
        self.batch.cache.budget_bytes = self._cache_budget

    def _make_spare(self) -> None:
        """One idle greedy generator, made now: the first cached request takes it instead of
        allocating and zero-filling a KV cache of its own (prompt_cache.py, "A spare"), so
        loading pays for it, not the first reply."""
        capacity = self.cache.capacity_for(min(self._spare_needed, self.max_length))
        capacity = max(capacity, self.facts.min_cache_length)
        nbytes = capacity * self.cache.bytes_per_token
        if not self.cache.enabled or nbytes > self.cache.budget_bytes:
            return
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=capacity, do_sample=False)
        use_prompt_lookup(params, self.prompt_lookup_tokens)  # greedy: drafts as configured
        spare = Entry(og.Generator(self.model, params), params, capacity, None, False, nbytes)
        spare.spare = True
        self.cache.adopt(spare)
        self.cache.give_back(spare, reusable=True)
        log.info("spare generator", extra={"fields": {"capacity": capacity, "bytes": nbytes}})

    def cache_stats(self) -> CacheStats:
        cache = self.batch.cache if self.batch is not None else self.cache
        return CacheStats(**asdict(cache.stats()))

    def _kv_bytes_per_token(self, generation: Generation) -> int:
        """K and V of every layer for one token, from the first layer's present key (shape
        [batch, kv_heads, length, head_size], in the model's KV type): 786,432 bytes for
        Phi-3-mini (fp32)."""
        key = generation._generator.get_output("present.0.key")
        per_layer = int(key.shape[1]) * int(key.shape[3]) * int(key.dtype.itemsize)
        return 2 * self.num_layers * per_layer


def _first_eos(genai_config: Mapping[str, Any], eos_ids: frozenset[int]) -> int:
    """The end token a grammar allows, as onnxruntime-genai's: the first of the
    configuration's eos_token_id (the lowest end id if it names none)."""
    configured = genai_config["model"].get("eos_token_id")
    if isinstance(configured, list) and configured:
        return int(configured[0])
    if isinstance(configured, int):
        return configured
    return min(eos_ids)


def session_options(num_threads: int, thread_spinning: bool) -> dict[str, Any]:
    """The decoder's onnxruntime session options (genai_config.json's `session_options`).

    onnxruntime-genai's default thread count is half the machine's cores (one thread on a
    2-vCPU plan: half speed), so the count is always set; `num_threads` 0 means the CPUs this
    process may really use (cpus.py). Spinning: idle pool threads busy-wait for the next
    operator; off, they sleep, which costs decode speed (see THREAD_SPINNING in settings.py).
    Keys not known to onnxruntime-genai go to onnxruntime as session config entries.
    """
    spin = "1" if thread_spinning else "0"
    return {
        "intra_op_num_threads": num_threads or cpu_budget().count,
        "session.intra_op.allow_spinning": spin,
        "session.inter_op.allow_spinning": spin,
    }


class DeviceUnavailable(ModelFolderError):
    """MODEL_DEVICE cannot be used here; str() is one sentence for /readyz and the log."""


def use_device(config: og.Config, device: str, options: Mapping[str, str]) -> None:
    """Run on `device` whatever the folder's genai_config.json says: cpu is onnxruntime's
    default provider (no provider listed), cuda is appended with its options."""
    config.clear_providers()
    if device == "cpu":
        return
    _preload_cuda_libraries()
    config.append_provider(device)
    for key, value in options.items():
        config.set_provider_option(device, key, value)


def _preload_cuda_libraries() -> None:
    """The NVIDIA runtime libraries installed as Python packages (the cuda image's), loaded
    before onnxruntime looks for them; a system CUDA installation needs nothing."""
    try:
        import onnxruntime

        preload = getattr(onnxruntime, "preload_dlls", None)
        if preload is not None:
            preload(cuda=True, cudnn=True, msvc=False)
    except Exception as exc:  # reported by the model load that follows, in a sentence
        log.debug("CUDA libraries not preloaded", extra={"fields": {"error": first_line(exc)}})


def device_error(device: str, error: BaseException) -> str:
    """One sentence on why MODEL_DEVICE could not be used."""
    text = first_line(error)
    lowered = text.lower()
    # "Cuda interface not available: CUDA error in Create at <file>:<line> - <what>"
    reason = text.rsplit(" - ", 1)[-1] if "cuda error in" in lowered else text
    if "libonnxruntime-genai-cuda.so: cannot open shared object file" in lowered:
        return (
            f"MODEL_DEVICE={device}, but this onnxruntime-genai is the CPU build: run the "
            "image's cuda target (onnxruntime-genai-cuda), or set MODEL_DEVICE=cpu"
        )
    if any(
        sign in lowered
        for sign in ("libcuda.so", "no cuda-capable device", "driver", "cudaerrornodevice")
    ):
        return (
            f"MODEL_DEVICE={device}, but no usable NVIDIA GPU or driver is available to this "
            f"process ({reason}): run on a GPU node with an NVIDIA driver recent enough for "
            "CUDA 13 and the NVIDIA container toolkit, or set MODEL_DEVICE=cpu"
        )
    if "cannot open shared object file" in lowered:
        return (
            f"MODEL_DEVICE={device}, but a CUDA library could not be loaded ({reason}): run "
            "the image's cuda target, which ships them, or install the NVIDIA runtime libraries"
        )
    return f"MODEL_DEVICE={device}: onnxruntime-genai could not load the model on the GPU: {text}"


class _TemplateTokenizer:
    def __init__(self, tokenizer: og.Tokenizer) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self._tokenizer.encode(text)]

    def apply_chat_template(self, messages: str, add_generation_prompt: bool = True) -> str:
        return str(
            self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt
            )
        )


class Generation:
    """One reply: a generator (lent by the conversation cache, or made for it) and its own
    tokenizer stream."""

    def __init__(self, engine: Engine, prompt: Prompt, request: Generate, *, cached: bool) -> None:
        self.prompt = prompt
        self.generated = 0
        self.finish: Finish | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self._eos = engine.eos_ids
        self._cache = engine.cache
        sampling = bool(request.temperature)
        needed = len(prompt.ids) + prompt.max_new_tokens
        guidance = fitted(request.guidance, needed, engine.max_length)
        needed += room(guidance)  # forced tokens may run past the reply's budget (guidance.py)
        self.guided = guidance is not None
        # A seeded sampling request is never continued from a cache entry: its random state
        # would differ from a fresh generator's, and "same seed, same reply" would not hold.
        cached = cached and self._cache.enabled and not (sampling and request.seed is not None)
        # The length of a generator made for this request (its KV cache is allocated for all
        # of it up front). A sliding-window model's cache is at least its window: onnxruntime
        # refuses less.
        capacity = self._cache.capacity_for(needed) if cached else needed
        capacity = max(capacity, engine.facts.min_cache_length)
        scope = request.cache_scope
        lent = self._cache.lend(scope, sampling, prompt.ids, needed, guidance) if cached else None
        if lent is None and cached:
            recycled = self._cache.recycle(scope, sampling, capacity, needed, guidance)
            lent = (recycled, 0) if recycled is not None else None
        if lent is not None:
            self._entry, self.cached_tokens = lent
            try:
                generator = self._entry.generator
                if self.guided and generator.token_count() == self.cached_tokens > 0:
                    self.cached_tokens -= 1  # only a rewind re-arms the grammar (guidance.py)
                if generator.token_count() > self.cached_tokens:
                    generator.rewind_to(self.cached_tokens)
                turn = _turn_options(request, prompt, engine.vocab_size)
                self._entry.params.set_search_options(**turn)
            except Exception:
                self._cache.give_back(self._entry, reusable=False)
                raise
        else:
            self.cached_tokens = 0
            keep = cached and capacity * self._cache.bytes_per_token <= self._cache.budget_bytes
            if keep:
                self._cache.make_room(capacity)
            params = og.GeneratorParams(engine.model)
            options = {"max_length": capacity, **_turn_options(request, prompt, engine.vocab_size)}
            options |= {"do_sample": sampling}
            if request.seed is not None:
                options["random_seed"] = request.seed
            params.set_search_options(**options)
            # Drafts for greedy, unguided replies only (drafts.py)
            drafted = not sampling and guidance is None
            use_prompt_lookup(params, engine.prompt_lookup_tokens if drafted else 0)
            try:
                if guidance is not None:
                    params.set_guidance(guidance.kind, guidance.data, guidance.ff_tokens)
                generator = og.Generator(engine.model, params)
            except RuntimeError as exc:
                # the grammar, or llguidance's reading of this model's tokenizer ("llg_")
                if guidance is not None and ("grammar" in str(exc) or "llg_" in str(exc)):
                    raise refusal(exc) from exc
                raise
            self._entry = Entry(
                generator,
                params,
                capacity,
                request.cache_scope,
                sampling,
                nbytes=capacity * self._cache.bytes_per_token,
                guidance=guidance,
            )
            if keep:
                self._cache.adopt(self._entry)
        self._generator = self._entry.generator
        drafting = engine.prompt_lookup_tokens and not sampling and not self.guided
        self._drafts_before = draft_counts(self._generator) if drafting else None
        self._stream = engine.tokenizer.create_stream()
        self._stops = StopFilter(request.stop)
        self._chunk = engine.prefill_chunk
        self._slack = engine.rewind_slack
        self._appended = self.cached_tokens  # prompt tokens in the generator so far

    @property
    def prefilling(self) -> bool:
        """True while part of the prompt is still to be appended."""
        return self._appended < len(self.prompt.ids)

    def step(self) -> str | None:
        """One bounded piece of work: while the prompt is not all appended, append its next
        chunk (at most PREFILL_CHUNK tokens) and return None, no token made; after that,
        generate one token and return its new text.

        The text is '' while a character is still incomplete; the stream never yields half a
        character, so a reply cut off by the length limit ends on a whole character.
        """
        entry = self._entry
        if self.prefilling:
            end = self._appended + self._chunk
            self._generator.append_tokens(self.prompt.ids[self._appended : end])
            self._appended = min(end, len(self.prompt.ids))
            entry.kv_len = self._generator.token_count()
            entry.prefilled(self.cached_tokens, self._appended, self._chunk)
            return None
        before = self._generator.token_count()
        self._generator.generate_next_token()
        token = int(self._generator.get_next_tokens()[0])
        count = self._generator.token_count()
        self.last_token_at = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = self.last_token_at
        # A guided step may also have added the tokens its grammar forced, in front of the
        # sampled one (guidance.py); an unguided step adds exactly the sampled token.
        if count - before == 1 and token not in self._eos:
            tokens = [token]
        else:
            tokens = [int(t) for t in self._generator.get_sequence(0)[before:count]]
        budget = self.prompt.max_new_tokens - self.generated
        shown = tokens[:budget]  # forced tokens never take a reply past its max_new_tokens
        self.generated += len(shown)
        text = "".join(str(self._stream.decode(t)) for t in shown)
        ended = token in self._eos and len(shown) == len(tokens)
        if token in self._eos:
            # EOS is not added to the sequence, and the step fed the token before it (and any
            # forced ones): the KV cache now holds the whole sequence.
            entry.kv_len = count - self._slack
            if ended:
                self.generated += 1  # the end token counts, as it always did
        else:
            # The sampled token is in the sequence but not yet in the KV cache (the next step
            # feeds it): a later request re-appends it.
            entry.kv_len = count - 1 - self._slack
        if self._stops:
            text, stopped = self._stops.feed(text)
            if stopped:
                self.finish = "stop"
                return text
        if ended:
            self.finish = "eos"
            return text + self._stops.flush()
        if self.generated >= self.prompt.max_new_tokens or self._generator.is_done():
            self.finish = "length"
            text += self._stops.flush()
        return text

    def release(self, reusable: bool) -> None:
        """The request is over (finished, cancelled, or failed: not reusable)."""
        self._cache.give_back(self._entry, reusable)

    def drafts(self) -> Drafts | None:
        """This reply's prompt-lookup drafts; None when it had none (PROMPT_LOOKUP_TOKENS=0,
        sampling)."""
        if self._drafts_before is None:
            return None
        return draft_counts(self._generator).since(self._drafts_before)

    def tokens_per_s(self) -> float | None:
        """Decode speed: tokens after the first one over the time they took."""
        if self.first_token_at is None or self.last_token_at is None or self.generated < 2:
            return None
        elapsed = self.last_token_at - self.first_token_at
        return (self.generated - 1) / elapsed if elapsed > 0 else None


def _top_k(top_k: int | None, vocab_size: int) -> int:
    """0 (no cut) when absent; a cut wider than the vocabulary is no cut either, and
    onnxruntime-genai fails on it, so it is capped."""
    if top_k is None:
        return 0
    return min(top_k, vocab_size) if vocab_size else top_k


def _turn_options(request: Generate, prompt: Prompt, vocab_size: int) -> dict[str, Any]:
    """The search options of one turn: those a continued generator takes again (min_length is
    absolute, and the sampling values are read at every step); max_length, do_sample and the
    seed are fixed when a generator is made."""
    min_new = min(request.min_new_tokens, prompt.max_new_tokens)
    # EOS is suppressed until min_length; 0 clears a previous turn's minimum.
    options: dict[str, Any] = {"min_length": len(prompt.ids) + min_new if min_new else 0}
    # Applies to greedy and sampled replies alike; 1.0 clears a previous turn's penalty.
    options["repetition_penalty"] = request.repetition_penalty or 1.0
    if request.temperature:
        options |= {
            "temperature": request.temperature,
            "top_p": request.top_p if request.top_p is not None else 1.0,
            "top_k": _top_k(request.top_k, vocab_size),
        }
    return options


def thread_count(settings: Settings) -> tuple[int, str]:
    """NUM_THREADS if set, else the CPUs this process may use; and where the number came from."""
    if settings.num_threads:
        return settings.num_threads, "NUM_THREADS"
    budget = cpu_budget()
    return budget.count, budget.source


def load_engine(settings: Settings) -> Engine:
    threads, source = thread_count(settings)
    log.info(
        "onnxruntime threads",
        extra={
            "fields": {"threads": threads, "source": source, "spinning": settings.thread_spinning}
        },
    )
    return Engine(
        settings.model_path,
        num_threads=threads,
        thread_spinning=settings.thread_spinning,
        max_length=settings.max_length,
        prefill_chunk=settings.prefill_chunk,
        prompt_cache_mb=settings.prompt_cache_mb,
        prompt_cache_exact=settings.prompt_cache_exact,
        prompt_cache_unscoped=settings.prompt_cache_unscoped,
        device=settings.model_device,
        provider_options=settings.provider_options,
        prompt_lookup_tokens=settings.prompt_lookup_tokens,
        default_new_tokens=settings.max_new_tokens,
        decode_batch_rows=settings.decode_batch_rows,
        max_concurrency=settings.max_concurrency,
    )
