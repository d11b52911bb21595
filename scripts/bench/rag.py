"""Retrieval quality on a suite of sets (scripts/bench/rag_sets.py: the Python FAQ, Git's FAQ,
Debian package descriptions, manual pages in English, German, French and Spanish): recall@1/5
and MRR@10 of keyword search (SQLite FTS5, BM25, each text stemmed in its own language, and
FTS5's English Porter stemming as before issue 55 beside it), dense search (an OpenAI-compatible
`/v1/embeddings`: our sidecar with `EMBED_MODEL_PATH`, or Ollama, llama.cpp) and both
together (hybrid, the app's default: relative score fusion, ranking.blend with the app's
keyword weight; fusion: reciprocal rank fusion), with Open WebUI's defaults (rag_baseline.py)
beside them in the same run, on the same questions and encoder. One table, a row per set and
method.

Each document is read by the app's own parsers as the file it would be uploaded as (a FAQ
answer as reStructuredText, the others as text) and cut into passages by the app's chunker,
sized as the app sizes them with no EMBED_TOKENIZER (documents/sizing.py: the encoder's
tokenizer from the model service, else the byte bound, said on the first line); a document's
rank is its best passage's. Runs in this process: the same parsers, chunker, query and fusion
as the app, without its database. `--indexing`: the app's indexer on the Python FAQ is timed
too (passages per second against bare /v1/embeddings).

`--encoder minilm|multilingual` builds that real encoder when it is not built yet
(scripts/models/make_real_model.py, into build/real-models) and runs it on a sidecar of this
run's own (the tiny generated chat model beside it) instead of `--embeddings-url`;
`--encoder minilm,multilingual` runs the suite on each in turn and compares them
(rag_encoders.py). As the app does with its sidecar, passages go with `input_type: "passage"`
and questions with "query", so an encoder with prompts (the multilingual e5's "passage: ",
"query: ") reads them as trained, and each has the room its prompt leaves it;
`--no-input-type` sends neither, as the app with UPSTREAM_API=openai. Open WebUI's defaults
write no prompt: its row never has one.

    python -m scripts.bench rag                                    # keyword only
    python -m scripts.bench rag --embeddings-url http://127.0.0.1:8000
    python -m scripts.bench rag --embeddings-url URL --sets python-faq,man-de --limit 100
    python -m scripts.bench rag --encoder minilm,multilingual --sets man-de,man-fr,man-es
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import requests

from chatapp.documents.index.ranking import blend, fts5_query, fuse
from chatapp.documents.language import document_language, keywords, question_languages
from chatapp.documents.reading.blocks import Block, Refused
from chatapp.documents.reading.chunker import chunk, cut
from chatapp.documents.reading.formats import Limits, read
from chatapp.documents.sizing import PassageSizing
from chatapp.settings import DEFAULTS
from scripts.bench.common import BadArguments
from scripts.bench.rag_baseline import recursive_split
from scripts.bench.rag_encoders import ENCODERS, comparison, encoder_sidecar
from scripts.bench.rag_faq import rank_of, score
from scripts.bench.rag_sets import SETS, Case, EvalSet, build

DEPTH = 50  # passages each retriever returns before documents are ranked
LIMITS = Limits(10_000_000, 1000)
OPEN_WEBUI = "Open WebUI's defaults"
PORTER = "keyword, English stemming (before issue 55)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--embeddings-url",
        help="base URL of an OpenAI-compatible server with "
        "/v1/embeddings (hybrid, dense, fusion and Open WebUI's are measured only with it)",
    )
    parser.add_argument("--embeddings-model", default="", help="the `model` field it wants")
    parser.add_argument(
        "--encoder",
        help=f"instead of --embeddings-url: real encoders ({', '.join(ENCODERS)}; several, "
        "comma-separated, are run one after the other and compared), each built if missing and "
        "served by a sidecar of this run's own",
    )
    parser.add_argument(
        "--no-input-type",
        action="store_true",
        help="send no input_type (as the app with UPSTREAM_API=openai): no encoder prompts",
    )
    parser.add_argument(
        "--tokenizer",
        help="the encoder's folder (tokenizer.json), as EMBED_TOKENIZER; without it, what the "
        "app does: the model service's tokenizer, else the safe byte bound",
    )
    parser.add_argument("--chunk-tokens", type=int, default=256, help="EMBED_MAX_TOKENS")
    parser.add_argument(
        "--sets", default=",".join(SETS), help=f"comma-separated, of: {', '.join(SETS)}"
    )
    parser.add_argument("--limit", type=int, default=300, help="at most N questions a set")
    parser.add_argument(
        "--indexing", action="store_true", help="also time the app's indexer on the Python FAQ"
    )


def main(args: argparse.Namespace) -> dict[str, Any]:
    names = [name.strip() for name in args.sets.split(",") if name.strip()]
    unknown = [name for name in names if name not in SETS]
    if unknown or not names:
        raise BadArguments(f"--sets: unknown {', '.join(unknown) or '(none)'}")
    if args.limit < 1:
        raise BadArguments("--limit must be at least 1")
    if args.encoder and args.embeddings_url:
        raise BadArguments("--encoder runs its own sidecar: leave --embeddings-url out")
    if not args.encoder:
        return run(names, args)
    encoders = [name.strip() for name in args.encoder.split(",") if name.strip()]
    if not encoders or any(name not in ENCODERS for name in encoders):
        raise BadArguments(f"--encoder: one or more of {', '.join(ENCODERS)}")
    runs: dict[str, dict[str, Any]] = {}
    for name in encoders:
        print(f"\n## {ENCODERS[name].folder}")
        with encoder_sidecar(name) as url:
            args.embeddings_url = url
            runs[ENCODERS[name].folder] = run(names, args)
        args.embeddings_url = None
    if len(runs) > 1:
        print("\n" + comparison(runs))
    return {"encoders": runs}


def run(names: list[str], args: argparse.Namespace) -> dict[str, Any]:
    sizing = PassageSizing(
        max_tokens=args.chunk_tokens,
        tokenizer=args.tokenizer,
        base_url=args.embeddings_url,
        model=args.embeddings_model,
        folder=Path(tempfile.mkdtemp(prefix="rag-tokenizer-")),
        prompted=not args.no_input_type,
    )
    measure = sizing.current()
    why = f" ({measure.reason})" if measure.reason else ""
    prompts = f", prompts' tokens {measure.prompt_tokens}" if measure.prompt_tokens else ""
    print(
        f"passages of at most {measure.max_tokens} tokens, counted by {measure.counted_by}"
        f"{why}{prompts}"
    )
    results: dict[str, Any] = {}
    rows: list[str] = []
    for built in build(names, args.limit):
        if isinstance(built, str):
            print(built)
            continue
        results[built.name] = evaluate(built, sizing, args)
        rows.extend(_rows(built, results[built.name]))
    print(
        "\n| set | language | documents | questions | passages | search | recall@1 | recall@5 "
        "| MRR@10 | recall@5, MRR@10 against Open WebUI's |\n"
        "|---|---|---|---:|---:|---|---:|---:|---:|---|"
    )
    print("\n".join(rows))
    out: dict[str, Any] = {
        "counted_by": measure.counted_by,
        "passage_tokens": measure.max_tokens,
        "prompt_tokens": dict(measure.prompt_tokens),
        "sets": results,
    }
    if args.indexing and args.embeddings_url:
        out.update(_indexing_rate(build_one("python-faq", args.limit), sizing, args))
    return out


def build_one(name: str, limit: int) -> EvalSet:
    built = next(build([name], limit))
    if isinstance(built, str):
        raise BadArguments(built)
    return built


def evaluate(suite: EvalSet, sizing: PassageSizing, args: argparse.Namespace) -> dict[str, Any]:
    """The set's scores per method: keyword, and with an encoder hybrid, dense, fusion and
    Open WebUI's defaults."""
    passages = _passages(suite.cases, sizing)
    questions = [case.question for case in suite.cases]
    words = _keyword(questions, passages)  # (index, score): hybrid blends the scores
    rankings = {
        "keyword": [[i for i, _ in found] for found in words],
        PORTER: [[i for i, _ in found] for found in _keyword(questions, passages, porter=True)],
    }
    baseline: list[int | None] = []
    if args.embeddings_url:
        url, model = args.embeddings_url, args.embeddings_model
        # A question longer than the encoder reads is cut to it, as the app's search does
        limit = sizing.current().question_limit
        asked = [cut(q, lambda text: sizing.count(text) <= limit) for q in questions]
        kinds = not args.no_input_type
        dense = _dense(asked, passages, url, model, input_types=kinds)
        document_of = {i: passage.document for i, passage in enumerate(passages)}
        rankings["hybrid"] = [
            [item for item, _ in blend(d, k, document_of, DEFAULTS["DOCUMENT_KEYWORD_WEIGHT"])]
            for k, d in zip(words, dense, strict=True)
        ]
        rankings["dense"] = [[item for item, _ in d] for d in dense]
        rankings["fusion"] = [
            [item for item, _ in fuse([k, d])]
            for k, d in zip(rankings["keyword"], rankings["dense"], strict=True)
        ]
        baseline = _baseline(suite.cases, url, model)
    scores: dict[str, Any] = {}
    for name, ranked in rankings.items():
        documents = [[passages[i].document for i in ranking] for ranking in ranked]
        scores[name] = score([rank_of(q, docs) for q, docs in enumerate(documents)]).__dict__
    if args.embeddings_url:
        scores[OPEN_WEBUI] = score(baseline).__dict__
    return {
        "language": suite.language,
        "kind": suite.kind,
        "questions": len(suite.cases),
        "passages": len(passages),
        "scores": scores,
    }


