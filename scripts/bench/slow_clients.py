"""Hold many idle and slow connections open against a service; time /healthz and a chat.

A slowloris-style load, on loopback only, bounded in count and time, in four kinds:

- `--idle`: the start of a request's headers, then nothing (stalled headers);
- `--drip`: a request's headers one byte a second;
- `--stalled-body`: complete headers of a chat with a Content-Length of 4096, 16 bytes of it,
  then nothing (stalled body);
- `--endless-body`: complete headers of a chunked chat, then a one-byte chunk a second, never
  the last chunk.

Meanwhile /healthz is probed twice a second and one chat is sent. Prints how long /healthz and
the chat took, and for each kind how long the server held the connections before it closed
them. The target is the chat app (`POST /chat`) or, with `--sidecar`, the sidecar
(`POST /v1/chat/completions`).

    python -m scripts.bench slow-clients                     # tiny model, the app as deployed
    python -m scripts.bench slow-clients --sidecar --stalled-body 100 --endless-body 100
    python -m scripts.bench slow-clients --url http://127.0.0.1:8080 --idle 200 --drip 100
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from scripts.bench.common import BadArguments
from scripts.run import services

PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"  # never finished
DRIP = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
KINDS = ("idle", "drip", "stalled_body", "endless_body")
APP_CHAT = "/chat"
SIDECAR_CHAT = "/v1/chat/completions"


def stalled_body(path: str) -> bytes:
    """Complete headers announcing 4096 bytes of body, and only the first 16 of them."""
    head = f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    return (head + "Content-Length: 4096\r\n\r\n").encode() + b'{"messages": [  '


def endless_head(path: str) -> bytes:
    """Complete headers of a chunked body, whose chunks endless_chunks() sends."""
    head = f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    return (head + "Transfer-Encoding: chunked\r\n\r\n").encode()


def endless_chunks() -> Iterator[bytes]:
    return itertools.repeat(b"1\r\n \r\n")  # one space a chunk: JSON that never ends


@dataclass
class Result:
    connections: dict[str, int]
    health_ms: list[float] = field(default_factory=list)
    health_failures: int = 0
    chat_s: float | None = None
    held_s: dict[str, list[float]] = field(default_factory=dict)  # until the server closed it
    still_open: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        def pct(values: list[float], q: float) -> float:
            return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else 0.0

        health = self.health_ms
        lines = [
            "slow connections held open: "
            + ", ".join(f"{n} {kind}" for kind, n in self.connections.items() if n),
            f"/healthz: {len(health)} answered, {self.health_failures} failed; "
            f"p50 {pct(health, 0.5):.1f} ms, p99 {pct(health, 0.99):.1f} ms, "
            f"max {max(health, default=0):.1f} ms",
            "one chat: " + ("failed" if self.chat_s is None else f"done in {self.chat_s:.2f} s"),
        ]
        for kind, count in self.connections.items():
            if not count:
                continue
            held = self.held_s.get(kind, [])
            lines.append(
                f"{kind}: closed by the server {len(held)} of {count}"
                + (
                    f" (after median {statistics.median(held):.1f} s, at most {max(held):.1f} s)"
                    if held
                    else ""
                )
                + f"; still open at the end: {self.still_open.get(kind, 0)}"
            )
        return "\n".join(lines)


def _hold(
    host: str, port: int, head: bytes, drip: Iterator[bytes] | None, stop: threading.Event
) -> float | None:
    """Open a connection, send `head` at once, then the next piece of `drip` (if any) every
    second, and wait; the seconds until the server closed it, None if it did not."""
    began = time.monotonic()
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.settimeout(0.2)
        if head:
            sock.sendall(head)
        while not stop.is_set():
            piece = next(drip, None) if drip is not None else None
            if piece is not None:
                try:
                    sock.sendall(piece)
                except OSError:
                    return time.monotonic() - began
            try:
                if sock.recv(4096) == b"":
                    return time.monotonic() - began
                continue  # an answer (a 408, or to a finished drip): wait for the close
            except TimeoutError:
                pass
            except OSError:
                return time.monotonic() - began
            stop.wait(1.0 if drip is not None else 0.2)
    return None


def _connections(kind: str, chat_path: str) -> tuple[bytes, Iterator[bytes] | None]:
    if kind == "idle":
        return PARTIAL, None
    if kind == "drip":
        return b"", (DRIP[i : i + 1] for i in range(len(DRIP)))
    if kind == "stalled_body":
        return stalled_body(chat_path), None
    return endless_head(chat_path), endless_chunks()


def measure(
    url: str,
    idle: int = 0,
    drip: int = 0,
    seconds: float = 20.0,
    *,
    stalled_body: int = 0,
    endless_body: int = 0,
    sidecar: bool = False,
) -> Result:
    """The load for `seconds`: the slow connections of each kind, /healthz probes, one chat
    (to the chat app, or with `sidecar` to the sidecar's /v1/chat/completions)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    chat_path = SIDECAR_CHAT if sidecar else APP_CHAT
    counts = dict(zip(KINDS, (idle, drip, stalled_body, endless_body), strict=True))
    result = Result(counts)
    stop = threading.Event()
    lock = threading.Lock()
    outcomes: dict[str, list[float | None]] = {kind: [] for kind in KINDS}

    def hold(kind: str) -> None:
        head, pieces = _connections(kind, chat_path)
        try:
            held = _hold(host, port, head, pieces, stop)
        except OSError:
            held = 0.0  # refused or reset at once: not held
        with lock:
            outcomes[kind].append(held)

    threads = [
        threading.Thread(target=hold, args=(kind,)) for kind in KINDS for _ in range(counts[kind])
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # let them all connect and start sending
    deadline = time.monotonic() + seconds
    chat_at = time.monotonic() + seconds / 3
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < deadline:
            began = time.monotonic()
            try:
                client.get(url + "/healthz", timeout=5).raise_for_status()
                result.health_ms.append((time.monotonic() - began) * 1000)
            except httpx.HTTPError:
                result.health_failures += 1
            if result.chat_s is None and time.monotonic() >= chat_at:
                result.chat_s = _chat(client, url, sidecar)
            time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join(10)
    for kind, held in outcomes.items():
        result.held_s[kind] = sorted(h for h in held if h is not None and h > 0)
        result.still_open[kind] = sum(1 for h in held if h is None)
    return result


def _chat(client: httpx.Client, url: str, sidecar: bool) -> float | None:
    began = time.monotonic()
    body = {"messages": [{"role": "user", "content": "Hello"}]}
    with contextlib.suppress(httpx.HTTPError):
        if sidecar:
            response = client.post(url + SIDECAR_CHAT, json={**body, "max_tokens": 8}, timeout=10)
            done = response.status_code == 200 and response.json().get("choices")
        else:
            response = client.post(url + APP_CHAT, json={**body, "max_new_tokens": 8}, timeout=10)
            done = response.status_code == 200 and '"done":true' in response.text
        if done:
            return time.monotonic() - began
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", "--app-url", help="a running service (default: start the pair)")
    parser.add_argument("--sidecar", action="store_true", help="load the sidecar, not the app")
    parser.add_argument("--idle", type=int, default=150, help="connections that stall headers")
    parser.add_argument("--drip", type=int, default=50, help="headers at one byte a second")
    parser.add_argument("--stalled-body", type=int, default=0, help="bodies that stall")
    parser.add_argument("--endless-body", type=int, default=0, help="chunked, a byte a second")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to hold the load")


def main(args: argparse.Namespace) -> dict[str, Any]:
    total = args.idle + args.drip + args.stalled_body + args.endless_body
    if total > 1000 or args.seconds > 300:
        raise BadArguments("at most 1000 connections and 300 seconds")
    load = {
        "idle": args.idle,
        "drip": args.drip,
        "seconds": args.seconds,
        "stalled_body": args.stalled_body,
        "endless_body": args.endless_body,
        "sidecar": args.sidecar,
    }
    if args.url:
        result = measure(args.url, **load)
        print(result.summary())
        return {"url": args.url, "load": load} | asdict(result)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny"
        subprocess.run(
            [sys.executable, "-m", "scripts.models.make_model", "--preset", "tiny",
             "--out", str(model)],
            check=True,
            capture_output=True,
        )  # fmt: skip
        with (
            services.sidecar(model, Path(tmp) / "sidecar.log") as sidecar,
            services.chatapp(sidecar.url, Path(tmp) / "app.log") as app,
        ):
            result = measure(sidecar.url if args.sidecar else app.url, **load)
    print(result.summary())
    return {"url": "the tiny model's pair, started here", "load": load} | asdict(result)
