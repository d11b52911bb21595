"""Audio bytes to Whisper's input: 16 kHz mono float32 samples, decoded by PyAV (FFmpeg) within
the bounds the settings give.

The container is named from the file's first bytes (`sniff`) and handed to FFmpeg by name, so
FFmpeg never probes for a format: of its hundreds of demuxers only these few ever read a
client's bytes, and none that follows references to other files or URLs (HLS playlists,
concat lists). The length is counted in decoded samples, never taken from a header, and
decoding stops as soon as it passes the limit.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

RATE = 16_000  # Whisper's sample rate
# What browsers record (webm/opus, ogg/opus, mp4/aac) and people upload; FFmpeg's demuxer names.
KINDS = ("wav", "mp3", "ogg", "webm", "m4a", "flac", "aac")
_DEMUXER = {"webm": "matroska", "m4a": "mp4"}


class AudioError(Exception):
    """A refusal of the audio: `reason` is a key of web/errors.py's REFUSALS."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Audio:
    samples: np.ndarray  # float32, mono, RATE a second
    kind: str  # one of KINDS

    @property
    def seconds(self) -> float:
        return len(self.samples) / RATE


def sniff(data: bytes) -> str | None:
    """The container of `data` by its magic bytes (one of KINDS), or None."""
    head = data[:12]
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"\x1aE\xdf\xa3":
        return "webm"
    if head[:4] == b"fLaC":
        return "flac"
    if head[4:8] == b"ftyp":
        return "m4a"
    if head[:3] == b"ID3":
        return "mp3"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        # an MPEG audio frame; ADTS (AAC) has layer bits 00
        return "aac" if head[1] & 0x06 == 0 else "mp3"
    return None


def decode(data: bytes, max_seconds: float) -> Audio:
    """The audio of `data`, resampled to 16 kHz mono; AudioError: audio_empty, invalid_audio or
    audio_too_long."""
    if not data:
        raise AudioError("audio_empty", "the audio file is empty")
    kind = sniff(data)
    if kind is None:
        raise AudioError(
            "invalid_audio", f"the file is not audio this sidecar reads ({', '.join(KINDS)})"
        )
    import av
    import numpy as np

    limit = int(max_seconds * RATE)
    chunks: list[np.ndarray] = []
    count = 0
    try:
        with av.open(io.BytesIO(data), format=_DEMUXER.get(kind, kind), mode="r") as container:
            if not container.streams.audio:
                raise AudioError("invalid_audio", f"the {kind} file holds no audio stream")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunk = out.to_ndarray().reshape(-1)
                    count += len(chunk)
                    if count > limit:
                        raise AudioError(
                            "audio_too_long",
                            f"the audio is longer than SPEECH_MAX_SECONDS ({max_seconds:g} s)",
                        )
                    chunks.append(chunk)
    except av.error.FFmpegError:
        if not chunks:
            raise AudioError("invalid_audio", f"the {kind} file cannot be decoded") from None
        # a file cut off mid-frame: what was decoded stands, as browsers and players do
    if count == 0:
        raise AudioError("audio_empty", "the audio file holds no sound (no samples)")
    samples = np.concatenate(chunks).astype(np.float32, copy=False)
    return Audio(samples, kind)