def _rows(suite: EvalSet, result: dict[str, Any]) -> list[str]:
    scores = result["scores"]
    theirs = scores.get(OPEN_WEBUI)
    rows = []
    for name, measured in scores.items():
        against = "-"
        if theirs is not None and name != OPEN_WEBUI:
            recall = 100 * (measured["recall_at_5"] - theirs["recall_at_5"])
            mrr = 100 * (measured["mrr_at_10"] - theirs["mrr_at_10"])
            against = f"{recall:+.1f}, {mrr:+.1f} points"
        rows.append(
            f"| {suite.name} | {suite.language} | {suite.kind} | {result['questions']} | "
            f"{result['passages']} | {name} | {measured['recall_at_1']:.3f} | "
            f"{measured['recall_at_5']:.3f} | {measured['mrr_at_10']:.3f} | {against} |"
        )
    return rows


@dataclass(frozen=True)
class Passage:
    document: int  # the case's index
    embedded: str  # what the encoder reads
    keywords: str  # what keyword search indexes: its words stemmed in its document's language
    words: str  # its heading and text as they are (for the Porter tokenizer)
    language: str  # its document's (documents/language.py)


def _passages(cases: list[Case], sizing: PassageSizing) -> list[Passage]:
    """Every passage, as the app's reader cuts the file and its indexer keeps it."""
    limit = sizing.current().max_tokens
    passages: list[Passage] = []
    for document, case in enumerate(cases):
        try:
            _, blocks = read(case.document.encode(), case.name, None, LIMITS)
        except Refused:
            blocks = [Block("text", case.document)]
        cut = chunk(blocks, sizing, limit)
        language = document_language(p.text for p in cut)
        for p in cut:
            words = f"{p.heading}\n{p.text}"
            stemmed = keywords(words, language)
            passages.append(Passage(document, p.embedded, stemmed, words, language))
    return passages


