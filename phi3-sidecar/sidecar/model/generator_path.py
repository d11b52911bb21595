"""The Generator path: onnxruntime-genai's own Model and a Generator per reply (generation.py
steps it). Every reply takes it when batched decode is off (DECODE_BATCH_ROWS=1, a device, drafts);
with batched decode only what that path cannot serve does, and the Model (the decoder's weights
a second time) is loaded on first use.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnxruntime_genai as og

from sidecar.ipc import Generate, Guidance
from sidecar.model.batch_guidance import Grammars, RowGuide
from sidecar.model.device import DeviceUnavailable, device_error
from sidecar.model.drafts import use_prompt_lookup
from sidecar.model.folder import ModelFolderError, first_line
from sidecar.model.guidance import refusal
from sidecar.model.prompt import Prompt
from sidecar.model.prompt_cache import PromptCache

log = logging.getLogger("sidecar.model.generator_path")


@dataclass(frozen=True)
class GeneratorOptions:
    """What every Generator of this model shares."""

    vocab_size: int  # 0: unknown
    prompt_lookup_tokens: int  # drafts (drafts.py); 0: off
    grammar_eos: int  # the end token a grammar allows (family.ModelFacts.grammar_eos)
    num_layers: int


class GeneratorPath:
    """onnxruntime-genai's Model (loaded now, or on first use) and the Generators made from it."""

    def __init__(
        self, config: og.Config, path: Path, device: str, options: GeneratorOptions, *, load: bool
    ) -> None:
        self._config, self._path, self._device = config, path, device
        self.options = options
        self._model = self._load() if load else None
        # A guided reply's log probabilities need a matcher of their own (logprobs.py)
        self.shadow_grammars: Grammars | None = None

    @property
    def loaded(self) -> bool:
        return self._model is not None

    @property
    def model(self) -> og.Model:
        """onnxruntime-genai's model, loaded on first use when batched decode is on."""
        if self._model is None:
            log.info("loading the Generator's model for a request batched decode does not serve")
            self._model = self._load()
        return self._model

    def _load(self) -> og.Model:
        try:
            return og.Model(self._config)
        except Exception as exc:
            if self._device != "cpu":
                raise DeviceUnavailable(device_error(self._device, exc)) from exc
            raise folder_error(self._path, exc) from exc

    def new_generator(
        self, capacity: int, request: Generate, prompt: Prompt, guidance: Guidance | None
    ) -> tuple[og.Generator, og.GeneratorParams]:
        """A generator of `capacity` tokens for `request` (its sampling mode, seed, grammar and
        drafts are fixed for the generator's life), and its params."""
        sampling = request.sampling
        params = og.GeneratorParams(self.model)
        turn = turn_options(request, prompt, self.options.vocab_size)
        options: dict[str, Any] = {"max_length": capacity, **turn, "do_sample": sampling}
        if request.seed is not None:
            options["random_seed"] = request.seed
        params.set_search_options(**options)
        # Drafts for greedy, unguided replies without log probabilities only (drafts.py)
        drafted = not sampling and guidance is None and request.logprobs is None
        use_prompt_lookup(params, self.options.prompt_lookup_tokens if drafted else 0)
        try:
            if guidance is not None:
                params.set_guidance(guidance.kind, guidance.data, guidance.ff_tokens)
            return og.Generator(self.model, params), params
        except RuntimeError as exc:
            # the grammar, or llguidance's reading of this model's tokenizer ("llg_")
            if guidance is not None and ("grammar" in str(exc) or "llg_" in str(exc)):
                raise refusal(exc) from exc
            raise

    def shadow_guide(
        self, guidance: Guidance | None, grammars: Grammars | None = None
    ) -> RowGuide | None:
        """A matcher that follows a guided reply for its log probabilities' mask
        (logprobs.py), from the batched path's `grammars` when there are some; None: unguided,
        or llguidance cannot read this model's tokenizer (logged; the values then ignore the
        grammar)."""
        if guidance is None:
            return None
        if self.shadow_grammars is None:
            self.shadow_grammars = grammars or Grammars(
                self._path / "tokenizer.json", self.options.vocab_size, self.options.grammar_eos
            )
        if self.shadow_grammars.unavailable is not None:
            return None
        return self.shadow_grammars.matcher(guidance)

    def make_spare(self, cache: PromptCache, needed: int, min_capacity: int) -> None:
        """One idle greedy generator, made now: the first cached request takes it instead of
        allocating and zero-filling a KV cache of its own (prompt_cache.py, "A spare"), so
        loading pays for it, not the first reply."""
        capacity = cache.spare_capacity(needed, min_capacity)
        if not capacity:
            return
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=capacity, do_sample=False)
        use_prompt_lookup(params, self.options.prompt_lookup_tokens)  # greedy: drafts as set
        spare = cache.keep_spare(og.Generator(self.model, params), params, capacity)
        fields = {"capacity": capacity, "bytes": spare.nbytes}
        log.info("spare generator", extra={"fields": fields})

    def kv_bytes_per_token(self, generator: og.Generator) -> int:
        """K and V of every layer for one token, from the first layer's present key (shape
        [batch, kv_heads, length, head_size], in the model's KV type): 786,432 bytes for
        Phi-3-mini (fp32)."""
        key = generator.get_output("present.0.key")
        per_layer = int(key.shape[1]) * int(key.shape[3]) * int(key.dtype.itemsize)
        return 2 * self.options.num_layers * per_layer


