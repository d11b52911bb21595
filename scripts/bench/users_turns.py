"""Users taking turns: U users x T turns of their own chats, interleaved, one request at a time
(issue 34's workload, conversations at scale), optionally beside llama.cpp's server.

    python -m scripts.bench users-turns                     # phi3-mini shapes, 16 users x 5 turns
    python -m scripts.bench users-turns --plan-memory-gb 8  # KV_MEMORY_MB as in an 8 GB container
    python -m scripts.bench users-turns --peers             # and llama-server (make peers)
    python -m scripts.bench users-turns --preset small --users 4 --turns 3 --restore-tokens 2000

Three phases, each on a fresh sidecar with the same settings (scripts/run/services.py):
1. alone: one user's chat of T turns, nobody else's between them (the chats of users 1..
   --baseline-reps, one after another): what one user alone sees;
2. users: user 1 turn 1, user 2 turn 1, ..., user U turn 1, user 1 turn 2, ...; each user has
   its own cache_scope and sends its whole chat each turn, the server's own replies included;
   replies are greedy and exactly --reply-tokens long. With --peers, llama-server (its defaults,
   `-c 4096 -np 1`, its host-memory prompt cache) gets the same chats request by request,
   interleaved, with its own replies;
3. restore: one conversation of --restore-tokens pushed to compact RAM (a PROMPT_CACHE_MB that
   holds its compact copy but not its KV slot), continued; pushed to the disk tier by a second
   conversation as long, continued again; then read once more with the cache off.
Per request: the time to the first byte of the stream, and from the sidecar's log line (found
by X-Request-Id) the prompt and cached tokens, the tier those came from and the restore time.
Prints Markdown tables and the issue's targets (pass or fail, on the CPU named); writes every
sample as JSON (--json). Run it on a quiet machine: the figures are the machine's as much as
the sidecar's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx

from scripts.bench.common import (
    PRESET_DIRS,
    BadArguments,
    ensure_model,
    peak_rss_bytes,
    peer_model,
)
from scripts.bench.drivers import ChatTokenizer, cpu_name, sized_messages, via_sidecar, words
from scripts.bench.users import percentile
from scripts.run import services
from sidecar import limits
from sidecar.model import memory
from sidecar.settings import Settings

REPO = services.REPO
MIB, GIB = limits.MIB, limits.GIB
REUSE_TARGET = 0.95  # of the previous turn's prompt
ALONE_TARGET = 1.5  # last turn's TTFT, median and p95, against one user alone
RESTORE_TARGETS_S = {"compact": 0.5, "disk": 2.0}  # for a 2,000-token conversation
Row = dict[str, Any]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", "--model-dir", dest="model", help="model folder (default: --preset)"
    )
    parser.add_argument(
        "--preset",
        default="phi3-mini",
        choices=sorted(PRESET_DIRS),
        help="generated model, built once (phi3-mini into models/, the others into build/)",
    )
    parser.add_argument("--users", type=int, default=16, help="users taking turns")
    parser.add_argument("--turns", type=int, default=5, help="turns of each user's chat")
    parser.add_argument("--words", type=int, default=60, help="words of each user message")
    parser.add_argument("--reply-tokens", type=int, default=32, help="tokens of each reply")
    parser.add_argument(
        "--baseline-reps", type=int, default=3, help="chats of one user alone (phase 1)"
    )
    parser.add_argument("--pause", type=float, default=0.5, help="idle seconds between requests")
    parser.add_argument(
        "--restore-tokens",
        type=int,
        default=2000,
        help="tokens of the conversation restored from compact RAM and disk (0: skip)",
    )
    group = parser.add_argument_group(
        "the sidecar's settings (default: its own, which docs/configuration.md gives for an "
        "8 GB P1v3; the environment's where set)"
    )
    memory_bound = group.add_mutually_exclusive_group()
    memory_bound.add_argument("--kv-memory-mb", type=int, help="KV_MEMORY_MB")
    memory_bound.add_argument(
        "--plan-memory-gb",
        type=float,
        help="set KV_MEMORY_MB as the sidecar chooses it in a container of this many GiB: that "
        "less the loaded service's RSS less max(1 GiB, 10%%) (sidecar/limits.py)",
    )
    group.add_argument("--prompt-cache-mb", type=int, help="PROMPT_CACHE_MB")
    group.add_argument(
        "--prompt-cache-dir",
        type=Path,
        help="the disk tier (PROMPT_CACHE_DIR): each sidecar of the run gets a new folder in it, "
        "removed after; the restore phase uses one in a temporary folder without it",
    )
    group.add_argument(
        "--kv-compact",
        choices=("int8", "fp16", "fp32", "off"),
        help="KV_COMPACT (off: the restore phase is skipped)",
    )
    peers = parser.add_argument_group("peers (llama.cpp's server; install with `make peers`)")
    peers.add_argument("--peers", action="store_true", help="llama-server side by side")
    peers.add_argument("--peer-context", type=int, default=4096, help="llama-server's -c")


def settle(args: argparse.Namespace) -> None:
    if args.users < 1 or args.turns < 1 or args.baseline_reps < 1:
        raise BadArguments("--users, --turns and --baseline-reps must be at least 1")
    if args.prompt_cache_dir is None and os.environ.get("PROMPT_CACHE_DIR"):
        # Each phase still gets a folder of its own in it (phase_sidecar).
        args.prompt_cache_dir = Path(os.environ["PROMPT_CACHE_DIR"])


# -- the sidecars ----------------------------------------------------------------------------


def sidecar_settings(args: argparse.Namespace) -> dict[str, str]:
    """The settings given on the command line (the rest: the sidecar's defaults)."""
    given = {
        "KV_MEMORY_MB": args.kv_memory_mb,
        "PROMPT_CACHE_MB": args.prompt_cache_mb,
        "KV_COMPACT": args.kv_compact,
    }
    return {name: str(value) for name, value in given.items() if value is not None}


@contextlib.contextmanager
def phase_sidecar(
    model_dir: Path, scratch: Path, name: str, settings: dict[str, str], cache_dir: Path | None
) -> Iterator[services.Service]:
    """A fresh sidecar for one phase; its disk tier (if any) a new folder inside `cache_dir`,
    so that no phase adopts another's files (the tier keeps its model's files at start)."""
    env = dict(settings)
    folder = None
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=cache_dir))
        env["PROMPT_CACHE_DIR"] = str(folder)
    try:
        with services.sidecar(model_dir, scratch / f"sidecar-{name}.log", env=env) as service:
            yield service
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def kv_memory_line(service: services.Service) -> dict[str, Any]:
    """The worker's start line "kv memory": the KV bound it took (KV_MEMORY_MB or chosen), the
    loaded service's resident bytes, the context, the compact encoding, the disk tier."""
    for line in service.log_lines():
        if line.startswith("{"):
            data = json.loads(line)
            if data.get("msg") == "kv memory":
                return {k: v for k, v in data.items() if k not in ("ts", "level", "logger")}
    raise RuntimeError("the sidecar logged no 'kv memory' line: batched decode is off for it")


