"""Check a deployed chat app: GET /healthz, then one streamed POST /chat reply.

    python -m scripts.run.smoke_test https://app-dev-xxxx.azurewebsites.net [--wait 1800]

The reply must be a 200 `application/x-ndjson` stream of JSON lines that ends with a
`{"done": true, ...}` line. With `--wait`, it first polls /healthz until the sidecar reports
ready (a first start may download the model). Prints one line on success; on failure prints one
sentence to stderr and exits 1. Standard library only, so it runs wherever python3 does.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

DEFAULT_MESSAGE = "Say hello in French, then in Japanese."
POLL_SECONDS = 5.0


class SmokeError(Exception):
    """The deployment failed a check; str() is one sentence."""


def _get_json(url: str, timeout: float) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise SmokeError(f"GET {url} answered {exc.code} instead of 200.") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SmokeError(f"GET {url} failed: {reason}.") from None
    try:
        return json.loads(body)
    except ValueError:
        raise SmokeError(f"GET {url} did not answer JSON.") from None


def check_health(base: str, timeout: float, wait: float) -> dict[str, Any]:
    """GET /healthz; with wait > 0, poll until the sidecar is ready or the time is up."""
    deadline = time.monotonic() + wait
    while True:
        try:
            health = _get_json(base + "/healthz", timeout)
            if not isinstance(health, dict) or health.get("status") != "ok":
                raise SmokeError(f"GET {base}/healthz did not report status ok: {health!r}.")
        except SmokeError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(min(POLL_SECONDS, max(deadline - time.monotonic(), 0.1)))
            continue
        sidecar = health.get("sidecar")
        if wait <= 0 or (isinstance(sidecar, dict) and sidecar.get("ready") is True):
            return health
        if time.monotonic() >= deadline:
            raise SmokeError(
                f"The model service was not ready after {wait:.0f} s (last state: {sidecar!r})."
            )
        time.sleep(min(POLL_SECONDS, max(deadline - time.monotonic(), 0.1)))


def chat(base: str, message: str, timeout: float) -> dict[str, Any]:
    """POST one message to /chat and read the whole NDJSON stream; returns a summary."""
    body = json.dumps({"messages": [{"role": "user", "content": message}]}).encode()
    request = urllib.request.Request(
        base + "/chat",
        data=body,
        headers={"Content-Type": "application/json", "Accept": "application/x-ndjson"},
        method="POST",
    )
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        detail = exc.read(2000).decode("utf-8", "replace").strip()
        raise SmokeError(f"POST {base}/chat answered {exc.code}: {detail[:300]}.") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SmokeError(f"POST {base}/chat failed: {reason}.") from None
    with response:
        content_type = response.headers.get("Content-Type", "")
        if not content_type.startswith("application/x-ndjson"):
            raise SmokeError(f"POST {base}/chat answered {content_type!r}, not NDJSON.")
        return read_stream(response)


def read_stream(response: http.client.HTTPResponse) -> dict[str, Any]:
    """Parse NDJSON lines until the last one; it must be a done line."""
    pieces: list[str] = []
    last: dict[str, Any] | None = None
    try:
        for number, raw in enumerate(response, start=1):
            if not raw.strip():
                continue
            if last is not None:
                raise SmokeError(f"Line {number} of the reply came after its last line.")
            try:
                line = json.loads(raw.decode("utf-8"))
            except ValueError:
                raise SmokeError(f"Line {number} of the reply is not UTF-8 JSON.") from None
            if not isinstance(line, dict):
                raise SmokeError(f"Line {number} of the reply is not a JSON object.")
            if "delta" in line:
                pieces.append(str(line["delta"]))
            elif "error" in line:
                error = line["error"] if isinstance(line["error"], dict) else {}
                raise SmokeError(
                    f"The reply broke off with an error: {error.get('message', line['error'])}"
                )
            elif line.get("done") is True:
                last = line
            elif not line.get("ping"):
                raise SmokeError(f"Line {number} of the reply is not a known line: {line!r}.")
    except (OSError, http.client.HTTPException) as exc:
        raise SmokeError(f"The reply stream was cut off: {exc}.") from None
    if last is None:
        raise SmokeError("The reply stream ended without a done line.")
    return {"reply": "".join(pieces), **last}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Check a deployed chat app: GET /healthz, then one streamed POST /chat."
    )
    parser.add_argument("url", help="base URL of the app, e.g. https://NAME.azurewebsites.net")
    parser.add_argument("--message", default=DEFAULT_MESSAGE, help="the user message to send")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds per request (default 300)"
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        help="seconds to wait for the model service to be ready (default 0: do not wait)",
    )
    args = parser.parse_args(argv)
    base = args.url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        print(f"smoke test failed: {args.url!r} is not an http(s) URL.", file=sys.stderr)
        return 2
    try:
        check_health(base, args.timeout, args.wait)
        result = chat(base, args.message, args.timeout)
    except SmokeError as exc:
        print(f"smoke test failed: {exc}", file=sys.stderr)
        return 1
    reply = result["reply"]
    if not reply.strip():
        print("smoke test failed: the reply was empty.", file=sys.stderr)
        return 1
    shown = reply if len(reply) <= 80 else reply[:77] + "..."
    print(
        f"ok: {base} answered {len(reply)} characters in {result.get('tokens')} pieces "
        f"(first after {result.get('ttft_ms')} ms): {shown!r}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
