"""The published model folders the sidecar knows by name: where each lives on the Hugging Face
Hub and what its local folder is called. The one home of those names: the settings' defaults
(MODEL_REPO_ID, MODEL_SUBFOLDER, MODEL_PATH), `phi3-download` and scripts/run_local.py read them
here. Phi-3-mini-4k-instruct int4 CPU is the default.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogEntry:
    repo_id: str  # Hugging Face repository
    subfolder: str  # the folder in it that holds genai_config.json ("" for the root)
    folder: str  # the local folder the download goes into (under ./models or /home/models)


PHI3_MINI_4K_INT4_CPU = CatalogEntry(
    repo_id="microsoft/Phi-3-mini-4k-instruct-onnx",
    subfolder="cpu_and_mobile/cpu-int4-rtn-block-32-acc-level-4",
    folder="phi3-mini-4k-instruct-int4",
)
DEFAULT = PHI3_MINI_4K_INT4_CPU
