"""Fetch an onnxruntime-genai model folder from the Hugging Face Hub.

Used by the sidecar on first start (MODEL_DOWNLOAD=1) and as a command of its own:

    phi3-download [--model NAME] [--out DIR] [--repo-id ID --subfolder PATH] [--revision REV]
    phi3-download --list

(also `python -m scripts.models.download_model` in a checkout). It prints the folder that holds
genai_config.json: the sidecar's MODEL_PATH.
Every failure becomes a `DownloadError` whose message is one sentence a person can act on.
The Hub client honours HF_TOKEN, HF_HOME and HF_ENDPOINT by itself; an interrupted download
resumes from the partial files it keeps under `<out_dir>/.cache/huggingface`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sidecar import catalog
from sidecar.model.folder import ModelFolderError, first_line, is_complete
from sidecar.settings import Settings

DEFAULT_REPO_ID = catalog.DEFAULT.repo_id
DEFAULT_SUBFOLDER = catalog.DEFAULT.subfolder
DEFAULT_OUT_DIR = Path("models") / catalog.DEFAULT.folder  # relative to where the command runs


log = logging.getLogger("sidecar.model.folder")  # the name its log lines always had


class DownloadError(Exception):
    """The model could not be fetched; str(error) is one sentence for the user."""


def download_model(
    repo_id: str = DEFAULT_REPO_ID,
    subfolder: str = DEFAULT_SUBFOLDER,
    out_dir: Path = DEFAULT_OUT_DIR,
    revision: str | None = None,
    token: str | None = None,
    progress: bool = True,
) -> Path:
    """Download `subfolder` of `repo_id` into `out_dir`; returns the folder of genai_config.json.

    Does nothing (and needs no network) when that folder is already complete.
    """
    subfolder = subfolder.strip("/")
    folder = out_dir / subfolder if subfolder else out_dir
    if is_complete(folder):
        return folder
    where = f"{repo_id}/{subfolder}" if subfolder else repo_id
    with _hub_errors(repo_id, where, revision):
        from huggingface_hub import HfApi, snapshot_download

        api = HfApi(token=token)
        # One call without the client's retries (about 23 s of back-off when the Hub cannot
        # be reached), then the folder's listing: a wrong name fails before any download.
        api.model_info(repo_id, revision=revision or "main", timeout=30)
        tree = api.list_repo_tree(repo_id, path_in_repo=subfolder or None, revision=revision)
        names = {entry.path.rsplit("/", 1)[-1] for entry in tree}
        if not names:
            raise DownloadError(f"The folder {where} does not exist or is empty.")
        if "genai_config.json" not in names:
            raise DownloadError(f"{where} has no genai_config.json, so it is not a model folder.")
        snapshot_download(
            repo_id,
            revision=revision,
            token=token,
            local_dir=out_dir,
            allow_patterns=[f"{subfolder}/*"] if subfolder else None,
            tqdm_class=None if progress else _silent_tqdm(),
        )
    if not is_complete(folder):
        raise DownloadError(f"The download of {where} into {folder} is incomplete; run it again.")
    return folder


def download_if_needed(settings: Settings) -> Path:
    """The folder to load. With MODEL_DOWNLOAD=1 and no complete model in MODEL_PATH, the
    model is downloaded into MODEL_PATH/<MODEL_SUBFOLDER> (this module's layout: on the next
    start it is found there and not fetched again) and that folder is returned.

    Runs in the model worker, so the web process neither imports huggingface_hub nor spends
    its GIL on the transfer. Every failure is a ModelFolderError (one line for /readyz).
    """
    if not settings.model_download or is_complete(settings.model_path):
        return settings.model_path
    log.info(
        "downloading the model",
        extra={
            "fields": {
                "repo_id": settings.model_repo_id,
                "subfolder": settings.model_subfolder,
                "into": str(settings.model_path),
            }
        },
    )
    try:
        return download_model(
            repo_id=settings.model_repo_id,
            subfolder=settings.model_subfolder,
            out_dir=settings.model_path,
            progress=False,
        )
    except Exception as exc:
        raise ModelFolderError(
            f"MODEL_DOWNLOAD=1 but the download failed: {first_line(exc)} "
            "Alternatively, mount the model folder at MODEL_PATH and set MODEL_DOWNLOAD=0."
        ) from exc


@contextmanager
def _hub_errors(repo_id: str, where: str, revision: str | None) -> Iterator[None]:
    """Turn the Hub client's exceptions into one-sentence DownloadErrors."""
    import httpx2
    from huggingface_hub import constants, errors

    revision = revision or "main"
    try:
        yield
    except errors.GatedRepoError as e:
        raise DownloadError(
            f"{repo_id} is gated: accept its terms on the Hub and set HF_TOKEN."
        ) from e
    except errors.RepositoryNotFoundError as e:
        raise DownloadError(
            f"The repository {repo_id} does not exist or is private (set HF_TOKEN)."
        ) from e
    except errors.RevisionNotFoundError as e:
        raise DownloadError(f"The revision {revision!r} does not exist in {repo_id}.") from e
    except errors.EntryNotFoundError as e:
        raise DownloadError(f"The folder {where} does not exist at revision {revision!r}.") from e
    except (errors.OfflineModeIsEnabled, httpx2.TransportError) as e:
        raise DownloadError(
            f"Cannot reach the Hugging Face Hub at {constants.ENDPOINT} to download {where} "
            "(no network, or HF_HUB_OFFLINE is set)."
        ) from e
    except errors.HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "unknown"
        raise DownloadError(f"The Hub answered HTTP {status} while fetching {where}.") from e
    except OSError as e:
        raise DownloadError(f"Could not write the model files: {e.strerror or e}.") from e


