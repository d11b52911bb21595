"""Which Host names the app answers, checked before anything else of a request runs.

Against DNS rebinding: a page on a name its owner makes resolve to 127.0.0.1 is, to the
browser, the same origin as the app it reaches there, so the cross-site check
(accounts/cross_site.py) lets its writes through, and it can read the answers; only the Host
header still says the name the browser thinks it is talking to. So the app answers only the
names it is meant to be reached by (`allowed`):

- `ALLOWED_HOSTS` (names, `*.example.com` for the subdomains, `*` for any), else the loopback
  names (`make run`, a published compose port: http://localhost:8080);
- plus `WEBSITE_HOSTNAME`, which App Service sets to the site's own name. A custom domain
  goes into `ALLOWED_HOSTS`.

Any other name is refused 400 `invalid_host`, with the JSON error envelope. The probes
(`/healthz`, `/readyz`, `/metrics`) are answered whatever the name: a Kubernetes probe, a load
balancer or a scraper asks by the pod's address or a service name, and they say nothing of a
person's and change nothing. Host names are compared in lower case (RFC 9110; issue 25), a
port is ignored, and a value that is no host name (`evil.com#.example.com`) matches nothing.
The same rule as the sidecar's (sidecar/web/guards/access.py; tests/test_contracts.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
PROBES = frozenset({"/healthz", "/readyz", "/metrics"})

# A Host value this app can be named by: a DNS name or IPv4 address, or an IPv6 literal; with
# an optional port. Anything else is refused before a pattern is tried.
_NAME = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*\.?"
HOST = re.compile(rf"(?P<name>{_NAME}|\[[0-9a-f:.]+\])(?::[0-9]{{1,5}})?")

_REFUSAL = json.dumps(
    {"error": {"message": "This host name is not served here.", "type": "invalid_host"}}
).encode()


def allowed(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The Host patterns the app answers; () when any is."""
    listed = config["ALLOWED_HOSTS"]
    if listed is not None and "*" in listed:
        return ()
    names = [*(LOOPBACK if listed is None else listed)]
    if config["WEBSITE_HOSTNAME"]:
        names.append(config["WEBSITE_HOSTNAME"])
    return tuple(dict.fromkeys(name.lower() for name in names))


def host_allowed(raw: str, patterns: tuple[str, ...]) -> bool:
    match = HOST.fullmatch(raw.strip().lower())
    if match is None:
        return False
    host = match.group("name").rstrip(".")
    for pattern in patterns:
        if pattern == "*" or pattern == host:
            return True
        if pattern.startswith("*.") and host.endswith(pattern[1:]):
            return True
    return False


class AllowedHosts:
    """WSGI middleware: the Host lower-cased for Flask (which compares names exactly), and
    refused unless `patterns` (`allowed`) name it."""

    def __init__(self, app: WSGIApplication, patterns: tuple[str, ...]) -> None:
        self.app = app
        self.patterns = patterns

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        host = environ.get("HTTP_HOST", "")
        if host:
            environ["HTTP_HOST"] = host.lower()
        if (
            self.patterns
            and environ.get("PATH_INFO") not in PROBES
            and not host_allowed(host, self.patterns)
        ):
            headers = [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(_REFUSAL))),
                ("Cache-Control", "no-store"),
            ]
            start_response("400 BAD REQUEST", headers)
            return [_REFUSAL]
        return self.app(environ, start_response)
