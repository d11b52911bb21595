"""Speech to text (issue 57): Whisper tiny.en's real-time factor through the sidecar's
`POST /v1/audio/transcriptions`, its word error rate, the same clips through faster-whisper
run bare in this process (its own WhisperModel on the same folder and options) for the time
ratio, and a chat's decode rate while a 60 s clip is transcribed against alone.

    python -m scripts.bench speech                          # 3 clips of ~30 s, tiny chat model
    python -m scripts.bench speech --model smollm2 --clips 5
    python -m scripts.bench speech --clips 1 --clip-seconds 8 --long-seconds 15 --chats 1

The clips: sentences of the Python FAQ (/usr/share/doc/python3.11/html/faq/*.html, Debian's
python3.11-doc) spoken by espeak-ng, about --clip-seconds each; the word error rate compares
each transcript with the sentences spoken, both lower-cased without punctuation. Each clip is
transcribed once to warm up, then --reps times: the median. Bare faster-whisper uses the
sidecar's own defaults (int8, beam 1, SPEECH_THREADS: all CPUs) and runs while the sidecar is
idle. The chat: greedy, --chat-tokens new tokens, its decode rate from the sidecar's log line,
alone and started just after a --long-seconds clip's transcription (target: 0.7x or better).
"""

from __future__ import annotations

import argparse
import html
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
import wave
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.common import REPO, Failed, ensure_model
from scripts.run import services

FAQ = Path("/usr/share/doc/python3.11/html/faq")
WHISPER = REPO / "build" / "real-models" / "whisper-tiny-en"
WORDS_PER_SECOND = 2.6  # espeak-ng's default rate (175 words a minute), roughly


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="chat model folder, or smollm2 (default: --preset)")
    parser.add_argument("--preset", default="tiny", help="generated chat model (default tiny)")
    parser.add_argument("--whisper", default=str(WHISPER), help="the speech model's folder")
    parser.add_argument("--clips", type=int, default=3, help="clips of FAQ sentences")
    parser.add_argument("--clip-seconds", type=float, default=30.0)
    parser.add_argument("--long-seconds", type=float, default=60.0, help="the clip beside chat")
    parser.add_argument("--reps", type=int, default=3, help="timed transcriptions per clip")
    parser.add_argument("--chat-tokens", type=int, default=128)
    parser.add_argument("--chats", type=int, default=3, help="chats alone and beside, each")
    parser.add_argument("--skip-bare", action="store_true", help="no bare faster-whisper run")


def faq_sentences() -> list[str]:
    """The FAQ's prose sentences of 6 to 30 plain words, in page order."""
    pages = sorted(FAQ.glob("*.html"))
    if not pages:
        raise Failed(f"no Python FAQ at {FAQ} (apt-get install python3.11-doc)")
    sentences: list[str] = []
    for page in pages:
        for paragraph in re.findall(r"<p>(.*?)</p>", page.read_text(), flags=re.S):
            text = html.unescape(re.sub(r"<[^>]+>", "", paragraph))
            for sentence in re.split(r"(?<=[.?!])\s+", " ".join(text.split())):
                plain = re.fullmatch(r"[A-Za-z][A-Za-z ,;'-]*[.?!]", sentence)
                if plain and 6 <= len(sentence.split()) <= 30:
                    sentences.append(sentence)
    return sentences


def speak(sentences: list[str], out: Path) -> tuple[str, float]:
    """espeak-ng's wav of the sentences: (what was said, its seconds)."""
    text = " ".join(sentences)
    subprocess.run(["espeak-ng", "-w", str(out), text], check=True, capture_output=True)
    with wave.open(str(out)) as clip:
        return text, clip.getnframes() / clip.getframerate()


def make_clips(sentences: list[str], count: int, seconds: float, scratch: Path) -> list[Any]:
    clips = []
    words = int(seconds * WORDS_PER_SECOND)
    position = 0
    for number in range(count):
        chosen: list[str] = []
        while sum(len(s.split()) for s in chosen) < words:
            chosen.append(sentences[position % len(sentences)])
            position += 1
        path = scratch / f"clip-{number}-{int(seconds)}s.wav"
        text, duration = speak(chosen, path)
        clips.append({"path": path, "text": text, "seconds": duration})
    return clips


def normal_words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()


def word_errors(reference: str, heard: str) -> tuple[int, int]:
    """(word edits, reference words): the Levenshtein distance over words."""
    ref, hyp = normal_words(reference), normal_words(heard)
    row = list(range(len(hyp) + 1))
    for i, word in enumerate(ref, 1):
        previous, row[0] = row[0], i
        for j, other in enumerate(hyp, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (word != other))
    return row[-1], len(ref)


def over_http(url: str, path: Path) -> tuple[float, str]:
    data = path.read_bytes()
    start = time.perf_counter()
    reply = httpx.post(
        url + "/v1/audio/transcriptions",
        files={"file": (path.name, data, "audio/wav")},
        data={"model": "whisper-1"},
        timeout=600,
    )
    elapsed = time.perf_counter() - start
    if reply.status_code != 200:
        raise Failed(f"transcription answered {reply.status_code}: {reply.text[:300]}")
    return elapsed, str(reply.json()["text"])


def bare(folder: Path, clips: list[dict[str, Any]], reps: int) -> list[float]:
    """faster-whisper in this process on the same folder and options: each clip's median s."""
    import os

    from faster_whisper import WhisperModel

    model = WhisperModel(
        str(folder), device="cpu", compute_type="int8", cpu_threads=os.cpu_count() or 1
    )

    def run(path: Path) -> float:
        start = time.perf_counter()
        segments, _ = model.transcribe(str(path), beam_size=1, language="en")
        "".join(segment.text for segment in segments)  # the work happens as they are read
        return time.perf_counter() - start

    times = []
    for clip in clips:
        run(clip["path"])  # warm
        times.append(statistics.median(run(clip["path"]) for _ in range(reps)))
    return times


