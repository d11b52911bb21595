"""store: what keeping a chat adds to its time to first token, measured through `POST /chat`
over real HTTP (issue 43: "at most 5 ms").

The app as production runs it (gunicorn, scripts/run/services.py) in front of a sidecar on a
generated model; one user's chats of `--messages` and `--long` stored messages written in the
database first. Each timed pair, interleaved (which side goes first alternates), asks the same
new question two ways: with `chat_id` (the app reads the stored turns, chatapp/chats/turns.py)
and with the same turns sent in the request, as a browser-held chat does (`conversation_id`).
Time to first token is the client's: from sending the request to reading the first `delta`
line. Every timed request starts a conversation the model service has never seen (a chat of
its own, a `conversation_id` of its own: a fresh cache scope), so both sides read the whole
prompt and the model does the same work (each pair's done lines are checked: the same
`prompt_tokens`, no `cached_tokens`); the difference is what storing adds (reading the stored
turns before the model is asked; the turn's write comes after the reply).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from scripts.run import services

USER = {"X-MS-CLIENT-PRINCIPAL-ID": "bench-user"}
SUBJECT = "appservice:bench-user"
QUESTION = {"role": "user", "content": "And what comes next?"}
TARGET_MS = 5.0
# The app's MAX_MESSAGES for the run: a browser-held chat of 200 turns and its new question is
# one more than the default lets in (the stored side would leave its oldest out: not the same
# prompt).
MAX_MESSAGES = "256"


def history(size: int, rng: random.Random, words: list[str]) -> list[dict[str, str]]:
    """`size` turns, user first, short enough that 200 of them fit one request (64 KiB)."""
    return [
        {
            "role": "user" if n % 2 == 0 else "assistant",
            "content": " ".join(rng.choice(words) for _ in range(rng.randint(4, 12))),
        }
        for n in range(size)
    ]


def seed(url: str, turns: dict[int, list[dict[str, str]]], chats: int) -> dict[int, list[str]]:
    """For each size, `chats` chats of the user holding exactly those turns; their ids."""
    import datetime as dt

    from sqlalchemy import insert

    from chatapp.store import Store, migrate
    from chatapp.store.models import Chat, Message, User, new_chat_id

    store = Store.open(url)
    migrate.upgrade(store.engine)
    now = dt.datetime.now(dt.UTC)
    ids: dict[int, list[str]] = {}
    with store.session(write=True) as session:
        owner = session.scalar(
            insert(User).values(subject=SUBJECT, name=None, created_at=now).returning(User.id)
        )
        for size, messages in turns.items():
            ids[size] = [new_chat_id() for _ in range(chats)]
            session.execute(
                insert(Chat),
                [
                    {
                        "id": i,
                        "owner_id": owner,
                        "title": "bench",
                        "created_at": now,
                        "updated_at": now,
                    }
                    for i in ids[size]
                ],
            )
            rows = [
                {
                    "chat_id": chat_id,
                    "owner_id": owner,
                    "position": position,
                    "role": message["role"],
                    "content": message["content"],
                    "created_at": now,
                }
                for chat_id in ids[size]
                for position, message in enumerate(messages)
            ]
            session.execute(insert(Message), rows)
    store.close()
    return ids


def ttft(client: httpx.Client, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Milliseconds from sending `body` to the first `delta` line, and the done line; the
    reply is read to its end (so a stored chat's turn is written before the next request)."""
    first = None
    started = time.perf_counter()
    with client.stream("POST", "/chat", json=body) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"/chat answered {response.status_code}: {response.text[:300]}")
        last: dict[str, Any] = {}
        for line in response.iter_lines():
            if not line.strip():
                continue
            last = json.loads(line)
            if first is None and "delta" in last:
                first = time.perf_counter()
    if first is None or not last.get("done"):
        raise RuntimeError(f"the reply had no text or no done line: {last}")
    return (first - started) * 1000, last


