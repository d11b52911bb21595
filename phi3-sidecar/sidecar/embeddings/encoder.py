"""The encoder: the folder's tokenizer (`tokenizers`) and its ONNX graph in onnxruntime, with
sentence-transformers' pooling and normalisation done in numpy on the hidden states.

What one input may cost is bounded before anything is tokenized (`max_chars`): the tokenizer
holds about 100 to 200 bytes a character while it reads a text (its normalized copy and the
offsets of every character), so a text of megabytes would take gigabytes. No text within the
token limit needs more than `CHARS_PER_TOKEN` characters a token (English prose takes 4 to 5,
code about 3; a WordPiece token covers at most the tokenizer's longest word, 100 characters,
`split_long_words`), so `max_tokens * CHARS_PER_TOKEN` characters refuse nothing the model
could read whole but runs of blank space.

One `InferenceSession` with one intra-op thread: `run` executes on the calling thread (no pool
of onnxruntime's own), so the scheduler's threads (scheduler.py) are the only threads that
compute, and their priority is the encoder's. onnxruntime's `run` and `tokenizers`'
`encode_batch` release the GIL, so the web process's event loop goes on meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sidecar.embeddings.folder import EncoderFolderError, EncoderSpec

if TYPE_CHECKING:
    import numpy as np
    from tokenizers import Tokenizer

    # One input's token ids: a client's list, or the tokenizer's as int32 (token_arrays)
    Ids = list[int] | np.ndarray

log = logging.getLogger("sidecar.embeddings")

# Generous on purpose (docstring above): a bound on work, not an estimate of tokens.
CHARS_PER_TOKEN = 100


class Encoder:
    def __init__(self, spec: EncoderSpec) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.spec = spec
        tokenizer = Tokenizer.from_file(str(spec.tokenizer))
        tokenizer.no_truncation()  # the limit is the sidecar's to apply: refuse or cut, said
        tokenizer.no_padding()
        split_long_words(tokenizer)
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.special_ids = frozenset(
            i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special
        )
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(
                str(spec.onnx), options, providers=["CPUExecutionProvider"]
            )
        except Exception as error:  # onnxruntime raises its own types for a bad file
            raise EncoderFolderError(f"{spec.onnx} cannot be loaded: {first_line(error)}") from None
        names = {i.name for i in self.session.get_inputs()}
        if not {"input_ids", "attention_mask"} <= names:
            raise EncoderFolderError(f"{spec.onnx}: inputs are not input_ids and attention_mask")
        self.types = "token_type_ids" in names
        self.output = self.session.get_outputs()[0].name
        self.max_chars = spec.max_tokens * CHARS_PER_TOKEN  # the most one input may hold
        width = self.encode([self.tokenize(["warm up"])[0]]).shape[1]
        if width != spec.dimensions:
            raise EncoderFolderError(
                f"{spec.onnx} gives vectors of {width} numbers, the pooling config says "
                f"{spec.dimensions}"
            )

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, special tokens included, never cut."""
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=True)]

    def token_arrays(self, texts: list[str]) -> list[np.ndarray]:
        """`tokenize`, each text's ids kept as int32: a tenth of a list of Python ints, for
        requests that wait in the queue with their inputs tokenized."""
        import numpy as np

        return [np.asarray(ids, dtype=np.int32) for ids in self.tokenize(texts)]

    def cut(self, ids: Ids, limit: int) -> Ids:
        """The first `limit` tokens, keeping the special tokens that end the input ([SEP]), as
        transformers' truncation does."""
        if len(ids) <= limit:
            return ids
        tail = 0
        while tail < len(ids) and int(ids[len(ids) - 1 - tail]) in self.special_ids:
            tail += 1
        tail = min(tail, limit)
        head, end = ids[: limit - tail], ids[len(ids) - tail :] if tail else ids[:0]
        if isinstance(ids, list):
            return [*head, *end]
        import numpy as np

        return np.concatenate((head, end))

    def encode(self, batch: Sequence[Ids]) -> np.ndarray:
        """One model call: the pooled (and, as the folder says, normalised) vectors, float32."""
        import numpy as np

        longest = max(len(ids) for ids in batch)
        input_ids = np.zeros((len(batch), longest), dtype=np.int64)
        mask = np.zeros((len(batch), longest), dtype=np.int64)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        feeds: dict[str, Any] = {"input_ids": input_ids, "attention_mask": mask}
        if self.types:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        (hidden,) = self.session.run([self.output], feeds)
        return pool(hidden.astype(np.float32, copy=False), mask, self.spec)


def pool(hidden: np.ndarray, mask: np.ndarray, spec: EncoderSpec) -> np.ndarray:
    """sentence-transformers' Pooling (and Normalize) on hidden states `[batch, tokens, width]`."""
    import numpy as np

    weights = mask[:, :, None].astype(np.float32)
    counts = np.maximum(weights.sum(axis=1), 1e-9)
    if spec.pooling == "cls":
        vectors = hidden[:, 0]
    elif spec.pooling == "max":
        vectors = np.where(weights > 0, hidden, np.float32(-1e9)).max(axis=1)
    else:
        sums = (hidden * weights).sum(axis=1)
        vectors = sums / (counts if spec.pooling == "mean" else np.sqrt(counts))
    if spec.normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, np.float32(1e-12))
    return np.ascontiguousarray(vectors, dtype=np.float32)


def split_long_words(tokenizer: Tokenizer) -> None:
    """A word longer than a WordPiece tokenizer's `max_input_chars_per_word` is read as pieces
    of that many characters, each split into tokens as a word of its own, instead of one
    [UNK]: its tokens are what it costs (counted against the limit like any other), and its
    text reaches the vector. The chat app counts passages with the same rule
    (chatapp/documents/reading/tokens.py; tests/test_contracts.py). Other tokenizers are left as
    they are: BPE and Unigram have no such cliff."""
    from tokenizers import Regex, models, pre_tokenizers

    model = tokenizer.model
    if not isinstance(model, models.WordPiece):
        return
    longest = int(model.max_input_chars_per_word)
    pieces = pre_tokenizers.Split(Regex(f".{{1,{longest}}}"), behavior="isolated")
    first = tokenizer.pre_tokenizer
    tokenizer.pre_tokenizer = pieces if first is None else pre_tokenizers.Sequence([first, pieces])


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__
