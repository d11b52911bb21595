"""The Generator path: onnxruntime-genai's own Model and a Generator per reply (generation.py
steps it). Every reply takes it when batched decode is off (DECODE_BATCH_ROWS=1, a device);
with batched decode only what that path cannot serve does, and the Model (the decoder's weights
a second time) is loaded on first use. A vision model (vision.py) takes it for every reply: its
decoder reads embeddings, which the batched path does not make; its image processor is here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og

from sidecar.ipc import Generate, Guidance
from sidecar.model.batch.guidance import Grammars, RowGuide
from sidecar.model.device import DeviceUnavailable, device_error
from sidecar.model.folder import ModelFolderError, first_line, multimodal
from sidecar.model.generator.drafts import use_prompt_lookup
from sidecar.model.generator.memory import GeneratorMemory
from sidecar.model.guidance import refusal
from sidecar.model.kv.prompt_cache import PromptCache
from sidecar.model.prompt.builder import Prompt
from sidecar.model.vision import ImageRefused, ImageTags

log = logging.getLogger("sidecar.model.generator_path")  # the name its log lines always had


@dataclass(frozen=True)
class GeneratorOptions:
    """What every Generator of this model shares."""

    vocab_size: int  # 0: unknown
    prompt_lookup_tokens: int  # drafts (generator/drafts.py); 0: off
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
        self._processor: og.MultiModalProcessor | None = None  # a vision model's
        # KV_MEMORY_MB for the generators made for one reply (generator/memory.py)
        self.memory = GeneratorMemory(device)

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

    def open_processor(self) -> None:
        """Load a vision model's image processor (processor_config.json) now, so that a folder
        whose processor cannot load fails at start, not at its first image."""
        try:
            self._processor = self.model.create_multimodal_processor()
        except Exception as exc:
            raise folder_error(self._path, exc) from exc

    def process_images(self, pngs: Sequence[bytes], tags: ImageTags) -> ProcessedImages:
        """The processor's tensors for these images (PNG bytes the web process decoded and
        re-encoded: onnxruntime-extensions' decoder ends the process on some malformed bytes)
        and each image's prompt tokens. The processor is given a prompt of tags only, never
        user text. An image it refuses (too narrow once scaled, a side over 16,384 pixels)
        raises ImageRefused."""
        if self._processor is None:
            self.open_processor()
        assert self._processor is not None
        try:
            images = og.Images.open_bytes(*pngs)
            named = self._processor(tags.processor_prompt(len(pngs)), images=images)
            counts = [int(n) for n in named["num_image_tokens"].as_numpy().ravel()]
        except RuntimeError as exc:
            raise ImageRefused(
                f"the model's image processor refused an image: {first_line(exc)}"
            ) from exc
        if len(counts) != len(pngs):
            raise ImageRefused(f"the image processor read {len(counts)} of {len(pngs)} images")
        return ProcessedImages(named, counts)

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
        # Drafts for greedy, unguided replies without log probabilities only (generator/drafts.py)
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
        allocating and zero-filling a KV cache of its own (kv/prompt_cache.py, "A spare"), so
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

    def rewinds(self, generator: og.Generator) -> bool:
        """Whether this model's generators can be rewound, tried on one that is done with
        (onnxruntime-genai 0.18 refuses it for phi3v, even after a text-only prompt): the
        conversation cache lends generators by rewinding them."""
        try:
            generator.rewind_to(0)
        except RuntimeError:
            log.info("conversation cache off: the model's generators cannot be rewound")
            return False
        return True

    def kv_bytes_per_token(self, generator: og.Generator) -> int:
        """K and V of every layer for one token, from the first layer's present key (shape
        [batch, kv_heads, length, head_size], in the model's KV type): 786,432 bytes for
        Phi-3-mini (fp32)."""
        key = generator.get_output("present.0.key")
        per_layer = int(key.shape[1]) * int(key.shape[3]) * int(key.dtype.itemsize)
        return 2 * self.options.num_layers * per_layer


class ProcessedImages:
    """A request's images as the processor made them (pixel_values, image_sizes,
    num_image_tokens: image first on every axis 0) and each one's prompt tokens."""

    def __init__(self, named: og.NamedTensors, counts: list[int]) -> None:
        self._named = named
        self.counts = counts

    def inputs(self, kept: Sequence[int], ids: Sequence[int]) -> ImageInputs | None:
        """What the prompt `ids` (images numbered by vision.number_images) reads its images
        from: the tensors of the `kept` images, in that order; None when it holds none."""
        if not kept:
            return None
        # NamedTensors cannot be iterated: keys() is its only listing
        names = [name for name in self._named.keys() if name != "input_ids"]  # noqa: SIM118
        tensors: dict[str, Any]
        if list(kept) == list(range(len(self.counts))):
            tensors = {name: self._named[name] for name in names}
        else:  # images of left-out turns are gone: their rows are too
            tensors = {name: _as_input(self._named[name].as_numpy()[list(kept)]) for name in names}
        end = max(at for at, token in enumerate(ids) if token < 0) + 1
        return ImageInputs(tensors, end)


