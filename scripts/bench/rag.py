"""Retrieval quality on the Python FAQ (scripts/bench/rag_faq.py): recall@1/3/5 and MRR@10 of
keyword search (SQLite FTS5, BM25), dense search (an OpenAI-compatible `/v1/embeddings`: our
sidecar with `EMBED_MODEL_PATH`, or Ollama, llama.cpp) and their reciprocal rank fusion, beside
the Open WebUI baseline of issue 44.

Each answer is one document, read as reStructuredText (its source format: reading/parse_rst.py)
and cut into passages by the app's own chunker (chatapp/documents/reading/chunker.py,
`--chunk-tokens` of the encoder's tokenizer, `--tokenizer`); a document's rank is its best
passage's. Runs in this process: the same parsers, chunker, query and fusion as the app, without
its database; with an encoder, the app's indexer is timed too (passages per second against bare
/v1/embeddings).

    python -m scripts.bench rag                                   # keyword only
    python -m scripts.bench rag --embeddings-url http://127.0.0.1:8000 --tokenizer DIR
"""

from __future__ import annotations

import argparse
import sqlite3
import threading
import time
from typing import Any

import numpy as np
import requests

from chatapp.documents.index.ranking import fts5_query, fuse
from chatapp.documents.reading.blocks import Block
from chatapp.documents.reading.chunker import chunk
from chatapp.documents.reading.parse_rst import parse_rst
from chatapp.documents.reading.tokens import counter_for
from scripts.bench.common import BadArguments
from scripts.bench.rag_baseline import recursive_split
from scripts.bench.rag_faq import Pair, faq_pairs, rank_of, score

BASELINE = {"recall_at_1": 0.769, "recall_at_3": None, "recall_at_5": 0.959, "mrr_at_10": 0.852}
DEPTH = 50  # passages each retriever returns before documents are ranked


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--embeddings-url",
        help="base URL of an OpenAI-compatible server with "
        "/v1/embeddings (dense and fusion are measured only with it)",
    )
    parser.add_argument("--embeddings-model", default="", help="the `model` field it wants")
    parser.add_argument(
        "--tokenizer",
        help="the encoder's folder (tokenizer.json) for passage "
        "sizes; without it, the app's safe byte bound",
    )
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--limit", type=int, help="only the first N pairs (a quick look)")


def main(args: argparse.Namespace) -> dict[str, Any]:
    pairs = faq_pairs()[: args.limit] if args.limit else faq_pairs()
    if not pairs:
        raise BadArguments("--limit leaves no pairs")
    counter = counter_for(args.tokenizer)
    passages: list[tuple[int, str]] = []  # (document, embedded text)
    for document, pair in enumerate(pairs):
        blocks = parse_rst(pair.answer.encode())
        for passage in chunk(blocks or [Block("text", pair.answer)], counter, args.chunk_tokens):
            passages.append((document, passage.embedded))
    rankings: dict[str, list[list[int]]] = {"keyword": _keyword(pairs, passages)}
    timings: dict[str, float] = {}
    baseline: list[int | None] = []  # Open WebUI's defaults, each question's rank
    if args.embeddings_url:
        began = time.perf_counter()
        rankings["dense"] = _dense(pairs, passages, args.embeddings_url, args.embeddings_model)
        timings["dense_seconds"] = round(time.perf_counter() - began, 1)
        timings.update(_indexing_rate(pairs, args))
        rankings["fusion"] = [
            [item for item, _ in fuse([k, d])]
            for k, d in zip(rankings["keyword"], rankings["dense"], strict=True)
        ]
        baseline = _baseline(pairs, args.embeddings_url, args.embeddings_model)
    results: dict[str, Any] = {}
    print(
        f"{len(pairs)} questions, {len(passages)} passages of at most {args.chunk_tokens} "
        f"tokens ({'tokenizer' if args.tokenizer else 'byte bound'})\n"
    )
    print("| retriever | recall@1 | recall@3 | recall@5 | MRR@10 |\n|---|---:|---:|---:|---:|")
    for name, ranked in rankings.items():
        documents = [[passages[i][0] for i in ranking] for ranking in ranked]
        scores = score([rank_of(q, docs) for q, docs in enumerate(documents)])
        results[name] = scores.__dict__
        print(
            f"| {name} | {scores.recall_at_1} | {scores.recall_at_3} | {scores.recall_at_5} | "
            f"{scores.mrr_at_10} |"
        )
    if args.embeddings_url:
        scores = score(baseline)
        results["open_webui_this_run"] = scores.__dict__
        print(
            f"| Open WebUI's defaults, this run (rag_baseline.py) | {scores.recall_at_1} | "
            f"{scores.recall_at_3} | {scores.recall_at_5} | {scores.mrr_at_10} |"
        )
    print(
        f"| Open WebUI, the issue's figures (measured elsewhere) | {BASELINE['recall_at_1']} | - | "
        f"{BASELINE['recall_at_5']} | {BASELINE['mrr_at_10']} |"
    )
    return {
        "pairs": len(pairs),
        "passages": len(passages),
        "chunk_tokens": args.chunk_tokens,
        "tokenizer": bool(args.tokenizer),
        "results": results,
        "baseline": BASELINE,
        **timings,
    }