def chat_rate(service: services.Service, tokens: int) -> float:
    """One greedy chat's decode tokens a second, from the sidecar's log line."""
    rid = uuid.uuid4().hex[:16]
    body = {
        "messages": [{"role": "user", "content": "Tell me about rivers and the sea."}],
        "max_tokens": tokens,
        "stream": True,
    }
    with httpx.stream(
        "POST",
        service.url + "/v1/chat/completions",
        json=body,
        headers={"X-Request-Id": rid},
        timeout=600,
    ) as reply:
        for _ in reply.iter_raw():
            pass
    return float(services.request_line(service, rid).get("tokens_per_s") or 0.0)


def beside(service: services.Service, long_clip: Path, args: argparse.Namespace) -> list[float]:
    """Chats started just after a long clip's transcription, each with its own clip."""
    rates = []
    for _ in range(args.chats):
        worker = threading.Thread(target=over_http, args=(service.url, long_clip))
        worker.start()
        time.sleep(0.3)  # the clip is decoded and its transcription under way
        rates.append(chat_rate(service, args.chat_tokens))
        worker.join()
    return rates


def main(args: argparse.Namespace) -> dict[str, Any]:
    if shutil.which("espeak-ng") is None:
        raise Failed("espeak-ng is needed to speak the clips (apt-get install espeak-ng)")
    folder = Path(args.whisper)
    if folder == WHISPER and not (folder / "model.bin").exists():
        make = ["python", "-m", "scripts.models.make_real_model", "--model", "whisper-tiny-en"]
        subprocess.run([*make, "--out", str(folder)], check=True, cwd=REPO)
    result: dict[str, Any] = {"whisper": str(folder)}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        chat_model = ensure_model(args, scratch)
        result["chat_model"] = str(chat_model)
        sentences = faq_sentences()
        clips = make_clips(sentences, args.clips, args.clip_seconds, scratch)
        long_clip = make_clips(sentences[::-1], 1, args.long_seconds, scratch)[0]
        log = scratch / "sidecar.log"
        with services.sidecar(
            chat_model,
            log,
            SPEECH_MODEL_PATH=str(folder),
            SPEECH_MAX_SECONDS=str(int(max(args.long_seconds, args.clip_seconds) * 2)),
        ) as service:
            services.wait_for_speech(service)
            rows = []
            for clip in clips:
                over_http(service.url, clip["path"])  # warm
                runs = [over_http(service.url, clip["path"]) for _ in range(args.reps)]
                seconds = statistics.median(r[0] for r in runs)
                edits, words = word_errors(clip["text"], runs[0][1])
                rows.append(
                    {
                        "audio_s": round(clip["seconds"], 2),
                        "route_s": round(seconds, 3),
                        "rtf": round(seconds / clip["seconds"], 4),
                        "word_edits": edits,
                        "words": words,
                    }
                )
            result["clips"] = rows
            alone = [chat_rate(service, args.chat_tokens) for _ in range(args.chats)]
            with_speech = beside(service, long_clip["path"], args)
            result["chat"] = {
                "long_clip_s": round(long_clip["seconds"], 2),
                "alone_tok_s": statistics.median(alone),
                "beside_tok_s": statistics.median(with_speech),
            }
            result["chat"]["ratio"] = round(
                result["chat"]["beside_tok_s"] / max(result["chat"]["alone_tok_s"], 1e-9), 3
            )
        if not args.skip_bare:  # the sidecar stopped: the bare run has the machine
            for row, seconds in zip(rows, bare(folder, clips, args.reps), strict=True):
                row["bare_s"] = round(seconds, 3)
                row["route_over_bare"] = round(row["route_s"] / seconds, 3)
    edits = sum(row["word_edits"] for row in result["clips"])
    words = sum(row["words"] for row in result["clips"])
    result["wer"] = round(edits / max(words, 1), 4)
    print_tables(result)
    return result


def print_tables(result: dict[str, Any]) -> None:
    print("\nSpeech to text: Whisper tiny.en through POST /v1/audio/transcriptions")
    print(
        f"{'clip':>4} {'audio s':>8} {'route s':>8} {'RTF':>7} {'bare s':>7} "
        f"{'route/bare':>10} {'WER':>6}"
    )
    for number, row in enumerate(result["clips"], 1):
        bare_s = f"{row['bare_s']:.3f}" if "bare_s" in row else "-"
        ratio = f"{row['route_over_bare']:.3f}" if "route_over_bare" in row else "-"
        wer = row["word_edits"] / max(row["words"], 1)
        print(
            f"{number:>4} {row['audio_s']:>8.1f} {row['route_s']:>8.3f} {row['rtf']:>7.4f} "
            f"{bare_s:>7} {ratio:>10} {wer:>6.3f}"
        )
    print(f"word error rate, all clips: {result['wer']:.3f} (target RTF <= 0.1, ratio <= 1.05)")
    chat = result["chat"]
    print(
        f"\nA chat's decode while a {chat['long_clip_s']:.0f} s clip is transcribed: "
        f"alone {chat['alone_tok_s']:.1f} tok/s, beside {chat['beside_tok_s']:.1f} tok/s, "
        f"ratio {chat['ratio']:.2f} (target >= 0.7)"
    )