def _indexing_rate(
    suite: EvalSet, sizing: PassageSizing, args: argparse.Namespace
) -> dict[str, float]:
    """Passages per second: the bare /v1/embeddings rate (the passages in batches of 32), and
    the app's indexer end to end on a SQLite file (each answer a file: stored, parsed, cut,
    embedded, written with its vectors and keywords). Issue 44 asks >= 0.8x."""
    from chatapp.documents import library
    from chatapp.documents.embedder import Embedder
    from chatapp.documents.index.search_index import index_for
    from chatapp.documents.indexer.worker import QUICK_S, Indexer
    from chatapp.store import Store, migrate
    from chatapp.store.users import ensure_user

    texts = [passage.embedded for passage in _passages(suite.cases, sizing)]
    kinds = not args.no_input_type

    def embedder() -> Embedder:
        return Embedder(args.embeddings_url, model=args.embeddings_model, send_input_type=kinds)

    began = time.perf_counter()
    embedder().embed(texts)
    bare = len(texts) / (time.perf_counter() - began)
    store = Store.open(f"sqlite:///{Path(tempfile.mkdtemp()) / 'rag.db'}")
    migrate.upgrade(store.engine)
    with store.session(write=True) as session:
        owner = ensure_user(session, "bench").id
    began = time.perf_counter()
    for number, case in enumerate(suite.cases):
        library.add(store, owner, f"{number}-{case.name}", case.document.encode(), None, LIMITS)
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
                embedder(),
                sizing,
                LIMITS,
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
        f"\nindexing: {bare:,.1f} passages/s bare /v1/embeddings, {indexed:,.1f} through the "
        f"indexer ({indexed / bare:.2f}x)"
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


