"""Hold many idle and slow connections open against the chat app; time /healthz and a chat.

A slowloris-style load, on loopback only, bounded in count and time: `--idle` connections send
the start of a request's headers and then nothing, `--drip` connections send a request's
headers one byte a second. Meanwhile /healthz is probed twice a second and one chat is sent.
Prints how long /healthz and the chat took, and how long the server held the slow connections
before it closed them.

    python scripts/measure_slow_clients.py                     # tiny model, the app as deployed
    python scripts/measure_slow_clients.py --app-url http://127.0.0.1:8080 --idle 200 --drip 100
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from scripts import services

PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"  # never finished
DRIP = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"


@dataclass
class Result:
    connections: int
    health_ms: list[float] = field(default_factory=list)
    health_failures: int = 0
    chat_s: float | None = None
    held_s: list[float] = field(default_factory=list)  # until the server closed each one
    still_open: int = 0

    def summary(self) -> str:
        def pct(values: list[float], q: float) -> float:
            return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else 0.0

        health = self.health_ms
        held = self.held_s
        lines = [
            f"slow connections held open: {self.connections}",
            f"/healthz: {len(health)} answered, {self.health_failures} failed; "
            f"p50 {pct(health, 0.5):.1f} ms, p99 {pct(health, 0.99):.1f} ms, "
            f"max {max(health, default=0):.1f} ms",
            "one chat: " + ("failed" if self.chat_s is None else f"done in {self.chat_s:.2f} s"),
            f"slow connections closed by the server: {len(held)} "
            + (
                f"(after median {statistics.median(held):.1f} s, at most {max(held):.1f} s)"
                if held
                else ""
            )
            + f"; still open at the end: {self.still_open}",
        ]
        return "\n".join(lines)


def _hold(
    host: str, port: int, payload: bytes, per_second: int, stop: threading.Event
) -> float | None:
    """Open a connection, send `payload` (all at once if per_second is 0, else that many
    bytes a second) and wait; the seconds until the server closed it, None if it did not."""
    began = time.monotonic()
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.settimeout(0.2)
        sent = 0 if per_second else len(payload)
        if not per_second:
            sock.sendall(payload)
        while not stop.is_set():
            if per_second and sent < len(payload):
                try:
                    sock.sendall(payload[sent : sent + per_second])
                except OSError:
                    return time.monotonic() - began
                sent += per_second
            try:
                if sock.recv(4096) == b"":
                    return time.monotonic() - began
                if per_second == 0 or sent >= len(payload):
                    continue  # an answer (to a finished drip): wait for the close
            except TimeoutError:
                pass
            except OSError:
                return time.monotonic() - began
            stop.wait(1.0 if per_second else 0.2)
    return None


def measure(app_url: str, idle: int, drip: int, seconds: float) -> Result:
    """The load for `seconds`: `idle` + `drip` slow connections, /healthz probes, one chat."""
    parts = urlsplit(app_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    result = Result(idle + drip)
    stop = threading.Event()
    lock = threading.Lock()
    outcomes: list[float | None] = []

    def hold(payload: bytes, per_second: int) -> None:
        try:
            held = _hold(host, port, payload, per_second, stop)
        except OSError:
            held = 0.0  # refused or reset at once: not held
        with lock:
            outcomes.append(held)

    threads = [threading.Thread(target=hold, args=(PARTIAL, 0)) for _ in range(idle)]
    threads += [threading.Thread(target=hold, args=(DRIP, 1)) for _ in range(drip)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # let them all connect and start sending
    deadline = time.monotonic() + seconds
    chat_at = time.monotonic() + seconds / 3
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < deadline:
            began = time.monotonic()
            try:
                client.get(app_url + "/healthz", timeout=5).raise_for_status()
                result.health_ms.append((time.monotonic() - began) * 1000)
            except httpx.HTTPError:
                result.health_failures += 1
            if result.chat_s is None and time.monotonic() >= chat_at:
                result.chat_s = _chat(client, app_url)
            time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join(10)
    result.held_s = sorted(h for h in outcomes if h is not None and h > 0)
    result.still_open = sum(1 for h in outcomes if h is None)
    return result


def _chat(client: httpx.Client, app_url: str) -> float | None:
    began = time.monotonic()
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_new_tokens": 8}
    with contextlib.suppress(httpx.HTTPError):
        response = client.post(app_url + "/chat", json=body, timeout=10)
        if response.status_code == 200 and '"done":true' in response.text:
            return time.monotonic() - began
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--app-url", help="a running chat app (default: start the pair here)")
    parser.add_argument("--idle", type=int, default=150, help="connections that stall")
    parser.add_argument("--drip", type=int, default=50, help="connections at one byte a second")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to hold the load")
    args = parser.parse_args()
    if args.idle + args.drip > 1000 or args.seconds > 300:
        parser.error("at most 1000 connections and 300 seconds")
    if args.app_url:
        print(measure(args.app_url, args.idle, args.drip, args.seconds).summary())
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny"
        subprocess.run(
            [sys.executable, str(services.REPO / "scripts" / "make_model.py"), "--preset", "tiny",
             "--out", str(model)],
            check=True,
            capture_output=True,
        )  # fmt: skip
        with (
            services.sidecar(model, Path(tmp) / "sidecar.log") as sidecar,
            services.chatapp(sidecar.url, Path(tmp) / "app.log") as app,
        ):
            print(measure(app.url, args.idle, args.drip, args.seconds).summary())


if __name__ == "__main__":
    main()