def _silent_tqdm() -> Any:
    from huggingface_hub.utils import tqdm

    class Silent(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "disable": True})

    return Silent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Download an onnxruntime-genai model folder from the Hugging Face Hub (by "
        "default Phi-3-mini-4k-instruct int4 CPU, about 2.7 GB). Resumes an interrupted "
        "download; does nothing when the folder is already complete. Honours HF_TOKEN, HF_HOME "
        "and HF_ENDPOINT."
    )
    p.add_argument(
        "--model",
        choices=list(catalog.ENTRIES),
        metavar="NAME",
        help=f"a catalog model (--list shows them; default {catalog.DEFAULT.name}); "
        "--repo-id, --subfolder and --revision override its parts",
    )
    p.add_argument("--list", action="store_true", help="print the catalog and exit")
    p.add_argument("--out", type=Path, help="download into this folder (default: models/<folder>)")
    p.add_argument("--repo-id", help="Hub repository (owner/name)")
    p.add_argument("--subfolder", help="folder of the repo with genai_config.json")
    p.add_argument("--revision", help="branch, tag or commit to pin (default: main)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    entry = catalog.ENTRIES[args.model] if args.model else catalog.DEFAULT
    args.repo_id = args.repo_id or entry.repo_id
    args.subfolder = entry.subfolder if args.subfolder is None else args.subfolder
    args.out = args.out or Path("models") / entry.folder
    if args.revision is None and args.model and entry.revision != "main":
        args.revision = entry.revision
    if args.repo_id.count("/") != 1 or not all(args.repo_id.split("/")):
        p.error(f"--repo-id must look like owner/name, not {args.repo_id!r}")
    return args


def catalog_table() -> str:
    """`--list`: one line per catalog model."""
    rows = [("NAME", "DEVICE", "INPUT", "SIZE", "CONTEXT", "LICENCE", "REPOSITORY / FOLDER")]
    for e in catalog.ENTRIES.values():
        where = f"{e.repo_id}/{e.subfolder}" if e.subfolder else e.repo_id
        reads = "text+image" if e.images else "text"
        rows.append((e.name, e.device, reads, e.size_text, str(e.context_length), e.licence, where))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    ]
    return "\n".join(lines) + f"\n(default: {catalog.DEFAULT.name}; sizes 'about' are rounded)\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        sys.stdout.write(catalog_table())
        return 0
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
        sys.stderr.write(f"error: {e}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted; run the same command again to resume.\n")
        return 130
    sys.stdout.write(f"{folder}\n")
    return 0