def plan_kv_memory(
    model_dir: Path, scratch: Path, settings: dict[str, str], cache_dir: Path | None, gib: float
) -> dict[str, Any]:
    """KV_MEMORY_MB as the sidecar would choose it in a container of `gib` GiB: the service's
    resident bytes once loaded (a probe sidecar's own measurement) through memory.py."""
    with phase_sidecar(model_dir, scratch, "plan", settings, cache_dir) as probe:
        loaded = int(kv_memory_line(probe)["loaded_bytes"])
    limit = int(gib * GIB)
    kv = memory.default_kv_bytes(limit, loaded)
    plan = {
        "memory_gib": gib,
        "loaded_bytes": loaded,
        "margin_bytes": limits.margin(limit),
        "kv_memory_mb": kv // MIB,
    }
    print(
        f"plan for {gib:g} GiB: loaded {loaded / MIB:.0f} MiB, margin "
        f"{plan['margin_bytes'] / MIB:.0f} MiB: KV_MEMORY_MB={plan['kv_memory_mb']}",
        flush=True,
    )
    return plan


# -- one turn on each server -----------------------------------------------------------------


@dataclass
class Chat:
    """One user's conversation on one server: what it has sent and been answered so far."""

    user: int
    scope: str
    history: list[dict[str, str]] = field(default_factory=list)
    last_prompt: int | None = None  # the previous turn's prompt tokens


