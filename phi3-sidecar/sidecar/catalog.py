"""The published onnxruntime-genai model folders the sidecar knows by name (MODEL_ID,
`phi3-download --model NAME`): where each lives on the Hugging Face Hub, what its local folder
is called, how big it is and under which licence. The one home of those names: the settings'
defaults (MODEL_REPO_ID, MODEL_SUBFOLDER, MODEL_PATH), `phi3-download` and
scripts/run/run_local.py read them here. Phi-3-mini-4k-instruct int4 CPU is the default.

Every entry was checked against public sources, since this project's machines cannot reach the
Hub: the repository and folder names, and the files listed with them, appear in the model cards or
in published code that downloads them (`source` says which). Sizes are exact where they were
measured (Phi-3-mini's weights file, which scripts/models/make_model.py reproduces byte for byte)
and marked approximate otherwise (`size_exact`). No revision is pinned to a commit: none could be
confirmed to hold every folder, so entries follow the repository's `main` branch. Llama 3.2, Qwen2.5
and Gemma publish no onnxruntime-genai folder that could be verified: convert them with
scripts/models/export_model.py (docs/models.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Device = Literal["cpu", "cuda"]


@dataclass(frozen=True)
class CatalogEntry:
    name: str  # MODEL_ID and `--model`
    repo_id: str  # Hugging Face repository
    subfolder: str  # the folder in it that holds genai_config.json ("" for the root)
    folder: str  # the local folder the download goes into (under ./models or /home/models)
    device: Device  # the execution provider the folder was built for
    size_bytes: int  # on disk, all files of the folder
    size_exact: bool  # False: rounded, from the source below
    context_length: int  # tokens
    licence: str  # SPDX id of the model's licence
    files: tuple[str, ...]  # files known to be in the folder (not necessarily all of them)
    source: str  # where the names were verified
    revision: str = "main"
    images: bool = False  # the folder reads images too (a vision model type: docs/api.md)

    @property
    def size_text(self) -> str:
        gb = self.size_bytes / 1e9
        return f"{gb:.1f} GB" if self.size_exact else f"about {gb:.1f} GB"


PHI3_MINI_4K_INT4_CPU = CatalogEntry(
    name="phi3-mini-4k-int4-cpu",
    repo_id="microsoft/Phi-3-mini-4k-instruct-onnx",
    subfolder="cpu_and_mobile/cpu-int4-rtn-block-32-acc-level-4",
    folder="phi3-mini-4k-instruct-int4",
    device="cpu",
    # The weights file is 2,722,861,056 bytes (measured; make_model.py's phi3-mini preset
    # writes exactly that size); the graph and tokenizer files add a few MB.
    size_bytes=2_722_861_056,
    size_exact=True,
    context_length=4096,
    licence="MIT",
    files=(
        "genai_config.json",
        "phi3-mini-4k-instruct-cpu-int4-rtn-block-32-acc-level-4.onnx",
        "phi3-mini-4k-instruct-cpu-int4-rtn-block-32-acc-level-4.onnx.data",
        "tokenizer.json",
        "tokenizer_config.json",
    ),
    source="the public sample this project descends from; the model card",
)

PHI3_MINI_4K_INT4_CUDA = CatalogEntry(
    name="phi3-mini-4k-int4-cuda",
    repo_id="microsoft/Phi-3-mini-4k-instruct-onnx",
    subfolder="cuda/cuda-int4-rtn-block-32",
    folder="phi3-mini-4k-instruct-cuda-int4",
    device="cuda",
    size_bytes=2_700_000_000,  # int4 weights of the same shapes as the CPU folder
    size_exact=False,
    context_length=4096,
    licence="MIT",
    files=("genai_config.json", "phi3-mini-4k-instruct-cuda-int4-rtn-block-32.onnx"),
    source="the model card (int4 CUDA, RTN); published code that loads this folder",
)

PHI3_MINI_4K_FP16_CUDA = CatalogEntry(
    name="phi3-mini-4k-fp16-cuda",
    repo_id="microsoft/Phi-3-mini-4k-instruct-onnx",
    subfolder="cuda/cuda-fp16",
    folder="phi3-mini-4k-instruct-cuda-fp16",
    device="cuda",
    size_bytes=7_600_000_000,  # 3.8 billion parameters at 2 bytes
    size_exact=False,
    context_length=4096,
    licence="MIT",
    files=("genai_config.json", "phi3-mini-4k-instruct-cuda-fp16.onnx"),
    source="the model card (fp16 CUDA); published code that loads this file",
)

PHI35_MINI_INT4_CPU = CatalogEntry(
    name="phi3.5-mini-int4-cpu",
    repo_id="microsoft/Phi-3.5-mini-instruct-onnx",
    subfolder="cpu_and_mobile/cpu-int4-awq-block-128-acc-level-4",
    folder="phi3.5-mini-instruct-int4",
    device="cpu",
    size_bytes=2_500_000_000,
    size_exact=False,
    context_length=131072,
    licence="MIT",
    files=("genai_config.json", "phi-3.5-mini-instruct-cpu-int4-awq-block-128-acc-level-4.onnx"),
    source="the model card (INT4 CPU, AWQ); published code that loads this folder and file",
)

PHI35_MINI_INT4_CUDA = CatalogEntry(
    name="phi3.5-mini-int4-cuda",
    repo_id="microsoft/Phi-3.5-mini-instruct-onnx",
    subfolder="gpu/gpu-int4-awq-block-128",
    folder="phi3.5-mini-instruct-gpu-int4",
    device="cuda",
    size_bytes=2_500_000_000,
    size_exact=False,
    context_length=131072,
    licence="MIT",
    files=("genai_config.json",),
    source="the model card (INT4 GPU, AWQ); published code that runs this folder with -e cuda",
)

PHI4_MINI_INT4_CPU = CatalogEntry(
    name="phi4-mini-int4-cpu",
    repo_id="microsoft/Phi-4-mini-instruct-onnx",
    subfolder="cpu_and_mobile/cpu-int4-rtn-block-32-acc-level-4",
    folder="phi4-mini-instruct-int4",
    device="cpu",
    size_bytes=4_930_000_000,  # model.onnx 52.1 MB, model.onnx.data 4.86 GB, tokenizer 15.5 MB
    size_exact=False,
    context_length=131072,
    licence="MIT",
    files=("genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json"),
    source="the repository's file listing, as quoted with sizes in published notes",
)

MISTRAL_7B_V02_INT4_CPU = CatalogEntry(
    name="mistral-7b-v0.2-int4-cpu",
    repo_id="microsoft/mistral-7b-instruct-v0.2-ONNX",
    subfolder="onnx/cpu_and_mobile/mistral-7b-instruct-v0.2-cpu-int4-rtn-block-32-acc-level-4",
    folder="mistral-7b-instruct-v0.2-int4",
    device="cpu",
    size_bytes=4_200_000_000,  # 7.2 billion parameters at int4, block 32
    size_exact=False,
    context_length=32768,
    licence="Apache-2.0",
    files=("genai_config.json",),
    source="published download commands and code for this folder",
)

MISTRAL_7B_V02_FP16_CUDA = CatalogEntry(
    name="mistral-7b-v0.2-fp16-cuda",
    repo_id="microsoft/mistral-7b-instruct-v0.2-ONNX",
    subfolder="onnx/cuda/mistral-7b-instruct-v0.2-cuda-fp16",
    folder="mistral-7b-instruct-v0.2-cuda-fp16",
    device="cuda",
    size_bytes=14_500_000_000,  # 7.2 billion parameters at 2 bytes
    size_exact=False,
    context_length=32768,
    licence="Apache-2.0",
    files=("genai_config.json",),
    source="published code that downloads this folder",
)

# Vision models (images and text, onnxruntime-genai type phi3v): served on the Generator path,
# one reply at a time, with no conversation cache (docs/models.md says what an image costs).
PHI35_VISION_INT4_CPU = CatalogEntry(
    name="phi3.5-vision-int4-cpu",
    repo_id="microsoft/Phi-3.5-vision-instruct-onnx",
    subfolder="cpu_and_mobile/cpu-int4-rtn-block-32-acc-level-4",
    folder="phi3.5-vision-instruct-int4",
    device="cpu",
    # text decoder 2.33 GB + 52 MB, vision encoder 445 MB, embedding 394 MB, tokenizer 1.9 MB
    size_bytes=3_220_000_000,
    size_exact=False,
    context_length=131072,
    licence="MIT",
    files=(
        "genai_config.json",
        "processor_config.json",
        "phi-3.5-v-instruct-text.onnx",
        "phi-3.5-v-instruct-text.onnx.data",
        "phi-3.5-v-instruct-vision.onnx",
        "phi-3.5-v-instruct-vision.onnx.data",
        "phi-3.5-v-instruct-embedding.onnx",
        "phi-3.5-v-instruct-embedding.onnx.data",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ),
    source="onnxruntime-genai's Phi-3.5-vision tutorial (the download command); published "
    "code that downloads these files, with their sizes",
    images=True,
)

PHI3_VISION_128K_INT4_CPU = CatalogEntry(
    name="phi3-vision-128k-int4-cpu",
    repo_id="microsoft/Phi-3-vision-128k-instruct-onnx-cpu",
    subfolder="cpu-int4-rtn-block-32-acc-level-4",
    folder="phi3-vision-128k-instruct-int4",
    device="cpu",
    size_bytes=3_200_000_000,  # Phi-3.5-vision's shapes (4.2 billion parameters), int4
    size_exact=False,
    context_length=131072,
    licence="MIT",
    files=("genai_config.json", "processor_config.json"),
    source="onnxruntime-genai's Phi-3-vision tutorial (the download command and folder name)",
    images=True,
)

DEFAULT = PHI3_MINI_4K_INT4_CPU

ENTRIES: dict[str, CatalogEntry] = {
    entry.name: entry
    for entry in (
        PHI3_MINI_4K_INT4_CPU,
        PHI35_MINI_INT4_CPU,
        PHI4_MINI_INT4_CPU,
        MISTRAL_7B_V02_INT4_CPU,
        PHI35_VISION_INT4_CPU,
        PHI3_VISION_128K_INT4_CPU,
        PHI3_MINI_4K_INT4_CUDA,
        PHI3_MINI_4K_FP16_CUDA,
        PHI35_MINI_INT4_CUDA,
        MISTRAL_7B_V02_FP16_CUDA,
    )
}


def lookup(name: str) -> CatalogEntry:
    """The entry called `name`; KeyError with the known names otherwise."""
    try:
        return ENTRIES[name]
    except KeyError:
        raise KeyError(f"no model {name!r} in the catalog; known: {', '.join(ENTRIES)}") from None
