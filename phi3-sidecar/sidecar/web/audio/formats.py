"""A transcript in each of OpenAI's response formats: json, text, srt, verbose_json, vtt."""

from __future__ import annotations

import json
import math

from fastapi import Response

from sidecar.speech.transcriber import Transcript

FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
# verbose_json names the language in words, as OpenAI does; Whisper's .en models are English.
LANGUAGES = {"en": "english", "fr": "french", "de": "german", "es": "spanish", "it": "italian"}


def usage(transcript: Transcript) -> dict[str, object]:
    """OpenAI's usage of a transcription billed by duration: whole seconds, rounded up."""
    return {"type": "duration", "seconds": math.ceil(transcript.seconds)}


def render(transcript: Transcript, response_format: str, words: bool) -> Response:
    if response_format == "text":
        return Response(transcript.text, media_type="text/plain; charset=utf-8")
    if response_format == "srt":
        return Response(_cues(transcript, ","), media_type="text/plain; charset=utf-8")
    if response_format == "vtt":
        return Response("WEBVTT\n\n" + _cues(transcript, "."), media_type="text/vtt")
    body: dict[str, object] = {"text": transcript.text, "usage": usage(transcript)}
    if response_format == "verbose_json":
        body = {
            "task": "transcribe",
            "language": LANGUAGES.get(transcript.language, transcript.language),
            "duration": round(transcript.seconds, 2),
            "text": transcript.text,
            "segments": [
                {
                    "id": s.id,
                    "seek": int(s.start * 100),
                    "start": s.start,
                    "end": s.end,
                    "text": s.text,
                    "tokens": list(s.tokens),
                    "temperature": s.temperature,
                    "avg_logprob": s.avg_logprob,
                    "compression_ratio": s.compression_ratio,
                    "no_speech_prob": s.no_speech_prob,
                }
                for s in transcript.segments
            ],
            "usage": usage(transcript),
        }
        if words:
            body["words"] = [
                {"word": w, "start": start, "end": end}
                for s in transcript.segments
                for w, start, end in s.words
            ]
    return Response(json.dumps(body, ensure_ascii=False), media_type="application/json")


def _cues(transcript: Transcript, comma: str) -> str:
    """SubRip's numbered cues (`comma` ","), or WebVTT's (".", numbers as cue names too)."""
    return "".join(
        f"{n}\n{_time(s.start, comma)} --> {_time(s.end, comma)}\n{s.text.strip()}\n\n"
        for n, s in enumerate(transcript.segments, start=1)
    )


def _time(seconds: float, comma: str) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{comma}{millis:03d}"
