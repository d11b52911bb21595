"""A GGUF file's metadata and tensors, read with the `gguf` package.

GGUF lists a tensor's dimensions innermost first (ggml's ne[0] is the length of a row), the
reverse of numpy's and PyTorch's order: a llama q projection of 576 outputs over 576 inputs and
a k projection of 192 outputs are stored as [576, 576] and [576, 192]. Tensors are returned in
numpy's order, float32, so they are the Hugging Face model's shapes (before the rope
permutation hf_folder.py undoes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from scripts.models.realmodel.dequant import NAMES, dequantize


class GgufError(ValueError):
    """The GGUF is not one this converter reads; str() says what is missing or unexpected."""


@dataclass(frozen=True)
class GgufModel:
    metadata: dict[str, Any]
    tensors: dict[str, NDArray[np.float32]]  # numpy order (rows, columns)
    types: dict[str, str]  # tensor name -> its GGML type's name, as stored

    def get(self, key: str) -> Any:
        """A metadata value; GgufError naming the key if it is absent."""
        if key not in self.metadata:
            raise GgufError(f"the GGUF has no {key!r}")
        return self.metadata[key]


def read_gguf(path: Path) -> GgufModel:
    import gguf

    reader = gguf.GGUFReader(str(path))
    metadata = {
        name: field.contents()
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.")
    }
    tensors: dict[str, NDArray[np.float32]] = {}
    types: dict[str, str] = {}
    for tensor in reader.tensors:
        kind = int(tensor.tensor_type)
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        try:
            flat = dequantize(tensor.data, kind)
        except ValueError as error:
            raise GgufError(f"tensor {tensor.name}: {error}") from None
        if flat.size != int(np.prod(shape)):
            raise GgufError(f"tensor {tensor.name}: {flat.size} weights for shape {shape}")
        tensors[tensor.name] = flat.reshape(shape)
        types[tensor.name] = NAMES.get(kind, str(kind))
    return GgufModel(metadata, tensors, types)
