"""`GET /healthz`: this app is alive (always 200 while it runs) and how the sidecar is doing.

Body: `{"status": "ok", "model": str | null, "sidecar": {"reachable": bool, "ready": bool,
"detail"?: {...}}}`, where `detail` is the sidecar's own `/readyz` JSON (for example its loading
phase) and `model` the model's display name when the sidecar reports one there
(`detail.model`), else null. The page polls it to show "model loading" before the first message
and to name the model.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify

bp = Blueprint("health", __name__)


def _model_name(sidecar: dict[str, Any]) -> str | None:
    detail = sidecar.get("detail")
    name = detail.get("model") if isinstance(detail, dict) else None
    if not isinstance(name, str) or not name.strip():
        return None
    return name.strip()[:100]


@bp.get("/healthz")
def healthz() -> Response:
    sidecar = current_app.extensions["sidecar"].readiness()
    response = jsonify({"status": "ok", "model": _model_name(sidecar), "sidecar": sidecar})
    response.headers["Cache-Control"] = "no-store"
    return response
