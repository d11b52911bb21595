"""The chat store's targets (issue 43), on SQLite and on PostgreSQL:

- opening a chat of 200 messages (`GET /api/chats/<id>`): p95 <= 50 ms;
- with 100 users x 50 chats x 20 messages: the chat list (`GET /api/chats`) and a full-text
  search (`GET /api/chats?q=WORD`), p95 <= 100 ms each;
- what keeping a chat adds to its time to first token: `POST /chat` with a `chat_id` reads the
  stored turns before the model service is asked (chatapp/chats/turns.py `start`), p95 <= 5 ms;
  the turn is written after the reply ends (`StoredTurn.end`, shown, not on the TTFT path).

The routes run in the app itself (Flask's test client: no network, no model), against a
SQLite file and the embedded PostgreSQL 18 (scripts/run/postgres.py, as the tests use). Then,
unless `--chat-runs 0`, the same target through `POST /chat` over HTTP (store_chat.py):
gunicorn in front of a sidecar on a generated model (`--preset tiny` by default, or
`--model DIR`), a turn of a stored chat (`chat_id`) against the same turn with its whole
history in the request, interleaved pairs, each on a fresh cache scope.

    python -m scripts.bench store [--engines sqlite,postgresql] [--users 100] [--chats 50]
        [--messages 20] [--long 200] [--runs 200] [--chat-runs 30] [--preset tiny]
        [--model DIR] [--max-new-tokens 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scripts.bench.common import PRESET_DIRS, BadArguments

TARGETS_MS = {
    "open 200-message chat": 50.0,  # the targets hold at the default sizes
    "chat list": 100.0,
    "search": 100.0,
    "turn read, 20-message chat": 5.0,
    "turn read, 200-message chat": 5.0,
}
VOCABULARY = (
    "apple river mountain cloud engine window garden silver rocket planet ocean forest "
    "lantern bridge castle desert island jungle meadow valley harbor canyon glacier volcano "
    "thunder whisper shadow crystal ember falcon otter walrus penguin tiger zebra violin piano "
    "guitar trumpet museum library theatre stadium market bakery kitchen pepper onion carrot "
    "tomato lemon mango cherry quantum kernel compiler network socket thread buffer cache "
    "vector matrix tensor gradient python rust kotlin haskell erlang docker cluster ingress"
)
WORDS = VOCABULARY.split()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engines", default="sqlite,postgresql", help="comma-separated")
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--chats", type=int, default=50, help="chats per user")
    parser.add_argument("--messages", type=int, default=20, help="messages per chat")
    parser.add_argument("--long", type=int, default=200, help="messages of the chat opened")
    parser.add_argument("--runs", type=int, default=200, help="timed requests per figure")
    parser.add_argument(
        "--chat-runs", type=int, default=30, help="timed pairs through POST /chat (0: none)"
    )
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESET_DIRS))
    parser.add_argument("--model", help="model folder (default: generated, see --preset)")
    parser.add_argument("--max-new-tokens", type=int, default=2)


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))


def populate(url: str, args: argparse.Namespace, rng: random.Random) -> tuple[list[str], str, str]:
    """Users x chats x messages written in bulk; (the users' subjects, the id of user 1's long
    chat, the id of one of user 1's ordinary chats)."""
    import datetime as dt

    from sqlalchemy import insert

    from chatapp.store import Store, migrate
    from chatapp.store.models import Chat, Message, User, new_chat_id

    store = Store.open(url)
    migrate.upgrade(store.engine)
    now = dt.datetime.now(dt.UTC)
    subjects = [f"appservice:user-{n}" for n in range(args.users)]
    with store.session(write=True) as session:
        session.execute(
            insert(User), [{"subject": s, "name": None, "created_at": now} for s in subjects]
        )
    long_chat = short_chat = ""
    for owner in range(1, args.users + 1):
        chats, messages = [], []
        for c in range(args.chats):
            chat_id = new_chat_id()
            moment = now - dt.timedelta(minutes=rng.randint(0, 60 * 24 * 90))
            title = " ".join(rng.choice(WORDS) for _ in range(3))
            chats.append(
                {
                    "id": chat_id,
                    "owner_id": owner,
                    "title": title,
                    "created_at": moment,
                    "updated_at": moment,
                }
            )
            count = args.long if owner == 1 and c == 0 else args.messages
            if owner == 1 and c == 0:
                long_chat = chat_id
            elif owner == 1 and c == 1:
                short_chat = chat_id
            for position in range(count):
                messages.append(
                    {
                        "chat_id": chat_id,
                        "owner_id": owner,
                        "position": position,
                        "role": "user" if position % 2 == 0 else "assistant",
                        "content": _sentence(rng),
                        "images": None,
                        "finish": None,
                        "citations": None,
                        "created_at": moment,
                    }
                )
        with store.session(write=True) as session:
            session.execute(insert(Chat), chats)
            session.execute(insert(Message), messages)
    store.close()
    return subjects, long_chat, short_chat or long_chat


def timed(action: Callable[[], Any], runs: int) -> list[float]:
    action()  # warm: the first of each kind compiles and caches statements
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000)
    return times