def message(user: int, turn: int, count: int) -> str:
    """User `user`'s message of turn `turn`: words of its own (no two chats share a prefix)."""
    return words(count, 1000 + 100 * user + turn)


def reused(cached: int, previous: int | None) -> float | None:
    """Cached tokens as a share of the previous turn's prompt (None on a first turn)."""
    return None if not previous else cached / previous


def sidecar_turn(
    client: httpx.Client,
    service: services.Service,
    chat: Chat,
    text: str,
    reply_tokens: int,
    phase: str,
    turn: int,
) -> Row:
    """One turn of a chat through POST /predict, and what its log line says."""
    messages = [*chat.history, {"role": "user", "content": text}]
    rid = f"{phase}-{chat.scope}-t{turn}"
    sample = via_sidecar(
        client, service.url, messages, reply_tokens, turn, phase, scope=chat.scope, request_id=rid
    )
    if sample.status != 200:
        raise RuntimeError(f"{rid}: HTTP {sample.status}\n{service.log()[-2000:]}")
    line = services.request_line(service, rid)
    prompt, cached = int(line["prompt_tokens"]), int(line.get("cached_tokens") or 0)
    row: Row = {
        "server": "sidecar",
        "phase": phase,
        "user": chat.user,
        "turn": turn,
        "request_id": rid,
        "ttft_s": sample.ttft_s,
        "decode_tps": sample.decode_tps,
        "total_s": sample.total_s,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "previous_prompt_tokens": chat.last_prompt,
        "reused": reused(cached, chat.last_prompt),
        "cache_tier": line.get("cache_tier"),
        "restore_ms": line.get("restore_ms"),
        "room_ms": line.get("room_ms"),
        "room_compacted": line.get("room_compacted"),
        "room_spilled": line.get("room_spilled"),
        "cache_reason": line.get("cache_reason"),
        "generated_tokens": line.get("generated_tokens"),
        "server_ttft_ms": line.get("ttft_ms"),
    }
    chat.history = [*messages, {"role": "assistant", "content": sample.text}]
    chat.last_prompt = prompt
    return row


def llama_turn(
    client: httpx.Client,
    url: str,
    tokenizer: ChatTokenizer,
    chat: Chat,
    text: str,
    reply_tokens: int,
    turn: int,
) -> Row:
    """The same turn through llama-server's /completion: our tokenizer's prompt ids for its
    own chat so far, its prompt cache on (cache_prompt, its default)."""
    from scripts.bench.peers import llamacpp

    messages = [*chat.history, {"role": "user", "content": text}]
    ids = [int(i) for i in tokenizer.prompt_ids(messages)]
    sample, timings = llamacpp.complete(client, url, ids, reply_tokens, turn, cache_prompt=True)
    if sample.status != 200:
        raise RuntimeError(f"llama-server, user {chat.user} turn {turn}: HTTP {sample.status}")
    cached = int(timings.get("cache_n", 0))
    row: Row = {
        "server": "llamacpp",
        "phase": "users",
        "user": chat.user,
        "turn": turn,
        "ttft_s": sample.ttft_s,
        "decode_tps": sample.decode_tps,
        "total_s": sample.total_s,
        "prompt_tokens": len(ids),
        "cached_tokens": cached,
        "previous_prompt_tokens": chat.last_prompt,
        "reused": reused(cached, chat.last_prompt),
    }
    chat.history = [*messages, {"role": "assistant", "content": sample.text}]
    chat.last_prompt = len(ids)
    return row


def show(row: Row) -> None:
    share = "" if row["reused"] is None else f", {100 * row['reused']:.0f}% of the last prompt"
    tier = f" from {row['cache_tier']}" if row.get("cache_tier") else ""
    if row.get("restore_ms") is not None:
        tier += f" (restored in {row['restore_ms']} ms)"
    if row.get("room_ms"):
        moved = f"{row.get('room_compacted')} compacted, {row.get('room_spilled')} to disk"
        tier += f", room made in {row['room_ms']} ms ({moved})"
    name = f" ({row['name']})" if row.get("name") else ""
    print(
        f"  {row['phase']:7s} {row['server']:8s} user {row['user']:2d} turn {row['turn']}{name}: "
        f"{row['prompt_tokens']} tokens, {row['cached_tokens']} cached{share}{tier}, "
        f"ttft {row['ttft_s']:.2f} s",
        flush=True,
    )


