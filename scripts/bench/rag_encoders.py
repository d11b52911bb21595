"""rag's real encoders (`--encoder`): each built when it is not yet (scripts/models/
make_real_model.py, into build/real-models) and served by a sidecar of the run's own, the tiny
generated chat model beside it; and, for several, one table comparing their dense search per
set (recall@5 and MRR@10, the first encoder's and each other's difference from it in points)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.bench.common import REPO


@dataclass(frozen=True)
class RealEncoder:
    model: str  # make_real_model's --model
    folder: str  # the folder it is built into, under build/real-models: the sidecar's name


ENCODERS = {
    "minilm": RealEncoder("all-minilm-l6-v2", "all-minilm-l6-v2"),
    "multilingual": RealEncoder("multilingual", "multilingual-e5-small"),
}
COMPARED = ("hybrid", "dense", "fusion")  # the methods whose scores depend on the encoder


@contextlib.contextmanager
def encoder_sidecar(name: str) -> Iterator[str]:
    """A sidecar serving the real encoder `name` (built first if it is not); its URL."""
    from scripts.run import services

    work = REPO / "build" / "real-models"
    encoder = ENCODERS[name]
    folder = work / encoder.folder
    make = [sys.executable, "-m", "scripts.models.make_real_model", "--model", encoder.model]
    subprocess.run([*make, "--out", str(folder), "--work-dir", str(work)], check=True)
    with tempfile.TemporaryDirectory() as scratch:
        chat = Path(scratch) / "tiny"
        make = [sys.executable, "-m", "scripts.models.make_model", "--preset", "tiny"]
        subprocess.run([*make, "--out", str(chat)], check=True, capture_output=True)
        log = Path(scratch) / "sidecar.log"
        with services.sidecar(chat, log, EMBED_MODEL_PATH=str(folder)) as sidecar:
            services.wait_for_embeddings(sidecar, timeout=600)
            yield sidecar.url


def comparison(runs: dict[str, dict[str, Any]]) -> str:
    """A Markdown table: per set and method, each encoder's recall@5 and MRR@10, and the
    others' against the first's in points."""
    first, *others = runs
    head = f"| set | search | {first} recall@5, MRR@10 | "
    head += " | ".join(f"{name} recall@5, MRR@10 (against {first})" for name in others) + " |"
    lines = [head, "|---|---|" + "---|" * len(runs)]
    for set_name, measured in runs[first]["sets"].items():
        for method in COMPARED:
            base = measured["scores"].get(method)
            if base is None:
                continue
            cells = [f"{base['recall_at_5']:.3f}, {base['mrr_at_10']:.3f}"]
            for name in others:
                theirs = runs[name]["sets"].get(set_name, {}).get("scores", {}).get(method)
                if theirs is None:
                    cells.append("-")
                    continue
                recall = 100 * (theirs["recall_at_5"] - base["recall_at_5"])
                mrr = 100 * (theirs["mrr_at_10"] - base["mrr_at_10"])
                cells.append(
                    f"{theirs['recall_at_5']:.3f}, {theirs['mrr_at_10']:.3f} "
                    f"({recall:+.1f}, {mrr:+.1f})"
                )
            lines.append(f"| {set_name} | {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
