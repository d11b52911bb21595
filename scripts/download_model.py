"""Download an onnxruntime-genai model folder (by default Phi-3-mini-4k int4 CPU, ~2.7 GB).

Prints the folder that holds genai_config.json: the sidecar's MODEL_PATH. Resumes an
interrupted download and does nothing when the folder is already complete. Honours HF_TOKEN
(gated or private repos), HF_HOME (the client's cache) and HF_ENDPOINT.

    python scripts/download_model.py [--out DIR] [--repo-id ID --subfolder PATH] [--revision REV]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "phi3-sidecar"))

from sidecar.download import (  # after the sys.path line above
    DEFAULT_OUT_DIR,
    DEFAULT_REPO_ID,
    DEFAULT_SUBFOLDER,
    DownloadError,
    download_model,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT_DIR, help="download into this folder")
    p.add_argument("--repo-id", default=DEFAULT_REPO_ID, help="Hub repository (owner/name)")
    p.add_argument(
        "--subfolder", default=DEFAULT_SUBFOLDER, help="folder of the repo with genai_config.json"
    )
    p.add_argument("--revision", help="branch, tag or commit to pin (default: main)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    if args.repo_id.count("/") != 1 or not all(args.repo_id.split("/")):
        p.error(f"--repo-id must look like owner/name, not {args.repo_id!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The Hub client logs warnings (e.g. "no files matched") that would repeat our own message.
    from huggingface_hub.utils import logging

    logging.set_verbosity_error()
    try:
        folder = download_model(
            args.repo_id,
            args.subfolder,
            args.out,
            revision=args.revision,
            token=os.environ.get("HF_TOKEN") or None,
            progress=not args.quiet,
        )
    except DownloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; run the same command again to resume.", file=sys.stderr)
        return 130
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