def p95(values: list[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[94]


def measure(url: str, args: argparse.Namespace) -> dict[str, list[float]]:
    from chatapp import create_app
    from chatapp.accounts import CurrentUser
    from chatapp.chats import turns
    from chatapp.store import Store

    rng = random.Random(43)
    subjects, long_chat, short_chat = populate(url, args, rng)
    app = create_app({"TESTING": True, "DATABASE_URL": url, "AUTH_MODE": "appservice"})
    client = app.test_client()

    def as_user(n: int) -> dict[str, str]:
        return {"X-MS-CLIENT-PRINCIPAL-ID": subjects[n].split(":", 1)[1]}

    def ok(response: Any) -> None:
        assert response.status_code == 200, response.status_code

    results = {
        f"open {args.long}-message chat": timed(
            lambda: ok(client.get(f"/api/chats/{long_chat}", headers=as_user(0))), args.runs
        ),
        "chat list": timed(
            lambda: ok(client.get("/api/chats", headers=as_user(rng.randrange(args.users)))),
            args.runs,
        ),
        "search": timed(
            lambda: ok(
                client.get(
                    f"/api/chats?q={rng.choice(WORDS)[:5]}",
                    headers=as_user(rng.randrange(args.users)),
                )
            ),
            args.runs,
        ),
    }
    store: Store = app.extensions["store"]
    user = CurrentUser(1, subjects[0], None)
    config = app.config

    def turn_read(chat_id: str) -> None:
        payload = {"messages": [{"role": "user", "content": "and then?"}]}
        turns.start(store, user, chat_id, payload, config)

    results[f"turn read, {args.messages}-message chat"] = timed(
        lambda: turn_read(short_chat), args.runs
    )
    results[f"turn read, {args.long}-message chat"] = timed(lambda: turn_read(long_chat), args.runs)
    payload = {"messages": [{"role": "user", "content": "and then?"}]}
    stored = turns.start(store, user, long_chat, payload, config)
    results["turn write (after the reply)"] = timed(
        lambda: stored.end("a reply " * 50, "stop", True), min(args.runs, 50)
    )
    store.close()
    return results


def main(args: argparse.Namespace) -> dict[str, Any]:
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or set(engines) - {"sqlite", "postgresql"}:
        raise BadArguments("--engines takes sqlite and/or postgresql")
    if min(args.users, args.chats, args.messages, args.long, args.runs) < 1:
        raise BadArguments("--users, --chats, --messages, --long and --runs must be >= 1")
    if args.chat_runs < 0 or args.max_new_tokens < 1:
        raise BadArguments("--chat-runs must be >= 0 and --max-new-tokens >= 1")
    out: dict[str, Any] = {"targets_ms": TARGETS_MS, "engines": {}}
    print(
        f"{args.users} users x {args.chats} chats x {args.messages} messages, one chat of "
        f"{args.long}; {args.runs} timed requests each (ms)"
    )
    print(f"{'engine':<11} {'figure':<30} {'p50':>7} {'p95':>7} {'target':>7}  ")
    for engine in engines:
        with tempfile.TemporaryDirectory(prefix="bench-store-") as scratch:
            results = measure(_database(engine, scratch), args)
        out["engines"][engine] = {}
        for figure, values in results.items():
            target = TARGETS_MS.get(figure)
            middle, high = statistics.median(values), p95(values)
            out["engines"][engine][figure] = {"p50": middle, "p95": high, "target": target}
            verdict = "" if target is None else ("ok" if high <= target else "OVER")
            shown = "-" if target is None else f"{target:.0f}"
            print(f"{engine:<11} {figure:<30} {middle:>7.1f} {high:>7.1f} {shown:>7}  {verdict}")
    if args.chat_runs:
        out["through_chat"] = through_chat(engines, args)
    return out


def _database(engine: str, scratch: str) -> str:
    if engine == "sqlite":
        return f"sqlite:///{Path(scratch) / 'chats.db'}"
    from scripts.run import postgres

    return postgres.fresh_database(postgres.start())


def through_chat(engines: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """What storing adds to TTFT through POST /chat over HTTP (store_chat.py), per engine."""
    from scripts.bench import store_chat
    from scripts.bench.common import ensure_model
    from scripts.run import services

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-store-chat-") as scratch:
        model = ensure_model(args, Path(scratch))
        with services.sidecar(model, Path(scratch) / "sidecar.log") as sidecar:
            print(
                f"\nthrough POST /chat (gunicorn, a sidecar on {model.name}), "
                f"{args.chat_runs} interleaved pairs, the client's time to first token (ms): "
                "a turn with chat_id against the same turn with its history sent"
            )
            print(store_chat.HEADER)
            for engine in engines:
                with tempfile.TemporaryDirectory(prefix="bench-store-db-") as db_scratch:
                    url = _database(engine, db_scratch)
                    results = store_chat.measure(url, sidecar.url, Path(scratch), args, WORDS)
                out[engine] = store_chat.report(engine, results)
    return out
