"""/v1/embeddings: agreement with PyTorch, throughput against PyTorch's encode, one query's
latency, and a chat beside an index run (its decode rate and a new chat's first token, alone
and beside), all through the real sidecar over HTTP.

    python -m scripts.bench embeddings                       # all-MiniLM-L6-v2, `small` chat
    python -m scripts.bench embeddings --encoder tiny --preset tiny --chunks 200   # its shape
    python -m scripts.bench embeddings --model smollm2 --nice 0,10

The encoder: `minilm` (built from its PyPI wheel, make_real_model: needs torch), `tiny` (the
generated one) or a folder. Chunks are ~250-token passages (--chunk-tokens), sent as an indexer
would, --request-inputs a request, one request at a time. PyTorch's reference is
sentence-transformers' `encode` done with transformers (realmodel/encoder.py's torch_vectors:
the same tokenizer, pooling and normalisation), batches of 32, on as many threads as the
sidecar's CPU budget. The chat: greedy, --chat-tokens new tokens, its rate and TTFT read from
the sidecar's log line; "beside" runs the chats while an index run of --chunks chunks goes on,
once per --nice value (EMBED_NICE).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.common import REPO, Failed, ensure_model
from scripts.models.realmodel.sources import ALL_MINILM_L6_V2
from scripts.run import services

WORK = REPO / "build" / "real-models"
TOPICS = (
    "rivers carry water from the mountains to the sea and shape the valleys they cross",
    "the committee met on tuesday to review the budget for the coming financial year",
    "a good sourdough needs a lively starter, patience and a very hot oven",
    "the telescope recorded faint light from galaxies formed billions of years ago",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--encoder", default="minilm", help="minilm, tiny or a folder")
    parser.add_argument("--model", help="chat model folder, or smollm2 (default: --preset)")
    parser.add_argument("--preset", default="small", help="generated chat model (default small)")
    parser.add_argument("--chunks", type=int, default=2000, help="the index run's chunks")
    parser.add_argument("--throughput-chunks", type=int, default=256)
    parser.add_argument("--chunk-tokens", type=int, default=250)
    parser.add_argument("--request-inputs", type=int, default=64)
    parser.add_argument("--chat-tokens", type=int, default=128)
    parser.add_argument("--chats", type=int, default=3, help="chats alone and beside, each")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--nice", default="10", help="EMBED_NICE values, comma-separated")
    parser.add_argument("--skip-torch", action="store_true", help="no PyTorch reference")


def encoder_folder(name: str, scratch: Path) -> tuple[Path, Path | None]:
    """The encoder folder and, for the real one, its sentence-transformers folder."""
    if name == "minilm":
        out = WORK / ALL_MINILM_L6_V2.name
        make = [sys.executable, "-m", "scripts.models.make_real_model"]
        subprocess.run([*make, "--model", ALL_MINILM_L6_V2.name, "--out", str(out)], check=True)
        return out, WORK / f"{ALL_MINILM_L6_V2.name}-st"
    if name == "tiny":
        out = scratch / "tiny-encoder"
        make = [sys.executable, "-m", "scripts.models.make_encoder", "--out", str(out)]
        subprocess.run([*make, "--max-tokens", "256"], check=True, capture_output=True)
        return out, None
    return Path(name), None


def make_chunks(folder: Path, count: int, tokens: int) -> list[str]:
    """`count` distinct passages of about `tokens` tokens each by the encoder's tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    chunks = []
    for n in range(count):
        text = f"passage {n}:"
        while len(tokenizer.encode(text).ids) < tokens - 12:
            text += " " + TOPICS[(n + len(text)) % len(TOPICS)] + "."
        chunks.append(text)
    return chunks


def index(
    url: str, chunks: list[str], per_request: int, stop: threading.Event | None = None
) -> float:
    """Send the chunks as an indexer does; chunks a second."""
    began = time.perf_counter()
    sent = 0
    with httpx.Client(timeout=600) as client:
        for start in range(0, len(chunks), per_request):
            if stop is not None and stop.is_set():
                break
            part = chunks[start : start + per_request]
            reply = client.post(url + "/v1/embeddings", json={"input": part})
            if reply.status_code != 200:
                raise Failed(f"/v1/embeddings answered {reply.status_code}: {reply.text[:200]}")
            sent += len(part)
    return sent / (time.perf_counter() - began)


def chat(service: services.Service, tokens: int) -> tuple[float, float]:
    """One greedy chat: (decode tokens a second, TTFT ms) from the sidecar's log line."""
    rid = uuid.uuid4().hex[:16]
    body = {
        "messages": [{"role": "user", "content": "Tell me about rivers and the sea."}],
        "max_tokens": tokens,
        "stream": True,
    }
    headers = {"X-Request-Id": rid}
    with httpx.stream(
        "POST", service.url + "/v1/chat/completions", json=body, headers=headers, timeout=600
    ) as reply:
        for _ in reply.iter_raw():
            pass
    line = services.request_line(service, rid)
    return float(line.get("tokens_per_s") or 0.0), float(line.get("ttft_ms") or 0.0)


def query_latency(url: str, count: int) -> list[float]:
    query = "which rivers carry water from the mountains to the sea"  # 10 words
    times = []
    with httpx.Client(timeout=60) as client:
        for _ in range(count):
            began = time.perf_counter()
            client.post(url + "/v1/embeddings", json={"input": query}).raise_for_status()
            times.append((time.perf_counter() - began) * 1000)
    return times