def written(client: httpx.Client, chat_id: str, length: int) -> None:
    """Wait until the stored chat's turn is written (`StoredTurn.end`, when the server closes
    the reply, which may be after the client read its end), so that no timed request waits
    for the write of the one before it, whichever side came first."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if len(client.get(f"/api/chats/{chat_id}").json()["messages"]) >= length:
            return
        time.sleep(0.005)
    raise RuntimeError("the stored chat's turn was not written within 30 s")


def same_work(by_id: dict[str, Any], whole: dict[str, Any]) -> None:
    """Both sides read the same prompt, none of it from the conversation cache, else the pair
    does not measure what storing adds."""
    if by_id.get("prompt_tokens") != whole.get("prompt_tokens"):
        raise RuntimeError(f"the prompts differ: {by_id} against {whole}")
    if by_id.get("cached_tokens") or whole.get("cached_tokens"):
        raise RuntimeError(f"a prompt came from the cache: {by_id} against {whole}")


def measure(
    database_url: str,
    sidecar_url: str,
    scratch: Path,
    args: argparse.Namespace,
    words: list[str],
) -> dict[int, dict[str, list[float]]]:
    """For each size: the client's TTFT with `chat_id` ("stored") and with the turns sent
    ("sent"), `args.chat_runs` interleaved pairs after one warm pair."""
    rng = random.Random(43)
    sizes = sorted({args.messages, args.long})
    turns = {size: history(size, rng, words) for size in sizes}
    ids = seed(database_url, turns, args.chat_runs + 1)
    common = {"max_new_tokens": args.max_new_tokens, "temperature": 0}
    results: dict[int, dict[str, list[float]]] = {}
    with (
        services.chatapp(
            sidecar_url,
            scratch / f"app-{uuid.uuid4().hex[:8]}.log",
            AUTH_MODE="appservice",
            DATABASE_URL=database_url,
            MAX_MESSAGES=MAX_MESSAGES,
        ) as app,
        httpx.Client(base_url=app.url, headers=USER, timeout=600) as client,
    ):
        for size in sizes:
            stored, sent, prompts = [], [], []
            for run, chat_id in enumerate(ids[size]):
                by_id = {"chat_id": chat_id, "messages": [QUESTION], **common}
                whole = {
                    "conversation_id": uuid.uuid4().hex,
                    "messages": [*turns[size], QUESTION],
                    **common,
                }
                if run % 2 == 0:
                    by_id_ms, by_id_done = ttft(client, by_id)
                    written(client, chat_id, size + 2)
                    whole_ms, whole_done = ttft(client, whole)
                else:
                    whole_ms, whole_done = ttft(client, whole)
                    by_id_ms, by_id_done = ttft(client, by_id)
                    written(client, chat_id, size + 2)
                same_work(by_id_done, whole_done)
                if run > 0:  # the first pair warms the app's worker and the model
                    stored.append(by_id_ms)
                    sent.append(whole_ms)
                    prompts.append(float(by_id_done.get("prompt_tokens") or 0))
            results[size] = {"stored": stored, "sent": sent, "prompt_tokens": prompts}
    return results


def p95(values: list[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[94]


def report(engine: str, results: dict[int, dict[str, list[float]]]) -> dict[str, Any]:
    """Print one row per size; the figures as JSON."""
    out: dict[str, Any] = {}
    for size, sides in results.items():
        stored, sent = sides["stored"], sides["sent"]
        adds_p50 = statistics.median(stored) - statistics.median(sent)
        adds_p95 = p95(stored) - p95(sent)
        verdict = "ok" if adds_p95 <= TARGET_MS else "OVER"
        print(
            f"{engine:<11} {size:>8} {statistics.median(stored):>9.1f} {p95(stored):>9.1f}"
            f" {statistics.median(sent):>9.1f} {p95(sent):>9.1f} {adds_p50:>9.1f}"
            f" {adds_p95:>9.1f} {TARGET_MS:>7.0f}  {verdict}"
        )
        out[f"{size} stored messages"] = {
            "pairs": len(stored),
            "prompt_tokens": statistics.median(sides["prompt_tokens"]),
            "chat_id_p50": statistics.median(stored),
            "chat_id_p95": p95(stored),
            "sent_p50": statistics.median(sent),
            "sent_p95": p95(sent),
            "storing_adds_p50": adds_p50,
            "storing_adds_p95": adds_p95,
            "target": TARGET_MS,
        }
    return out


HEADER = (
    f"{'engine':<11} {'messages':>8} {'chat_id':>9} {'':>9} {'sent':>9} {'':>9}"
    f" {'storing adds':>19} {'target':>7}\n"
    f"{'':<11} {'stored':>8} {'p50':>9} {'p95':>9} {'p50':>9} {'p95':>9} {'p50':>9}"
    f" {'p95':>9} {'p95':>7}"
)