def folder_error(path: Path, exc: Exception) -> ModelFolderError:
    """The model's files cannot be loaded (by onnxruntime-genai, or by the batched path's
    session, which reads the same decoder): one sentence for /readyz."""
    return ModelFolderError(
        f"onnxruntime-genai could not load the model in {str(path)!r}: {first_line(exc)}; "
        "check that the folder is complete (download it again)"
    )


def generator_only(rows: int, device: str, prompt_lookup_tokens: int) -> str | None:
    """Why every reply gets a Generator whatever the decoder (None: the batched path, where
    the engine can drive the decoder)."""
    if rows <= 1:
        return "DECODE_BATCH_ROWS=1"
    if device != "cpu":
        return f"MODEL_DEVICE={device}: the batched path is CPU only"
    if prompt_lookup_tokens:
        # Drafts are onnxruntime-genai's (a Generator's speculative options)
        return "PROMPT_LOOKUP_TOKENS > 0: drafts are a Generator's"
    return None


def grammar_eos(genai_config: Mapping[str, Any], eos_ids: frozenset[int]) -> int:
    """The end token a grammar allows, as onnxruntime-genai's: the first of the
    configuration's eos_token_id (the lowest end id if it names none)."""
    configured = genai_config["model"].get("eos_token_id")
    if isinstance(configured, list) and configured:
        return int(configured[0])
    if isinstance(configured, int):
        return configured
    return min(eos_ids)


def _top_k(top_k: int | None, vocab_size: int) -> int:
    """0 (no cut) when absent; a cut wider than the vocabulary is no cut either, and
    onnxruntime-genai fails on it, so it is capped."""
    if top_k is None:
        return 0
    return min(top_k, vocab_size) if vocab_size else top_k


def turn_options(request: Generate, prompt: Prompt, vocab_size: int) -> dict[str, Any]:
    """The search options of one turn: those a continued generator takes again (min_length is
    absolute, and the sampling values are read at every step); max_length, do_sample and the
    seed are fixed when a generator is made."""
    min_new = min(request.min_new_tokens, prompt.max_new_tokens)
    # EOS is suppressed until min_length; 0 clears a previous turn's minimum.
    options: dict[str, Any] = {"min_length": len(prompt.ids) + min_new if min_new else 0}
    # Applies to greedy and sampled replies alike; 1.0 clears a previous turn's penalty.
    options["repetition_penalty"] = request.repetition_penalty or 1.0
    if request.sampling:  # a temperature below ipc.MIN_TEMPERATURE is greedy
        options |= {
            "temperature": request.temperature,
            "top_p": request.top_p if request.top_p is not None else 1.0,
            "top_k": _top_k(request.top_k, vocab_size),
        }
    return options
