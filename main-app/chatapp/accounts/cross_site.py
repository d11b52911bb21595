"""Writes only the page can make: a state-changing request (POST, PUT, PATCH, DELETE) whose
`Sec-Fetch-Site` says it comes from another site, or whose `Origin` names another host, is
refused 403 `cross_site` before any route runs.

A browser sends these headers with every such request and a page cannot forge them, so another
site's page cannot make a signed-in person's browser write here (its cookies, Easy Auth's
included, would go along). Scripts and tools that send neither header (curl, the benchmarks)
are not browsers and keep working. `Sec-Fetch-Site: same-origin` or `none` (the person's own
action) passes; `same-site` does not (another app on the same parent domain is another site).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import Flask, request

from chatapp.errors import ApiError

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ALLOWED_FETCH_SITES = frozenset({"same-origin", "none"})


def refused() -> ApiError:
    return ApiError(
        "cross_site", "This request came from another site; it is not accepted.", status=403
    )


def is_cross_site(method: str, host: str, origin: str | None, fetch_site: str | None) -> bool:
    if method not in WRITES:
        return False
    if fetch_site is not None and fetch_site.strip().lower() not in ALLOWED_FETCH_SITES:
        return True
    if origin is None:
        return False
    # The origin's host[:port] against the Host the browser sent it to: the scheme is left
    # out, since a TLS front end (App Service's) hands the app plain HTTP.
    try:
        netloc = urlsplit(origin.strip()).netloc.lower()
    except ValueError:
        return True
    return not netloc or netloc != host.strip().lower()


def _check() -> None:
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if is_cross_site(request.method, request.host, request.headers.get("Origin"), fetch_site):
        raise refused()


def install(app: Flask) -> None:
    app.before_request(_check)
