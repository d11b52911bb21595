"""Every benchmark and measurement, one command: `python -m scripts.bench QUESTION [options]`.

    python -m scripts.bench --help                 # the questions it answers, one line each
    python -m scripts.bench users --help           # one question's options
    python -m scripts.bench users --preset small   # a quick look on the generated `small` model

Each question runs its module of this folder (README.md), which prints its tables; this command
first prints the question, the CPU and the date, and last writes everything the module measured
as JSON (--json; by default bench-results/QUESTION-TIME.json), with the same CPU, the date and
the command line. Run them on a quiet machine: the figures are the machine's as much as the
sidecar's. Exit status: 0 done, 1 failed (one line on stderr), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.bench.common import REPO, BadArguments, Failed
from scripts.bench.drivers import cpu_name

PROG = "python -m scripts.bench"


@dataclass(frozen=True)
class Command:
    name: str  # what it measures
    module: str  # under scripts.bench: add_arguments(parser) and main(args) -> the JSON
    question: str  # the one line --help shows
    arguments: str = "add_arguments"


COMMANDS = (
    Command("hops", "hops", "what the sidecar and the relay cost on top of the engine (TTFT, "
            "decode), N streams at once, the turns of one chat, peak memory"),
    Command("peers", "hops", "the same beside llama.cpp's server on the same model: prefill "
            "by length, turns, users, memory (needs `make peers`)", "add_peer_arguments"),
    Command("users", "users", "how fast it is with N users at once: aggregate and per-user "
            "decode, TTFT while others decode, DECODE_BATCH_ROWS 1 against 4"),
    Command("turns", "turns", "the turns of one chat with the conversation cache on and off "
            "(TTFT, cached tokens)"),
    Command("users-turns", "users_turns", "U users taking turns in their own chats: "
            "returning turns' TTFT and reuse, restores from compact RAM and disk, llama.cpp "
            "with --peers"),
    Command("first-word", "first_word", "what a new chat waits for its first word: an empty "
            "cache, a declared shared prefix, a cache full of idle conversations (at once, after "
            "idle time)"),
    Command("prefill-calls", "prefill_calls", "what reading a prompt costs in one model call "
            "against several: the engine's append against the batched decoder's chunks (CPU "
            "time, page faults)"),
    Command("variants", "variants", "model variants (int4 block size, int4 embedding, pruned "
            "LM head, int8 KV, prompt-lookup drafts): speed, memory, quality"),
    Command("prompt-lookup", "prompt_lookup", "prompt-lookup drafts on the batched path "
            "(PROMPT_LOOKUP_TOKENS): a grounded answer, a reply copying its passage, plain "
            "chat, two users one drafting, drafts on against off"),
    Command("passages", "passages", "the passage store (issue 54): how close a grounded answer "
            "stays with its passages from the store (the quality gate, by recomputed tokens), "
            "and a grounded question's first token with them stored, missed and off"),
    Command("models", "models", "several models behind one sidecar (issue 56): two resident "
            "models taking turns against alone, a cold load and a Phi-3-mini-sized estimate, a "
            "soak of three models in a two-model budget"),
    Command("quality", "quality", "how close a model folder stays to a reference (agreement, "
            "perplexity); with --kv-restore, a chat restored from compact KV"),
    Command("guidance", "guidance", "what structured output costs and saves: forced tokens, "
            "a grammar's cost per decode step"),
    Command("images", "images", "what an image costs on a vision model: its prompt tokens and "
            "time to first word against text of as many tokens; CLIP's encoder estimated"),
    Command("embeddings", "embeddings", "/v1/embeddings: agreement and throughput against "
            "PyTorch, a query's latency, a chat beside an index run"),
    Command("speech", "speech", "speech to text (issue 57): Whisper tiny.en's real-time "
            "factor and word error rate on spoken FAQ sentences, beside faster-whisper run "
            "bare, and a chat's decode while a 60 s clip is transcribed"),
    Command("slow-clients", "slow_clients", "/healthz and a chat while hundreds of idle and "
            "slow connections are held open"),
    Command("health-latency", "health_latency", "/healthz latency while the sidecar reads a "
            "long prompt and decodes"),
    Command("tracing", "tracing", "what tracing costs a chat: the pair with tracing off, on "
            "and off again"),
    Command("container-start", "container_start", "the sidecar image's start, from `podman "
            "run` to ready, model baked in or mounted"),
    Command("store", "store", "the chat app's database: opening a 200-message chat, the chat "
            "list and search with 100 users x 50 chats, what keeping a chat adds to TTFT"),
    Command("abuse", "abuse", "what abusive requests cost the others: a flood of over-long "
            "prompts (a bystander's longest gap), one huge max_tokens (others' TTFT)"),
    Command("rag", "rag", "retrieval quality on a suite of public sets (the Python and Git "
            "FAQs, package descriptions, manual pages in English, German, French, Spanish): "
            "recall@1/5, MRR@10 of keyword, dense, fusion beside Open WebUI's, per set"),
    Command("rag-scale", "rag_scale", "the documents library at 100,000 passages: search p50/p95 "
            "(dense, keyword) and write rate, SQLite and PostgreSQL"),
    Command("rag-turn", "rag_turn", "what grounding costs a chat turn: TTFT bare, with "
            "\"documents\": true, and bare with the grounded turn's own prompt (issue 44's "
            "target), and the follow-up's cached tokens"),
    Command("kv-memory", "kv_memory", "the sidecar's peak memory under a container's memory "
            "limit with more KV wanted than fits (root)"),
)  # fmt: skip

# The modules here that are no question of their own: what the questions share.
LIBRARIES = {
    "common": "the model folder, the machine, peak memory, bad arguments and failures",
    "drivers": "how one generation is driven and timed (engine, sidecar, app); the prompts",
    "quality_kv": "quality --kv-restore: a conversation restored through the batched path",
    "peers": "llama.cpp's server, the GGUF of our model, the peer tables (peers/)",
    "rag_faq": "rag: the Python FAQ's question and answer pairs, recall@k and MRR",
    "rag_baseline": "rag: Open WebUI's default retrieval reproduced, run beside ours",
    "rag_sets": "rag: the suite's sets, built from the machine's own public text",
    "rag_encoders": "rag --encoder: the real encoders served for the run, and compared",
    "store_chat": "store: what storing adds to TTFT, through POST /chat (gunicorn, a sidecar)",
}


def build_parser(chosen: str | None) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The parser of every question; only the chosen one's module is imported (a benchmark's
    imports are heavy, and some need what only it needs: podman, root, `make peers`). Returns
    the parser and the chosen question's own (which names its usage in an error)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="where to write the results (default: bench-results/QUESTION-TIME.json)",
    )
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="\n\n".join((__doc__ or "").split("\n\n")[:2]),
        epilog="what the questions share (scripts/bench/README.md):\n"
        + "".join(f"  {name:11s} {what}\n" for name, what in LIBRARIES.items())
        + "the figures: docs/benchmarks/ (README.md: one line per question, today's figure)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    questions = parser.add_subparsers(dest="command", metavar="QUESTION", required=True)
    own = parser
    for command in COMMANDS:
        sub = questions.add_parser(
            command.name,
            parents=[common],
            help=command.question,
            description=command.question,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if command.name == chosen:
            module = importlib.import_module(f"scripts.bench.{command.module}")
            add: Callable[[argparse.ArgumentParser], None] = getattr(module, command.arguments)
            add(sub)
            sub.epilog = module.__doc__
            own = sub
    return parser, own


def envelope(command: str, argv: list[str], began: float) -> dict[str, Any]:
    return {
        "command": f"{PROG} {' '.join(argv)}",
        "question": command,
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(began)),
        "seconds": round(time.time() - began, 1),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    names = {command.name: command for command in COMMANDS}
    parser, own = build_parser(next((arg for arg in argv if arg in names), None))
    args = parser.parse_args(argv)
    command = names[args.command]
    began = time.time()
    today = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(began))
    print(f"# {command.name}: {command.question}\n# on {cpu_name()}, {today}\n", flush=True)
    if args.json is None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(began))
        args.json = REPO / "bench-results" / f"{command.name}-{stamp}.json"
    module = importlib.import_module(f"scripts.bench.{command.module}")
    failure = None
    try:
        result = module.main(args)
    except BadArguments as error:
        own.error(str(error))  # the usage line and exit status 2
    except Failed as error:
        failure, result = str(error), error.result
    if result is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"benchmark": envelope(command.name, argv, began), **result}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    if failure is not None:
        sys.stderr.write(f"error: {failure}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
