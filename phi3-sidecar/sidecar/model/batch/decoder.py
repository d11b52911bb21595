"""The exported decoder driven directly by onnxruntime, over KV buffers this module owns.

onnxruntime-genai 0.18 runs one Generator per reply on the CPU; its batching cannot take a
request that arrives mid-batch, and a Generator's KV cache cannot leave it (see
ARCHITECTURE.md, "Batched decode"). Here the decoder graph (model.onnx, named in
genai_config.json) runs in an onnxruntime InferenceSession with IOBinding over a pool of KV
slots: per layer one K and one V buffer [slots, kv_heads, length, head_size]. A model call
binds a contiguous run of slots as both the past input and the present output (the
GroupQueryAttention share-buffer mode: each row's new K/V is written in place at its own
length, read from the attention mask's row sum), so no call copies a cache.

The pool is anonymous memory mapped without reserving it: a slot costs memory only for the
positions written, and a freed slot gives its pages back (madvise), so the conversation cache
can count bytes per token.

Measured on an AMD EPYC (2 vCPUs; ARCHITECTURE.md): MatMulNBits (int4, accuracy level 4) and
GroupQueryAttention give every row bit for bit the logits it gets alone, so greedy replies do
not depend on who else is in the batch.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from sidecar.model.kv import pages as kv_pages

_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
_INT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


class Unsupported(Exception):
    """The folder's decoder is not one this module can drive; str() says why (the engine then
    keeps onnxruntime-genai's Generator for every request)."""


@dataclass(frozen=True)
class DecoderSpec:
    """What genai_config.json and the graph say about the decoder's inputs and outputs."""

    filename: str
    layers: int
    kv_heads: int
    head_size: int
    input_ids: str
    attention_mask: str
    past_key: str  # with %d for the layer
    past_value: str
    present_key: str
    present_value: str
    logits: str

    @property
    def names(self) -> list[tuple[str, str, str, str]]:
        """(past key, past value, present key, present value) of each layer."""
        return [
            (self.past_key % i, self.past_value % i, self.present_key % i, self.present_value % i)
            for i in range(self.layers)
        ]


def read_spec(genai_config: Mapping[str, Any]) -> DecoderSpec:
    """The decoder's names and shapes; Unsupported for a configuration this path cannot serve
    exactly as onnxruntime-genai would (other inputs, search options it does not apply)."""
    model = genai_config["model"]
    decoder = model["decoder"]
    inputs, outputs = decoder.get("inputs", {}), decoder.get("outputs", {})
    known = {"input_ids", "attention_mask", "past_key_names", "past_value_names"}
    if "inputs_embeds" in inputs:
        raise Unsupported("the decoder reads embeddings (a vision model: images and text)")
    if set(inputs) - known:
        raise Unsupported(f"decoder inputs {sorted(set(inputs) - known)} are not supported")
    search = genai_config.get("search", {})
    if float(search.get("repetition_penalty", 1.0)) != 1.0:
        raise Unsupported("a repetition_penalty in genai_config.json is not supported")
    if int(search.get("no_repeat_ngram_size", 0)) or int(search.get("num_beams", 1)) != 1:
        raise Unsupported("no_repeat_ngram_size or beam search in genai_config.json")
    if model.get("encoder") or model.get("vision") or model.get("speech"):
        raise Unsupported("models with more than a decoder are not supported")
    try:
        return DecoderSpec(
            filename=decoder["filename"],
            layers=int(decoder["num_hidden_layers"]),
            kv_heads=int(decoder["num_key_value_heads"]),
            head_size=int(decoder["head_size"]),
            input_ids=inputs.get("input_ids", "input_ids"),
            attention_mask=inputs["attention_mask"],
            past_key=inputs["past_key_names"],
            past_value=inputs["past_value_names"],
            present_key=outputs["present_key_names"],
            present_value=outputs["present_value_names"],
            logits=outputs.get("logits", "logits"),
        )
    except KeyError as exc:
        raise Unsupported(f"genai_config.json names no {exc.args[0]}") from exc


