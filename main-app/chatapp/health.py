"""`GET /healthz`: this app is alive (always 200 while it runs) and how the sidecar is doing.

Body: `{"status": "ok", "sidecar": {"reachable": bool, "ready": bool, "detail"?: {...}}}`, where
`detail` is the sidecar's own `/readyz` JSON (for example its loading phase). The page polls it
to show "model loading" before the first message.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> Response:
    sidecar = current_app.extensions["sidecar"].readiness()
    response = jsonify({"status": "ok", "sidecar": sidecar})
    response.headers["Cache-Control"] = "no-store"
    return response
