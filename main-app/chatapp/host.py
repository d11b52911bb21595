"""Host names are case-insensitive (RFC 9110): the Host header is lower-cased before Flask
compares it with ALLOWED_HOSTS (its TRUSTED_HOSTS compare exactly, so `CHAT.EXAMPLE.COM` was
refused 400 invalid_host while `chat.example.com` was served)."""

from __future__ import annotations

from collections.abc import Iterable
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment


class LowerCaseHost:
    def __init__(self, app: WSGIApplication) -> None:
        self.app = app

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        host = environ.get("HTTP_HOST")
        if host:
            environ["HTTP_HOST"] = host.lower()
        return self.app(environ, start_response)