def _keyword(
    questions: list[str], passages: list[Passage], *, porter: bool = False
) -> list[list[tuple[int, float]]]:
    """Each question's passages (indexes) by BM25, as the SQLite engine ranks them: stemmed in
    each document's and each question's language (documents/language.py), or, `porter`, as
    before issue 55 (FTS5's English Porter tokenizer over every text): (index, score) pairs,
    higher-is-better, as the app's index gives them."""
    db = sqlite3.connect(":memory:")
    tokenizer = "porter unicode61" if porter else "unicode61 remove_diacritics 2"
    db.execute(f"CREATE VIRTUAL TABLE passages USING fts5(text, tokenize='{tokenizer}')")
    db.executemany(
        "INSERT INTO passages(rowid, text) VALUES (?, ?)",
        [(i, p.words if porter else p.keywords) for i, p in enumerate(passages)],
    )
    # The languages of the library's documents, the commonest first (search_index.py)
    counts = Counter(p.language for p in {p.document: p for p in passages}.values())
    library = [language for language, _ in counts.most_common()]
    ranked = []
    for question in questions:
        languages = [] if porter else question_languages(question, library)
        query = fts5_query(question, languages)
        rows = (
            []
            if query is None
            else db.execute(
                "SELECT rowid, bm25(passages) FROM passages WHERE passages MATCH ? "
                "ORDER BY bm25(passages) LIMIT ?",
                (query, DEPTH),
            ).fetchall()
        )
        ranked.append([(row[0], -row[1]) for row in rows])
    return ranked


def _dense(
    questions: list[str], passages: list[Passage], url: str, model: str, *, input_types: bool
) -> list[list[tuple[int, float]]]:
    """Each question's passages (index, cosine), best first; `input_types`: passages and
    questions say what they are (input_type), as the app's requests to its sidecar do."""
    vectors = _embed(
        [p.embedded for p in passages], url, model, kind="passage" if input_types else None
    )
    queries = _embed(questions, url, model, kind="query" if input_types else None)
    similarities = queries @ vectors.T
    return [[(int(i), float(row[i])) for i in np.argsort(-row)[:DEPTH]] for row in similarities]


def _baseline(cases: list[Case], url: str, model: str) -> list[int | None]:
    """Each question's rank of its answer under Open WebUI's defaults (rag_baseline.py):
    1,000/100-character chunks of the raw file's text, cut at the encoder's limit, best
    chunk."""
    chunks = [(d, text) for d, case in enumerate(cases) for text in recursive_split(case.document)]
    vectors = _embed([text for _, text in chunks], url, model, truncate=True)
    queries = _embed([case.question for case in cases], url, model, truncate=True)
    ranks = []
    for q, row in enumerate(queries @ vectors.T):
        documents = [chunks[i][0] for i in np.argsort(-row)[:DEPTH]]
        ranks.append(rank_of(q, documents))
    return ranks


def _embed(
    texts: list[str],
    url: str,
    model: str,
    batch: int = 32,
    *,
    truncate: bool = False,
    kind: str | None = None,
) -> np.ndarray:
    """Unit vectors of `texts`; `truncate`: inputs over the encoder's limit are cut to it
    (vLLM's `truncate_prompt_tokens`, -1: the model's limit), as sentence-transformers does;
    `kind`: their input_type (our sidecar's encoder prompt), None for none."""
    base = url.rstrip("/").removesuffix("/v1")
    out: list[list[float]] = []
    extra: dict[str, Any] = {"truncate_prompt_tokens": -1} if truncate else {}
    if kind is not None:
        extra["input_type"] = kind
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
