"""Download an onnxruntime-genai model folder (by default Phi-3-mini-4k int4 CPU, ~2.7 GB).

The sidecar's own `phi3-download` command, for a checkout: prints the folder that holds
genai_config.json (the sidecar's MODEL_PATH); resumes an interrupted download. `--help` lists
the options.

    python -m scripts.models.download_model [--out DIR] [--repo-id ID --subfolder PATH] [--revision REV]
"""

from __future__ import annotations

import sys

from sidecar.model.download import main

if __name__ == "__main__":
    sys.exit(main())