# -- the phases ------------------------------------------------------------------------------


def run_alone(service: services.Service, args: argparse.Namespace) -> list[Row]:
    """Users 1..baseline_reps's chats (the users phase's first chats), each alone: all its
    turns before the next chat's first."""
    rows = []
    with httpx.Client(timeout=1800) as client:
        for user in range(1, args.baseline_reps + 1):
            chat = Chat(user, f"alone{user}")
            for turn in range(1, args.turns + 1):
                text = message(user, turn, args.words)
                rows.append(
                    sidecar_turn(client, service, chat, text, args.reply_tokens, "alone", turn)
                )
                show(rows[-1])
                time.sleep(args.pause)
    return rows


def run_users(
    service: services.Service,
    args: argparse.Namespace,
    llama_url: str | None,
    tokenizer: ChatTokenizer | None,
) -> list[Row]:
    """Every user's turn t before anyone's turn t+1; llama-server's request right after ours."""
    ours = {user: Chat(user, f"user{user}") for user in range(1, args.users + 1)}
    theirs = {user: Chat(user, f"user{user}") for user in range(1, args.users + 1)}
    rows = []
    with httpx.Client(timeout=1800) as client:
        for turn in range(1, args.turns + 1):
            for user in ours:
                text = message(user, turn, args.words)
                rows.append(
                    sidecar_turn(
                        client, service, ours[user], text, args.reply_tokens, "users", turn
                    )
                )
                show(rows[-1])
                time.sleep(args.pause)
                if llama_url is not None and tokenizer is not None:
                    rows.append(
                        llama_turn(
                            client,
                            llama_url,
                            tokenizer,
                            theirs[user],
                            text,
                            args.reply_tokens,
                            turn,
                        )
                    )
                    show(rows[-1])
                    time.sleep(args.pause)
    return rows


