"""Who may talk to the sidecar: an optional API key, and the host names it answers.

On App Service only the main container receives outside traffic and the sidecar is reached at
localhost: no key is needed, and the loopback names are all it answers by default. Set a key
when the sidecar's port is reachable by others (a published compose port, a Kubernetes
Service, a laptop on a shared network), and list the names it is reached by.

- API_KEY: one or more keys, comma-separated. Requests must send `Authorization: Bearer <key>`
  (what OpenAI clients send with api_key=...). Each key is compared in constant time, and all of
  them always are, so the answer's timing says nothing about a key. /healthz, /readyz and
  /metrics stay open for probes and scrapers unless API_KEY_PROBES=true.
- ALLOWED_HOSTS: the Host header values accepted (a name, `*.example.com`, or `*` for any; a
  port is ignored; default the loopback names), against DNS rebinding (a page on a name made
  to resolve to 127.0.0.1 is the same origin as the sidecar there, and could use its routes)
  and requests meant for another site. The probes answer any name, as they answer without a
  key: probes and scrapers ask by an address or a service name. The same rule as the app's
  (chatapp/guards/host.py; tests/test_contracts.py).

Refusals use errors.REFUSALS: 401 `unauthorized` (with `WWW-Authenticate: Bearer`) and 400
`invalid_host`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re

from starlette.types import ASGIApp, Receive, Scope, Send

from sidecar.settings import Settings
from sidecar.web.errors import ApiError

PROBES = frozenset({"/healthz", "/readyz", "/metrics"})

log = logging.getLogger("sidecar.web.access")  # the name its log lines always had


def log_state(settings: Settings) -> None:
    """One line at start: whether authentication is on (how many keys, never the keys) and
    which hosts are served, so that an operator sees an open sidecar at once."""
    keys = len(settings.api_keys)
    fields = {
        "authentication": "on" if keys else "off",
        "api_keys": keys,
        "probes_need_key": bool(keys) and settings.api_key_probes,
        "allowed_hosts": ",".join(settings.allowed_host_patterns) or "*",
    }
    log.info("access", extra={"fields": fields})


class AccessMiddleware:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self._keys = [key.encode() for key in settings.api_keys]
        self._probes_open = not settings.api_key_probes
        self._hosts = settings.allowed_host_patterns

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            error = self._refusal(scope["path"], headers)
            if error is not None:
                record = scope.get("state", {}).get("record")
                if record is not None:
                    record.error_type = error.kind
                await error.response(scope["path"])(scope, receive, send)
                return
            scope.setdefault("state", {})["key_owner"] = self._owner(headers)
        await self.app(scope, receive, send)

    def _owner(self, headers: dict[bytes, bytes]) -> str:
        """Which key the request was let in with, as a fingerprint (what stored responses
        belong to, responses/store.py); "" while API_KEY is unset."""
        if not self._keys:
            return ""
        _, _, token = headers.get(b"authorization", b"").partition(b" ")
        return hashlib.sha256(token.strip()).hexdigest()

    def _refusal(self, path: str, headers: dict[bytes, bytes]) -> ApiError | None:
        host = headers.get(b"host", b"")
        if self._hosts and path not in PROBES and not host_allowed(host, self._hosts):
            return ApiError("invalid_host", "this host name is not served here")
        if self._keys and not (self._probes_open and path in PROBES):
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            given = token.strip() if scheme.lower() == b"bearer" else b""
            # Every key is compared, whatever matches, in constant time each.
            matches = [hmac.compare_digest(given, key) for key in self._keys]
            if not any(matches):
                return ApiError(
                    "unauthorized",
                    "send a valid API key: Authorization: Bearer <key>",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return None


# A Host value this service can be named by: a DNS name or IPv4 address, or an IPv6 literal;
# with an optional port. Anything else (`evil.com#.example.com` ends with `.example.com`) is
# refused before a pattern is tried.
_NAME = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*\.?"
HOST = re.compile(rf"(?P<name>{_NAME}|\[[0-9a-f:.]+\])(?::[0-9]{{1,5}})?")


def host_allowed(raw: bytes, patterns: tuple[str, ...]) -> bool:
    match = HOST.fullmatch(raw.decode("latin-1").strip().lower())
    if match is None:
        return False
    host = match.group("name").rstrip(".")
    for pattern in patterns:
        if pattern == "*" or pattern == host:
            return True
        if pattern.startswith("*.") and host.endswith(pattern[1:]):
            return True
    return False