def torch_rate(st: Path, chunks: list[str]) -> float:
    from scripts.models.realmodel.encoder import torch_vectors
    from sidecar.model.cpus import cpu_budget

    threads = cpu_budget().count
    torch_vectors(st, chunks[:2], threads)  # load and warm up
    began = time.perf_counter()
    for start in range(0, len(chunks), 32):
        torch_vectors(st, chunks[start : start + 32], threads)
    return len(chunks) / (time.perf_counter() - began)


def agreement(url: str, st: Path, chunks: list[str]) -> tuple[float, float]:
    import numpy as np

    from scripts.models.realmodel.encoder import torch_vectors

    got = np.array(
        [d["embedding"] for d in httpx.post(url + "/v1/embeddings", json={"input": chunks},
                                             timeout=600).json()["data"]],
        dtype=np.float32,
    )  # fmt: skip
    ref = torch_vectors(st, chunks)
    cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    return float(cos.min()), float(cos.mean())


def beside(
    service: services.Service, chunks: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """Chats while an index run goes on (it is stopped once they are done)."""
    stop = threading.Event()
    rate: list[float] = []
    indexer = threading.Thread(
        target=lambda: rate.append(index(service.url, chunks, args.request_inputs, stop)),
        daemon=True,
    )
    indexer.start()
    time.sleep(2.0)  # the index run is going
    runs = [chat(service, args.chat_tokens) for _ in range(args.chats)]
    stop.set()
    indexer.join()
    return {
        "decode_tok_s": statistics.median(r[0] for r in runs),
        "ttft_ms": statistics.median(r[1] for r in runs),
        "index_chunks_s": rate[0] if rate else 0.0,
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        folder, st = encoder_folder(args.encoder, scratch)
        chat_model = ensure_model(args, scratch)
        chunks = make_chunks(folder, max(args.chunks, args.throughput_chunks), args.chunk_tokens)
        nices = [int(n) for n in args.nice.split(",")]
        result |= {"encoder": str(folder), "chat_model": str(chat_model), "runs": {}}
        for nice in nices:
            log = scratch / f"sidecar-{nice}.log"
            with services.sidecar(
                chat_model, log, EMBED_MODEL_PATH=str(folder), EMBED_NICE=str(nice)
            ) as service:
                services.wait_for_embeddings(service)
                run: dict[str, Any] = {}
                if nice == nices[0]:
                    if st is not None and not args.skip_torch:
                        low, mean = agreement(service.url, st, chunks[:64])
                        run |= {"cosine_min": low, "cosine_mean": mean}
                    index(service.url, chunks[:64], args.request_inputs)  # warm up
                    part = chunks[: args.throughput_chunks]
                    run["http_chunks_s"] = index(service.url, part, args.request_inputs)
                    if st is not None and not args.skip_torch:
                        run["torch_chunks_s"] = torch_rate(st, part)
                    times = query_latency(service.url, args.queries)
                    run["query_ms_p50"] = statistics.median(times)
                    run["query_ms_p90"] = statistics.quantiles(times, n=10)[-1]
                alone = [chat(service, args.chat_tokens) for _ in range(args.chats)]
                run["alone"] = {
                    "decode_tok_s": statistics.median(r[0] for r in alone),
                    "ttft_ms": statistics.median(r[1] for r in alone),
                }
                run["beside"] = beside(service, chunks[: args.chunks], args)
                result["runs"][str(nice)] = run
    print_tables(result)
    return result


def print_tables(result: dict[str, Any]) -> None:
    runs = result["runs"]
    first = next(iter(runs.values()))
    print(f"encoder {result['encoder']}, chat model {result['chat_model']}\n")
    print("| measure | value | target |")
    print("|---|---:|---|")
    if "cosine_min" in first:
        print(
            f"| agreement with PyTorch, cosine min / mean (64 chunks) | "
            f"{first['cosine_min']:.6f} / {first['cosine_mean']:.6f} | >= 0.9999 |"
        )
    http = first["http_chunks_s"]
    print(f"| /v1/embeddings, ~250-token chunks a second | {http:.1f} | |")
    if "torch_chunks_s" in first:
        torch = first["torch_chunks_s"]
        print(f"| PyTorch encode, chunks a second | {torch:.1f} | |")
        print(f"| throughput, HTTP / PyTorch | {http / torch:.2f}x | >= 2x |")
    print(
        f"| one 10-word query, median / p90 (ms) | {first['query_ms_p50']:.1f} / "
        f"{first['query_ms_p90']:.1f} | median <= 50 ms |\n"
    )
    print(
        "| EMBED_NICE | chat decode alone (tok/s) | beside an index run | ratio | TTFT alone "
        "(ms) | beside | ratio | index run beside the chats (chunks/s) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for nice, run in runs.items():
        a, b = run["alone"], run["beside"]
        decode = b["decode_tok_s"] / a["decode_tok_s"] if a["decode_tok_s"] else 0.0
        ttft = b["ttft_ms"] / a["ttft_ms"] if a["ttft_ms"] else 0.0
        print(
            f"| {nice} | {a['decode_tok_s']:.1f} | {b['decode_tok_s']:.1f} | {decode:.2f} | "
            f"{a['ttft_ms']:.0f} | {b['ttft_ms']:.0f} | {ttft:.2f} | "
            f"{b['index_chunks_s']:.1f} |"
        )
    print("\ntargets: decode beside >= 0.5x alone; TTFT beside <= 2x alone")
