"""onnxruntime-genai behind a small interface (this and generator/path.py alone import it).

It runs in the model worker process only (see worker.py), so the GIL that every Generator call
holds never stalls the web process's event loop. The engine loads the model and tokenizer, sizes
the conversation cache, and makes generators; a reply is a Generation (generator/generation.py)
or, with batched decode, a BatchGeneration (batch/row.py). Where it runs: device.py; its
threads: cpus.py. A vision model (vision.py) reads a request's images on the Generator path.
"""

from __future__ import annotations

import os

os.environ["ORT_DISABLE_TELEMETRY"] = "1"  # before the import: it phones home otherwise

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnxruntime_genai as og

from sidecar.ipc import CacheStats, Generate, Guidance
from sidecar.model.batch import setup as batch_setup
from sidecar.model.batch.guidance import Grammars, RowGuide, follows
from sidecar.model.batch.row import BatchGeneration
from sidecar.model.batch.scheduler import BatchScheduler, serves
from sidecar.model.cpus import cpu_budget, session_options, thread_count
from sidecar.model.device import use_device
from sidecar.model.family import read_facts
from sidecar.model.folder import read_genai_config
from sidecar.model.generator.generation import Generation
from sidecar.model.generator.path import (
    GeneratorOptions,
    GeneratorPath,
    TemplateTokenizer,
    drafts_allowed,
    generator_only,
    grammar_eos,
    rewind_slack,
)
from sidecar.model.kv.prompt_cache import ROUND_TOKENS, PromptCache
from sidecar.model.logprobs import ReplyLogprobs, TokenTexts
from sidecar.model.prompt import passages as prompt_passages
from sidecar.model.prompt.builder import Prompt, PromptBuilder
from sidecar.model.prompt.process import PromptSpec
from sidecar.model.prompt.token_bound import max_token_bytes
from sidecar.model.vision import ImageRefused, check_slots, fit_with_images, image_tags
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
        kv_memory_mb: int = 0,
        kv_compact: str = "int8",
        prompt_cache_dir: Path | None = None,
        prompt_cache_disk_mb: int = 4096,
        shared_prefixes: Sequence[str] = (),
        passages: batch_setup.PassageOptions | None = None,
    ):
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be positive, not {prefill_chunk}")
        self.prefill_chunk = prefill_chunk
        genai_config = read_genai_config(path)
        self.context_length = int(genai_config["model"]["context_length"])
        self.max_length = min(max_length or self.context_length, self.context_length)
        self.num_layers = int(genai_config["model"]["decoder"]["num_hidden_layers"])
        self.vocab_size = int(genai_config["model"].get("vocab_size") or 0)  # 0: unknown
        self.rewind_slack = rewind_slack(genai_config)
        # Sized after the warm-up measured a token's KV bytes; off (budget 0) until then.
        self.cache = PromptCache(0, 1, self.max_length, prefill_chunk, prompt_cache_exact)
        self.cache.unscoped = prompt_cache_unscoped
        self._cache_budget = prompt_cache_mb * 2**20
        self._shared_prefixes = tuple(shared_prefixes)  # batch.setup.prepare_idle
        self._kv = batch_setup.KvOptions.chosen(
            kv_memory_mb=kv_memory_mb,
            kv_compact=kv_compact,
            exact=prompt_cache_exact,
            cache_dir=prompt_cache_dir,
            disk_mb=prompt_cache_disk_mb,
        )
        # The spare generator made while loading holds a short prompt and a default reply.
        self._spare_needed = default_new_tokens + ROUND_TOKENS
        config = og.Config(str(path))
        self.session_options = session_options(num_threads, thread_spinning)
        overlay = {"model": {"decoder": {"session_options": self.session_options}}}
        config.overlay(json.dumps(overlay))
        use_device(config, device, provider_options or {})
        self._path = path
        unbatched = generator_only(decode_batch_rows, device)
        if unbatched is not None and decode_batch_rows > 1:
            log.warning(
                "batched decode is off: every reply gets a Generator",
                extra={"fields": {"reason": unbatched}},
            )
        # With batched decode the decoder's weights live in batch/decoder.py's session; the
        # Generator's model (the same weights again) is loaded only if a request needs it.
        self.tokenizer = og.Tokenizer(config)
        template = TemplateTokenizer(self.tokenizer)
        self.facts = read_facts(
            path, genai_config, template, self.tokenizer.eos_token_ids, self.tokenizer.bos_token_id
        )
        log.info("model", extra={"fields": self.facts.log_fields()})
        self.eos_ids = self.facts.eos_ids
        # Whether requests may carry images (ipc.Phase.image_input): the model type decides
        self.image_tags = image_tags(self.facts.model_type)
        self.image_input = self.image_tags is not None
        options = GeneratorOptions(
            vocab_size=self.vocab_size,
            prompt_lookup_tokens=drafts_allowed(genai_config, prompt_lookup_tokens),
            grammar_eos=grammar_eos(genai_config, self.eos_ids),
            num_layers=self.num_layers,
        )
        self.generators = GeneratorPath(config, path, device, options, load=unbatched is not None)
        self.prompts = PromptBuilder(
            template,
            self.facts.added_tokens,
            self.facts.bos_id,
            system_role=self.facts.system_role,
            max_token_bytes=max_token_bytes(path / "tokenizer.json"),
            vocab_size=self.vocab_size,
        )
        # DECODE_BATCH_ROWS > 1: replies the direct path serves are batched (batch/scheduler.py)
        # and own the conversation cache's budget; the Generator path keeps no cache then.
        self.batch: BatchScheduler | None = None
        self.grammars: Grammars | None = None  # guided replies on the batched path
        if unbatched is None:
            batch_options = batch_setup.BatchOptions(
                rows=decode_batch_rows,
                concurrency=max_concurrency,
                threads=num_threads or cpu_budget().count,
                session_options=self.session_options,
                max_length=self.max_length,
                chunk=prefill_chunk,
                cached=bool(self._cache_budget),
                exact=prompt_cache_exact,
                unscoped=prompt_cache_unscoped,
                kv=self._kv,
                eos_ids=self.eos_ids,
                new_stream=self.tokenizer.create_stream,
                vocab_size=self.vocab_size,
                passages=passages or batch_setup.PassageOptions(),
                draft_tokens=options.prompt_lookup_tokens,  # 0 on a vision model
            )
            self.batch = batch_setup.batch_path(path, genai_config, batch_options)
        if self.batch is not None:
            self.grammars = Grammars(path / "tokenizer.json", self.vocab_size, options.grammar_eos)
        elif not self.generators.loaded:
            self.generators.model  # noqa: B018 (the batched path cannot serve: load it now)
        if self.image_input:
            self.generators.open_processor()
        # Log probabilities (logprobs.py): each token's text, made on first use
        decode_one = lambda token: str(self.tokenizer.decode([token]))  # noqa: E731
        self._token_texts = TokenTexts(path / "tokenizer.json", decode_one)

    @property
    def model(self) -> og.Model:  # onnxruntime-genai's (loaded on first use when batched)
        return self.generators.model

    def prompt_spec(self) -> PromptSpec:  # what prompt/process.py builds prompts with
        return PromptSpec.of(self.prompts, self._path, self.max_length)

    def start(
        self, request: Generate, *, cached: bool = True, prompt: Prompt | None = None
    ) -> Generation | BatchGeneration:
        """Fit the prompt unless given (PromptTooLong); continue a cached generator or slot, or
        make a new one. `prompt`: built by the prompt process (prompt/process.py)."""
        if request.images:
            return self._start_with_images(request, cached=cached)
        prompt = prompt or prompt_passages.built(self.prompts, request, self.max_length)
        # The cache decides the rest (PromptCache.lease). With batched decode the Generator
        # path's cache stays off (its budget is never set): the batched path owns the budget.
        if self.batch is not None and serves(request) and follows(self.grammars, request):
            # The grammar first: a refused one (GuidanceRefused) takes no slot
            guidance, grammars = request.guidance, self.grammars
            guide = grammars.matcher(guidance) if grammars and guidance else None
            generation = self.batch.start(prompt, request, cached=cached)
            generation.guide = guide
            generation.logprobs = self.logprobs_for(request)
            return generation
        if request.logprobs is not None and self.generators.options.prompt_lookup_tokens:
            cached = False  # a cached generator may draft (generator/drafts.py), a fresh one not
        return Generation(self, prompt, request, cached=cached)

    def _start_with_images(self, request: Generate, *, cached: bool) -> Generation:
        """A request with images: the processor's tensors and each image's token count, the
        prompt fitted with each image's run of tokens in its place (older turns left out with
        their images), then a new generator that reads them all in its first step."""
        if self.image_tags is None:
            raise ImageRefused(
                f"the model loaded (type {self.facts.model_type}) reads no images; "
                "send text only, or serve a vision model"
            )
        if request.prompt is not None:
            raise ImageRefused("a plain prompt takes no images")
        check_slots(request)
        processed = self.generators.process_images(request.images, self.image_tags)
        prompt, kept = fit_with_images(
            request, self.image_tags, processed.counts, self.prompts, self.max_length
        )
        images = processed.inputs(kept, prompt.ids)
        return Generation(self, prompt, request, cached=cached, images=images)

    def logprobs_for(self, request: Generate) -> ReplyLogprobs | None:
        """The log probabilities a reply keeps (logprobs.py); None: it asked for none."""
        if request.logprobs is None:
            return None
        temperature = request.temperature if request.sampling else None
        return ReplyLogprobs(request.logprobs, self._token_texts, temperature)

    def shadow_guide(self, guidance: Guidance | None) -> RowGuide | None:
        """On the Generator path, a matcher for a guided reply's log probabilities' mask."""
        return self.generators.shadow_guide(guidance, self.grammars)

    def warm_up(self) -> None:
        """Read a short prompt and generate one token (not cached); size the KV cache's
        tokens from what the model really allocated."""
        request = Generate("warm-up", (("user", "Hi"),), max_new_tokens=1)
        prompt = self.prompts.fit(request.messages, 1, self.max_length)
        if self.batch is None:
            generation = Generation(self, prompt, request, cached=False)
            while generation.step() is None:
                pass
            self.cache.bytes_per_token = self.generators.kv_bytes_per_token(generation.generator)
            self.cache.rewinds = self.generators.rewinds(generation.generator)
            generation.release(reusable=False)
            budget = self._cache_budget if self.cache.rewinds else 0
            memory, bpt = self.generators.memory, self.cache.bytes_per_token  # the bound
            self.max_length = memory.size(self._kv.memory_bytes, bpt, budget, self.max_length)
            if not self.cache.rewinds:
                return  # no conversation cache (logged)
            self.cache.budget_bytes = self._cache_budget
            self.generators.make_spare(self.cache, self._spare_needed, self.facts.min_cache_length)
            return
        batched = self.batch.start(prompt, request, cached=False)
        while batched.finish is None:
            self.batch.step()
        batched.release(reusable=False)
        self.batch.cache.budget_bytes = self._cache_budget
        self.max_length = batch_setup.size_kv_memory(self.batch, self._kv, self.max_length)
        batch_setup.prepare_idle(
            self.batch, self._shared_prefixes, self.prompts.fit, self._spare_needed
        )

    def warm_passages(self, request: Generate, prompt: Prompt | None) -> tuple[int, str | None]:
        """Note a request's passages to be read while idle (Generate.warm: batch/setup.py)."""
        prompt = prompt or prompt_passages.built(self.prompts, request, self.max_length)
        return batch_setup.warm_passages(self.batch, prompt, request.passage_scope)

    def cache_stats(self) -> CacheStats:
        return batch_setup.cache_stats(self.batch, self.cache, self.generators.memory.memory)


def load_engine(settings: Settings) -> Engine:
    threads, source = thread_count(settings)
    fields = {"threads": threads, "source": source, "spinning": settings.thread_spinning}
    log.info("onnxruntime threads", extra={"fields": fields})
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
        kv_memory_mb=settings.kv_memory_mb,
        kv_compact=settings.kv_compact,
        prompt_cache_dir=settings.prompt_cache_dir,
        prompt_cache_disk_mb=settings.prompt_cache_disk_mb,
        shared_prefixes=settings.shared_prefixes,
        passages=batch_setup.PassageOptions.of(settings),
    )