def _indexing_rate(pairs: list[Pair], args: argparse.Namespace) -> dict[str, float]:
    """Passages per second: the bare /v1/embeddings rate (the passages in batches of 32), and
    the app's indexer end to end on a SQLite file (each answer a text file: stored, parsed,
    cut, embedded, written with its vectors and keywords). Issue 44 asks >= 0.8x."""
    import tempfile
    from pathlib import Path

    from chatapp.documents import library
    from chatapp.documents.embedder import Embedder
    from chatapp.documents.index.search_index import index_for
    from chatapp.documents.indexer.worker import QUICK_S, Indexer
    from chatapp.documents.reading.formats import Limits
    from chatapp.settings import DEFAULTS
    from chatapp.store import Store, migrate
    from chatapp.store.users import ensure_user

    counter = counter_for(args.tokenizer)
    texts = [
        passage.embedded
        for pair in pairs
        for passage in chunk(parse_rst(pair.answer.encode()), counter, args.chunk_tokens)
    ]
    began = time.perf_counter()
    Embedder(args.embeddings_url, model=args.embeddings_model).embed(texts)
    bare = len(texts) / (time.perf_counter() - began)
    store = Store.open(f"sqlite:///{Path(tempfile.mkdtemp()) / 'rag.db'}")
    migrate.upgrade(store.engine)
    with store.session(write=True) as session:
        owner = ensure_user(session, "bench").id
    limits = Limits(10_000_000, 1000)
    began = time.perf_counter()
    for number, pair in enumerate(pairs):
        library.add(store, owner, f"answer-{number}.rst", pair.answer.encode(), None, limits)
    # As the indexer process runs (chatapp/documents/__main__.py): DOCUMENT_INDEXER_THREADS
    # indexers, each with its own connection to the model service and its own reader
    # process, the last of them the quick lane.
    stop = threading.Event()
    count = DEFAULTS["DOCUMENT_INDEXER_THREADS"]
    threads = [
        threading.Thread(
            target=Indexer(
                store,
                index_for(store),
                Embedder(args.embeddings_url, model=args.embeddings_model),
                args.tokenizer,
                limits,
                args.chunk_tokens,
                quick_s=QUICK_S if count > 1 and n == count - 1 else None,
                poll_s=0.05,
            ).run,
            args=(stop,),
        )
        for n in range(count)
    ]
    for thread in threads:
        thread.start()
    while _unread(store):
        time.sleep(0.02)
    indexed = len(texts) / (time.perf_counter() - began)
    stop.set()
    for thread in threads:
        thread.join()
    store.close()
    print(
        f"indexing: {bare:,.1f} passages/s bare /v1/embeddings, {indexed:,.1f} through the "
        f"indexer ({indexed / bare:.2f}x)\n"
    )
    return {
        "embed_passages_per_s": round(bare, 1),
        "index_passages_per_s": round(indexed, 1),
        "index_vs_bare": round(indexed / bare, 3),
    }


def _unread(store: Any) -> int:
    """Documents not yet ready or failed."""
    from sqlalchemy import func, select

    from chatapp.documents.models import Document

    with store.session() as session:
        waiting = Document.status.in_(("queued", "reading"))
        return int(session.scalar(select(func.count()).where(waiting)) or 0)


def _keyword(pairs: list[Pair], passages: list[tuple[int, str]]) -> list[list[int]]:
    """Each question's passages (indexes) by BM25, as the SQLite engine ranks them."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE passages USING fts5(text, tokenize='porter unicode61')")
    db.executemany(
        "INSERT INTO passages(rowid, text) VALUES (?, ?)",
        [(i, text) for i, (_, text) in enumerate(passages)],
    )
    ranked = []
    for pair in pairs:
        query = fts5_query(pair.question)
        rows = (
            []
            if query is None
            else db.execute(
                "SELECT rowid FROM passages WHERE passages MATCH ? ORDER BY bm25(passages) LIMIT ?",
                (query, DEPTH),
            ).fetchall()
        )
        ranked.append([row[0] for row in rows])
    return ranked


def _dense(
    pairs: list[Pair], passages: list[tuple[int, str]], url: str, model: str
) -> list[list[int]]:
    vectors = _embed([text for _, text in passages], url, model)
    queries = _embed([pair.question for pair in pairs], url, model)
    similarities = queries @ vectors.T
    return [list(np.argsort(-row)[:DEPTH]) for row in similarities]


def _baseline(pairs: list[Pair], url: str, model: str) -> list[int | None]:
    """Each question's rank of its answer under Open WebUI's defaults (rag_baseline.py):
    1,000/100-character chunks of the raw answer, cut at the encoder's limit, best chunk."""
    chunks = [(d, text) for d, pair in enumerate(pairs) for text in recursive_split(pair.answer)]
    vectors = _embed([text for _, text in chunks], url, model, truncate=True)
    queries = _embed([pair.question for pair in pairs], url, model)
    ranks = []
    for q, row in enumerate(queries @ vectors.T):
        documents = [chunks[i][0] for i in np.argsort(-row)[:DEPTH]]
        ranks.append(rank_of(q, documents))
    return ranks


def _embed(
    texts: list[str], url: str, model: str, batch: int = 32, *, truncate: bool = False
) -> np.ndarray:
    """Unit vectors of `texts`; `truncate`: inputs over the encoder's limit are cut to it
    (vLLM's `truncate_prompt_tokens`, -1: the model's limit), as sentence-transformers does."""
    base = url.rstrip("/").removesuffix("/v1")
    out: list[list[float]] = []
    extra = {"truncate_prompt_tokens": -1} if truncate else {}
    with requests.Session() as session:
        for start in range(0, len(texts), batch):
            response = session.post(
                f"{base}/v1/embeddings",
                timeout=300,
                json={"input": texts[start : start + batch], "model": model, **extra},
            )
            response.raise_for_status()
            data = sorted(response.json()["data"], key=lambda item: item["index"])
            out.extend(item["embedding"] for item in data)
    matrix = np.asarray(out, dtype=np.float32)
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
