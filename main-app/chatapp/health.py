"""`GET /healthz`: this app is alive (always 200 while it runs) and how the sidecar is doing.

Body: `{"status": "ok", "model": str | null, "sidecar": {"reachable": bool, "ready": bool,
"error"?: "upstream_unauthorized", "detail"?: {"ready", "phase", "phase_seconds", "model"}}}`
(`error`: the model service refuses this app's key, so no chat can work: not ready, phase
`failed`, though its own open /readyz says ready); `detail` is the part of the
sidecar's own `/readyz` JSON that a browser may see (its load phase and the model's name; not
the reason text, which can name folders and library errors: that stays in the sidecar's log
and its own /readyz). The page polls it to show "model loading" before the first message and
to name the model.
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


PUBLIC_DETAIL = ("ready", "phase", "phase_seconds", "model")


@bp.get("/healthz")
def healthz() -> Response:
    sidecar = current_app.extensions["upstream"].readiness()
    detail = sidecar.get("detail")
    if isinstance(detail, dict):
        sidecar["detail"] = {key: detail[key] for key in PUBLIC_DETAIL if key in detail}
    response = jsonify({"status": "ok", "model": _model_name(sidecar), "sidecar": sidecar})
    response.headers["Cache-Control"] = "no-store"
    return response