def restore_budget_mb(model_dir: Path, encoding: str, tokens: int, grown: int) -> int:
    """A PROMPT_CACHE_MB that holds a `tokens` conversation's compact copy (grown by `grown`
    tokens) but neither its KV slot nor two such compact copies: so it moves to compact RAM
    when it goes idle, and to the disk tier when a second one goes idle (the least recently
    used moves first: kv/tiers.py). SystemExit where whole MiB cannot do that."""
    import numpy as np

    from sidecar.model.batch.decoder import KvPool, read_spec
    from sidecar.model.kv import compact as kv_compact

    spec = read_spec(json.loads((model_dir / "genai_config.json").read_text()))
    pool = KvPool(spec, 1, 1, np.float32)  # one position: for the sizes only
    compact = kv_compact.bytes_per_token(pool, cast(kv_compact.Encoding, encoding))

    def budget(n: int) -> int:
        return -(-compact * (n + grown) // MIB)

    def fits(n: int) -> bool:
        return budget(n) * MIB < min(pool.bytes_per_token * n, 2 * compact * n)

    if not fits(tokens):
        least = next((n for n in range(tokens, 1_000_000, 100) if fits(n)), None)
        raise SystemExit(
            f"a {tokens}-token conversation is too short for this model ({compact} compact "
            f"bytes a token, PROMPT_CACHE_MB counts whole MiB): ask --restore-tokens {least} "
            "or more"
        )
    return budget(tokens)


def drop_page_cache(folder: Path) -> bool:
    """Write the disk tier's files out and drop them from the page cache, so that the restore
    reads the device (on tmpfs there is no device: nothing changes). False if none was found."""
    files = [p for p in folder.iterdir() if p.is_file()]
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return bool(files)


def reread(client: httpx.Client, service: services.Service, messages: Any, tokens: int) -> Row:
    """The same prompt with the cache off for this request (/v1's cache_prompt false)."""
    rid = "restore-reread"
    body = {"messages": messages, "max_tokens": tokens, "stream": True, "cache_prompt": False}
    start = time.perf_counter()
    first = 0.0
    headers = {"x-request-id": rid}
    with client.stream(
        "POST", service.url + "/v1/chat/completions", json=body, headers=headers
    ) as r:
        if r.status_code != 200:
            raise RuntimeError(f"re-read: HTTP {r.status_code}: {r.read()!r}")
        for event in r.iter_lines():
            if first or not event.startswith("data: {"):
                continue
            choices = json.loads(event[len("data: ") :]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                first = time.perf_counter()
    line = services.request_line(service, rid)
    return {
        "server": "sidecar",
        "phase": "restore",
        "name": "reread",
        "request_id": rid,
        "ttft_s": first - start if first else None,
        "prompt_tokens": line["prompt_tokens"],
        "cached_tokens": line.get("cached_tokens") or 0,
        "cache_reason": line.get("cache_reason"),
        "server_ttft_ms": line.get("ttft_ms"),
    }


def run_restore(
    model_dir: Path,
    scratch: Path,
    settings: dict[str, str],
    args: argparse.Namespace,
    tokenizer: ChatTokenizer,
) -> dict[str, Any]:
    """One conversation of --restore-tokens: idle in compact RAM, continued; pushed to disk
    by another as long, continued; read again with the cache off."""
    encoding = setting(settings, "KV_COMPACT", "kv_compact")
    first = sized_messages(tokenizer, args.restore_tokens, 90_000)
    tokens = len(tokenizer.prompt_ids(first))
    # What the conversation grows by before it is pushed to disk: two replies and a short turn.
    short = [{"role": "user", "content": message(1, 2, 10)}]
    grown = 2 * args.reply_tokens + len(tokenizer.prompt_ids(short))
    budget = restore_budget_mb(model_dir, encoding, tokens + args.reply_tokens, grown)
    env = {**settings, "PROMPT_CACHE_MB": str(budget)}
    disk_root = args.prompt_cache_dir or scratch / "restore-disk"
    print(f"restore: {tokens} tokens, KV_COMPACT={encoding}, PROMPT_CACHE_MB={budget}", flush=True)
    rows: list[Row] = []
    with (
        phase_sidecar(model_dir, scratch, "restore", env, disk_root) as service,
        httpx.Client(timeout=1800) as client,
    ):
        chat, other = Chat(1, "restored"), Chat(2, "pusher")
        pusher = sized_messages(tokenizer, args.restore_tokens, 91_000)
        steps = (
            ("read", chat, first[0]["content"], None),  # idle: compacted (its slot is over budget)
            ("compact", chat, message(1, 2, 10), "compact"),
            ("pusher", other, pusher[0]["content"], None),  # idle: both compact is over budget
            ("disk", chat, message(1, 3, 10), "disk"),
        )
        folder = Path(kv_memory_line(service)["disk_tier"])
        dropped = False
        for name, who, text, expected in steps:
            if name == "disk":
                dropped = drop_page_cache(folder)
            turn = 1 + sum(m["role"] == "user" for m in who.history)
            row = sidecar_turn(client, service, who, text, args.reply_tokens, "restore", turn)
            rows.append(row | {"name": name, "expected_tier": expected})
            show(rows[-1])
            time.sleep(args.pause)
        # The disk turn's own messages (its chat less the reply it got), read afresh.
        rows.append(reread(client, service, chat.history[:-1], args.reply_tokens))
        start_line = kv_memory_line(service)
    return {
        "tokens": tokens,
        "kv_compact": encoding,
        "prompt_cache_mb": budget,
        "page_cache_dropped": dropped,
        "kv_memory": start_line,
        "samples": rows,
    }


# -- what the runs say -----------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _stats(rows: list[Row]) -> Row:
    ttfts = [r["ttft_s"] for r in rows]
    shares = [r["reused"] for r in rows if r["reused"] is not None]
    return {
        "requests": len(rows),
        "prompt_tokens": _median([r["prompt_tokens"] for r in rows]),
        "cached_tokens": _median([r["cached_tokens"] for r in rows]),
        "reused_min": min(shares, default=None),
        "reused_median": _median(shares),
        "ttft_median_s": _median(ttfts),
        "ttft_p95_s": percentile(ttfts, 0.95) if ttfts else None,
    }


def turn_table(rows: list[Row], turns: int) -> list[Row]:
    """Per turn of the users phase: our sidecar's figures, one user alone's, llama.cpp's."""
    table = []
    for turn in range(1, turns + 1):
        ours = [r for r in rows if r["phase"] == "users" and r["server"] == "sidecar"]
        ours = [r for r in ours if r["turn"] == turn]
        alone = [r["ttft_s"] for r in rows if r["phase"] == "alone" and r["turn"] == turn]
        restores = [r["restore_ms"] for r in ours if r["restore_ms"] is not None]
        rooms = [r.get("room_ms") or 0.0 for r in ours]
        entry: Row = {
            "turn": turn,
            **_stats(ours),
            "alone_ttft_s": _median(alone),
            "tiers": dict(Counter(r["cache_tier"] or "none" for r in ours)),
            "restore_ms_median": _median(restores),
            "restore_ms_max": max(restores, default=None),
            "room_ms_median": _median(rooms),
        }
        theirs = [r for r in rows if r["server"] == "llamacpp" and r["turn"] == turn]
        if theirs:
            entry["llamacpp"] = _stats(theirs)
        table.append(entry)
    return table


def _verdict(target: str, ok: bool | None, measured: str) -> Row:
    status = "not measured" if ok is None else "pass" if ok else "fail"
    return {"target": target, "status": status, "measured": measured}


def targets(result: dict[str, Any]) -> list[Row]:
    """Issue 34's targets, each pass, fail or not measured, with what was measured."""
    out = []
    returning = [
        r
        for r in result["samples"]
        if r["phase"] == "users" and r["server"] == "sidecar" and r["reused"] is not None
    ]
    goal = f"every returning turn reuses at least {REUSE_TARGET:.0%} of its previous prompt"
    if returning:
        worst = min(returning, key=lambda r: r["reused"])
        where = f"lowest {100 * worst['reused']:.1f}% (user {worst['user']}, turn {worst['turn']})"
        out.append(_verdict(goal, worst["reused"] >= REUSE_TARGET, where))
    else:
        out.append(_verdict(goal, None, "one turn only"))
    last = result["turns"][-1]
    turn, med, p95, alone = (
        last["turn"],
        last["ttft_median_s"],
        last["ttft_p95_s"],
        last["alone_ttft_s"],
    )
    out.append(
        _verdict(
            f"turn-{turn} TTFT, median and p95, at most {ALONE_TARGET}x one user alone's",
            med <= ALONE_TARGET * alone and p95 <= ALONE_TARGET * alone,
            f"median {med:.2f} s ({med / alone:.2f}x), p95 {p95:.2f} s ({p95 / alone:.2f}x); "
            f"alone {alone:.2f} s",
        )
    )
    goal = f"turn-{turn} TTFT, median and p95, at or below llama.cpp's on the same chats"
    llama = last.get("llamacpp")
    if llama:
        theirs_med, theirs_p95 = llama["ttft_median_s"], llama["ttft_p95_s"]
        out.append(
            _verdict(
                goal,
                med <= theirs_med and p95 <= theirs_p95,
                f"median {med:.2f} s against {theirs_med:.2f} s, p95 {p95:.2f} s against "
                f"{theirs_p95:.2f} s",
            )
        )
    else:
        out.append(_verdict(goal, None, "run with --peers"))
    restore = result.get("restore")
    for tier, limit in RESTORE_TARGETS_S.items():
        where = "compact RAM" if tier == "compact" else "the disk tier"
        goal = f"restoring a 2,000-token conversation from {where} at most {limit:g} s"
        row = (
            next((r for r in restore["samples"] if r.get("name") == tier), None)
            if restore
            else None
        )
        if row is None:
            out.append(_verdict(goal, None, "--restore-tokens 0 or KV_COMPACT=off"))
        elif row["cache_tier"] != tier:
            out.append(_verdict(goal, False, f"the turn came from {row['cache_tier']}, not {tier}"))
        else:
            seconds = row["restore_ms"] / 1000
            measured = f"{seconds:.3f} s for {row['cached_tokens']} tokens"
            out.append(_verdict(goal, seconds <= limit, measured))
    return out


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def markdown(result: dict[str, Any]) -> str:
    args, kv = result["args"], result["kv_memory"]
    disk = "off" if not kv.get("disk_tier") else "on"
    chosen = kv["chosen"]
    if "plan" in result:
        chosen = f"as chosen for a container of {result['plan']['memory_gib']:g} GiB"
    elif chosen == "KV_MEMORY_MB":
        chosen = "given"
    lines = [
        f"Users taking turns: {args['users']} users x {args['turns']} turns, interleaved, one "
        f"request at a time, on {result['cpu']}. Model `{Path(result['model']).name}`; "
        f"{args['words']}-word messages, {args['reply_tokens']}-token replies (greedy), each "
        f"user its own cache_scope. Sidecar: KV_MEMORY_MB {kv['kv_memory_bytes'] // MIB} "
        f"({chosen}), PROMPT_CACHE_MB {result['prompt_cache_mb']}, KV_COMPACT "
        f"{kv['compact']}, disk tier {disk}, context {kv['context_tokens']} tokens. Alone: "
        f"median of {args['baseline_reps']} chat(s) of one user, the first users' chats.",
        "",
    ]
    peers = "peers" in result
    head = (
        "| turn | prompt tokens | cached | reused % of previous prompt (min / median) "
        "| TTFT median (s) | TTFT p95 (s) | alone (s) | median / alone | tiers "
        "| restore ms (median / max) | room made ms (median) |"
    )
    rule = "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"
    if peers:
        head += (
            " llama.cpp cached | llama.cpp reused % (min) | llama.cpp TTFT median (s) | p95 (s) |"
        )
        rule += "---:|---:|---:|---:|"
    lines += [head, rule]
    for row in result["turns"]:
        alone, med = row["alone_ttft_s"], row["ttft_median_s"]
        tiers = ", ".join(f"{tier} {n}" for tier, n in sorted(row["tiers"].items()))
        line = (
            f"| {row['turn']} | {_num(row['prompt_tokens'], '.0f')} "
            f"| {_num(row['cached_tokens'], '.0f')} "
            f"| {_share(row['reused_min'])} / {_share(row['reused_median'])} "
            f"| {_num(med)} | {_num(row['ttft_p95_s'])} | {_num(alone)} "
            f"| {_num(med / alone if med and alone else None)} | {tiers} "
            f"| {_num(row['restore_ms_median'], '.1f')} / {_num(row['restore_ms_max'], '.1f')} "
            f"| {_num(row['room_ms_median'], '.1f')} |"
        )
        if peers:
            theirs = row.get("llamacpp", {})
            line += (
                f" {_num(theirs.get('cached_tokens'), '.0f')} | {_share(theirs.get('reused_min'))} "
                f"| {_num(theirs.get('ttft_median_s'))} | {_num(theirs.get('ttft_p95_s'))} |"
            )
        lines.append(line)
    rss = result["peak_rss_bytes"]
    lines += [
        "",
        "Peak RSS (VmHWM) of the users phase: "
        + ", ".join(f"{name} {value / MIB:.0f} MiB" for name, value in rss.items())
        + ".",
    ]
    if peers:
        lines.append(f"Peer: {result['peers']['version']}, {' '.join(result['peers']['args'])}.")
    restore = result.get("restore")
    if restore:
        dropped = "yes" if restore["page_cache_dropped"] else "no"
        lines += [
            "",
            f"Restoring a {restore['tokens']}-token conversation (KV_COMPACT "
            f"{restore['kv_compact']}, PROMPT_CACHE_MB {restore['prompt_cache_mb']}; the disk "
            f"tier's files dropped from the page cache first: {dropped}):",
            "",
            "| continued from | tier (log) | prompt tokens | cached | restore (ms) | TTFT (s) "
            "| TTFT, log (ms) |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        names = {
            "compact": "compact RAM",
            "disk": "the disk tier",
            "reread": "nothing (read again, cache off)",
        }
        for row in restore["samples"]:
            if row.get("name") not in names:
                continue
            lines.append(
                f"| {names[row['name']]} | {row.get('cache_tier') or '-'} | {row['prompt_tokens']} "
                f"| {row['cached_tokens']} | {_num(row.get('restore_ms'), '.1f')} "
                f"| {_num(row['ttft_s'])} | {_num(row.get('server_ttft_ms'), '.1f')} |"
            )
    lines += ["", f"Targets (issue 34) on {result['cpu']}:", ""]
    lines += [f"- **{t['status']}**: {t['target']}: {t['measured']}" for t in result["targets"]]
    return "\n".join(lines)


# -- the command -----------------------------------------------------------------------------


def worker_peak_bytes(pid: int) -> int:
    """The model worker's own VmHWM: the web process's largest child (the other, if any, is
    multiprocessing's resource tracker)."""
    import psutil

    children = psutil.Process(pid).children()
    return max((peak_rss_bytes(c.pid, children=False) for c in children), default=0)


def setting(settings: dict[str, str], name: str, field_name: str) -> str:
    """A sidecar setting as the run's sidecars get it: given, else the environment's, else the
    default."""
    raw = settings.get(name) or os.environ.get(name, "").strip()
    return raw or str(Settings.model_fields[field_name].default)


def main(args: argparse.Namespace) -> dict[str, Any]:
    settle(args)
    settings = sidecar_settings(args)
    result: dict[str, Any] = {
        "cpu": cpu_name(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    with tempfile.TemporaryDirectory(prefix="bench-users-turns-") as tmp:
        scratch = Path(tmp)
        model_dir = ensure_model(args, scratch, REPO / "build").resolve()
        result["model"] = str(model_dir)
        tokenizer = ChatTokenizer.load(str(model_dir))
        gguf = peer_model(model_dir, scratch) if args.peers else None
        if args.plan_memory_gb:
            result["plan"] = plan_kv_memory(
                model_dir, scratch, settings, args.prompt_cache_dir, args.plan_memory_gb
            )
            settings["KV_MEMORY_MB"] = str(result["plan"]["kv_memory_mb"])
        result["settings"] = dict(settings)
        result["prompt_cache_mb"] = int(setting(settings, "PROMPT_CACHE_MB", "prompt_cache_mb"))
        print("one user alone:", flush=True)
        with phase_sidecar(model_dir, scratch, "alone", settings, args.prompt_cache_dir) as alone:
            kv_memory_line(alone)  # the tiers are the batched path's: fail now if it is off
            samples = run_alone(alone, args)
        print("users taking turns:", flush=True)
        with contextlib.ExitStack() as stack:
            service = stack.enter_context(
                phase_sidecar(model_dir, scratch, "users", settings, args.prompt_cache_dir)
            )
            llama = start_llama(stack, args, gguf, scratch, result)
            samples += run_users(service, args, llama.url if llama else None, tokenizer)
            result["kv_memory"] = kv_memory_line(service)
            rss = {
                "sidecar worker": worker_peak_bytes(service.process.pid),
                "sidecar (web + worker)": peak_rss_bytes(service.process.pid),
            }
            if llama is not None:
                rss["llama-server"] = peak_rss_bytes(llama.process.pid)
            result["peak_rss_bytes"] = rss
        if args.restore_tokens and setting(settings, "KV_COMPACT", "kv_compact") != "off":
            print("restoring one conversation:", flush=True)
            result["restore"] = run_restore(model_dir, scratch, settings, args, tokenizer)
    result["samples"] = samples
    result["turns"] = turn_table(samples, args.turns)
    result["targets"] = targets(result)
    result["when"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    print()
    print(markdown(result))
    return result


def start_llama(
    stack: contextlib.ExitStack,
    args: argparse.Namespace,
    gguf: Path | None,
    scratch: Path,
    result: dict[str, Any],
) -> services.Service | None:
    """--peers: llama-server on the GGUF, one slot, --peer-context tokens, our thread count."""
    if gguf is None:
        return None
    from scripts.bench.peers import llamacpp
    from sidecar.model.cpus import cpu_budget

    threads = cpu_budget().count
    shape = {"threads": threads, "slots": 1, "context": args.peer_context}
    server = stack.enter_context(llamacpp.server(gguf, scratch / "llama-server.log", **shape))
    result["peers"] = {
        "version": f"llama.cpp llama-server {llamacpp.version()}",
        "args": llamacpp.server_args(gguf, port=0, **shape)[1:],
        "gguf": str(gguf),
    }
    print(f"llama-server: {threads} threads, 1 slot, context {args.peer_context}", flush=True)
    return server