@dataclass(frozen=True)
class ImageInputs:
    """The first call of an image prompt: onnxruntime-genai runs the vision graph on a
    generator's first run only (a later set_inputs or append reads no image features), so one
    call reads every token up to the last image; the rest of the prompt follows in chunks."""

    tensors: Mapping[str, Any]
    end: int  # the prompt's tokens up to and with its last image's

    def named(self, ids: Sequence[int]) -> og.NamedTensors:
        named = og.NamedTensors()
        named["input_ids"] = np.asarray([ids[: self.end]], dtype=np.int32)
        for name, value in self.tensors.items():
            named[name] = value
        return named


def _as_input(array: np.ndarray) -> np.ndarray:
    """A numpy copy onnxruntime-genai takes: its as_numpy() gives int64 as numpy's longlong,
    which it refuses back ("Unsupported numpy type"); the same bytes as int64 it takes."""
    array = np.ascontiguousarray(array)
    return array.view(np.int64) if array.dtype.kind == "i" and array.itemsize == 8 else array


class TemplateTokenizer:
    """onnxruntime-genai's tokenizer as the prompt builder and family.py read it
    (prompt.builder.Tokenizer): ids as ints, the chat template's text as str."""

    def __init__(self, tokenizer: og.Tokenizer) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self._tokenizer.encode(text)]

    def apply_chat_template(self, messages: str, add_generation_prompt: bool = True) -> str:
        rendered = self._tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt
        )
        return str(rendered)


def template_tokenizer(path: Path) -> TemplateTokenizer:
    """The tokenizer and chat template of the model folder `path` alone, without its model
    (prompt/process.py builds prompts with it)."""
    return TemplateTokenizer(og.Tokenizer(og.Config(str(path))))


def rewind_slack(genai_config: Mapping[str, Any]) -> int:
    """Tokens a continued generator cannot reuse per generated token: a KV cache that is not
    one buffer shared by past and present (a quantized KV cache on the CPU) cannot be rewound
    to its whole length once a token was generated ("Requested length of rewind is greater
    than the current length"), so the cache counts one token fewer as reusable."""
    shared = genai_config.get("search", {}).get("past_present_share_buffer", True)
    return 0 if shared else 1


def folder_error(path: Path, exc: Exception) -> ModelFolderError:
    """The model's files cannot be loaded (by onnxruntime-genai, or by the batched path's
    session, which reads the same decoder): one sentence for /readyz."""
    return ModelFolderError(
        f"onnxruntime-genai could not load the model in {str(path)!r}: {first_line(exc)}; "
        "check that the folder is complete (download it again)"
    )


def drafts_allowed(genai_config: dict[str, Any], prompt_lookup_tokens: int) -> int:
    """PROMPT_LOOKUP_TOKENS, or 0 (logged) for a model that is more than a decoder:
    onnxruntime-genai 0.18 drafts for decoder-only text models only, and a vision model's
    Generator refuses it ("N-gram decoding requires a plain decoder-only text model")."""
    if prompt_lookup_tokens and multimodal(genai_config):
        log.warning(
            "PROMPT_LOOKUP_TOKENS is ignored: this model is more than a decoder",
            extra={"fields": {"prompt_lookup_tokens": prompt_lookup_tokens}},
        )
        return 0
    return prompt_lookup_tokens


def generator_only(rows: int, device: str) -> str | None:
    """Why every reply gets a Generator whatever the decoder (None: the batched path, where
    the engine can drive the decoder; it drafts too, batch/drafts.py)."""
    if rows <= 1:
        return "DECODE_BATCH_ROWS=1"
    if device != "cpu":
        return f"MODEL_DEVICE={device}: the batched path is CPU only"
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