class KvPool:
    """Per layer, K and V buffers of `slots` rows of `length` positions each."""

    def __init__(self, spec: DecoderSpec, slots: int, length: int, dtype: Any) -> None:
        self.slots = slots
        self.length = length
        self.dtype = np.dtype(dtype)
        shape = (slots, spec.kv_heads, length, spec.head_size)
        self.slot_bytes = int(np.prod(shape[1:])) * self.dtype.itemsize
        self.kv_heads = spec.kv_heads
        self._maps: list[mmap.mmap] = []
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        for _ in range(spec.layers):
            for buffers in (self.keys, self.values):
                flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | kv_pages.MAP_NORESERVE
                area = mmap.mmap(-1, slots * self.slot_bytes, flags=flags)
                self._maps.append(area)
                buffers.append(np.frombuffer(area, dtype=self.dtype).reshape(shape))
        # Bytes of K and V, all layers, for one position of one slot.
        per_layer = spec.kv_heads * spec.head_size * self.dtype.itemsize
        self.bytes_per_token = 2 * spec.layers * per_layer

    def free(self, slot: int) -> None:
        """Give the slot's pages back (they read as zeros again)."""
        if self.slot_bytes % mmap.PAGESIZE:
            return  # not page aligned: the memory stays, the slot is reused as it is
        for area in self._maps:
            area.madvise(mmap.MADV_DONTNEED, slot * self.slot_bytes, self.slot_bytes)

    def swap(self, a: int, b: int, length_a: int, length_b: int) -> None:
        """Exchange two slots' first positions (length_a of slot a, length_b of slot b).
        Page-aligned slots exchange their pages whole (kv/pages.py: no bytes copied, each
        conversation's memory goes with it). Otherwise the positions are copied, and the slot
        that now holds fewer positions gives back the pages past them: otherwise it would keep
        the longer reply's memory while the cache counts the shorter one's."""
        if a == b:
            return
        if self._exchange_pages(a, b):
            return
        for buffer in (*self.keys, *self.values):
            held = buffer[a, :, :length_a].copy()
            buffer[a, :, :length_b] = buffer[b, :, :length_b]
            buffer[b, :, :length_a] = held
        if length_a > length_b:
            self.trim(a, length_b)
        elif length_b > length_a:
            self.trim(b, length_a)

    def _exchange_pages(self, a: int, b: int) -> bool:
        """Exchange slots a and b page for page in every buffer; False (nothing changed)
        where pages cannot be moved."""
        if self.slot_bytes % mmap.PAGESIZE or not kv_pages.available():
            return False
        size = self.slot_bytes
        regions = [
            (buffer.ctypes.data + a * size, buffer.ctypes.data + b * size)
            for buffer in (*self.keys, *self.values)
        ]
        for done, (first, second) in enumerate(regions):
            if not kv_pages.exchange(first, second, size):
                for undo_first, undo_second in regions[:done]:  # the copy expects them as they were
                    kv_pages.exchange(undo_first, undo_second, size)
                return False
        return True

    def populate(self, slot: int, start: int, end: int) -> bool:
        """Map pages for positions [start, end) of a slot in every layer's K and V, their
        content unchanged (Linux's MADV_POPULATE_WRITE, 5.14 and later: the faults a model
        call writing there would take, taken now); False where that cannot be done."""
        if self._head_bytes % mmap.PAGESIZE or not 0 <= start < end <= self.length:
            return False
        first = start * self._position_bytes // mmap.PAGESIZE * mmap.PAGESIZE  # rounded down
        last = -(-end * self._position_bytes // mmap.PAGESIZE) * mmap.PAGESIZE  # rounded up
        try:
            for area, offset in self._heads(slot):
                area.madvise(kv_pages.MADV_POPULATE_WRITE, offset + first, last - first)
        except OSError:  # an older kernel (EINVAL), or no memory left to map (ENOMEM)
            return False
        return True

    def trim(self, slot: int, keep: int) -> None:
        """Give back the pages of a slot past its first `keep` positions (every head's run of
        positions is its own region; the page that holds position `keep - 1` stays)."""
        head_bytes = self._head_bytes
        if head_bytes % mmap.PAGESIZE or keep >= self.length:
            return  # not page aligned: the memory stays until the slot is freed
        start = -(-keep * self._position_bytes // mmap.PAGESIZE) * mmap.PAGESIZE  # rounded up
        if start >= head_bytes:
            return
        for area, offset in self._heads(slot):
            area.madvise(mmap.MADV_DONTNEED, offset + start, head_bytes - start)

    @property
    def _head_bytes(self) -> int:
        """One head's run of positions in a slot."""
        return self.slot_bytes // self.kv_heads

    @property
    def _position_bytes(self) -> int:
        """One position of one head."""
        return self._head_bytes // self.length

    def _heads(self, slot: int) -> Iterator[tuple[mmap.mmap, int]]:
        """Each buffer's mapping, with the offset of each of the slot's heads in it."""
        for area in self._maps:
            for head in range(self.kv_heads):
                yield area, slot * self.slot_bytes + head * self._head_bytes


class BatchDecoder:
    """The session, and model calls over runs of pool slots."""

    def __init__(
        self,
        folder: Path,
        spec: DecoderSpec,
        session_config: Mapping[str, str],
        threads: int,
        slots: int,
        length: int,
    ) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        for key, value in session_config.items():
            options.add_session_config_entry(key, value)
        self.spec = spec
        self.session = ort.InferenceSession(
            str(folder / spec.filename), options, providers=["CPUExecutionProvider"]
        )
        types = {i.name: i.type for i in self.session.get_inputs()}
        expected = {spec.input_ids, spec.attention_mask}
        expected |= {name for layer in spec.names for name in layer[:2]}
        if set(types) != expected:
            raise Unsupported(f"the decoder's inputs are {sorted(types)}, not {sorted(expected)}")
        kv_type = types[spec.past_key % 0]
        if kv_type not in _NUMPY_TYPES:
            raise Unsupported(f"KV cache type {kv_type} is not supported")
        self._ids_type = _INT_TYPES[types[spec.input_ids]]
        self._mask_type = _INT_TYPES[types[spec.attention_mask]]
        try:
            self.pool = KvPool(spec, slots, length, _NUMPY_TYPES[kv_type])
        except (OSError, ValueError, MemoryError) as exc:  # e.g. strict overcommit
            raise Unsupported(f"the KV pool's address space cannot be mapped: {exc}") from exc
        self._bound: dict[tuple[int, int], list[ort.OrtValue]] = {}

    def run(
        self, first: int, ids: np.ndarray, lengths: Sequence[int], *, every: bool = False
    ) -> np.ndarray:
        """Feed `ids` [rows, tokens] to slots first..first+rows-1, whose caches hold
        `lengths` positions (each row's new K/V goes after them); the logits of each row's
        last token [rows, vocab], as float32 (`every`: of every token [rows, tokens, vocab],
        for the teacher forcing of `python -m scripts.bench quality`)."""
        rows, tokens = ids.shape
        binding = self.session.io_binding()
        binding.bind_cpu_input(self.spec.input_ids, np.ascontiguousarray(ids, self._ids_type))
        # GroupQueryAttention reads each row's length from its mask's sum; the width is the
        # longest row's total length.
        total = max(lengths) + tokens
        mask = (np.arange(total)[None, :] < (np.asarray(lengths)[:, None] + tokens)).astype(
            self._mask_type
        )
        binding.bind_cpu_input(self.spec.attention_mask, mask)
        binding.bind_output(self.spec.logits)  # first: get_outputs() follows binding order
        for (past_k, past_v, present_k, present_v), (key, value) in zip(
            self.spec.names, self._views(first, rows), strict=True
        ):
            binding.bind_ortvalue_input(past_k, key)
            binding.bind_ortvalue_output(present_k, key)
            binding.bind_ortvalue_input(past_v, value)
            binding.bind_ortvalue_output(present_v, value)
        self.session.run_with_iobinding(binding)
        logits = binding.get_outputs()[0].numpy()
        return np.asarray(logits if every else logits[:, -1, :], dtype=np.float32)

    def _views(self, first: int, rows: int) -> list[tuple[ort.OrtValue, ort.OrtValue]]:
        key = (first, rows)
        if key not in self._bound:
            if len(self._bound) > 4 * self.pool.slots:
                self._bound.clear()
            pool = self.pool
            self._bound[key] = [
                value
                for layer in range(self.spec.layers)
                for value in (
                    ort.OrtValue.ortvalue_from_numpy(pool.keys[layer][first : first + rows]),
                    ort.OrtValue.ortvalue_from_numpy(pool.values[layer][first : first + rows]),
                )
            ]
        values = self._bound[key]
        return list(zip(values[0::2], values[1::2], strict=True))
