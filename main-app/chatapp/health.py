"""The app's probes: `GET /healthz` (alive, and how the sidecar is doing) and `GET /readyz`
(this instance can serve a chat now).

`/healthz` body: `{"status": "ok", "model": str | null, "sidecar": {"reachable": bool, "ready":
bool, "error"?: "upstream_unauthorized", "detail"?: {"ready", "phase", "phase_seconds",
"model", "image_input"?, "speech"?: {"served", "phase", "max_seconds"?}}}}` (`error`: the
model service refuses this app's key, so no chat can work: not ready, phase `failed`, though
its own open /readyz says ready; `image_input`: true or false when the model service says
whether its model reads images, absent when it does not say, and the page then offers images
anyway; `speech`: whether it transcribes speech, for the page's microphone, absent when it
does not say); `detail` is the part of the sidecar's own `/readyz` JSON that a browser may see
(its load phase and the model's name; not
the reason text, which can name folders and library errors: that stays in the sidecar's log
and its own /readyz). `documents.passages`: how the library's passages are measured,
`{"counted_by": "setting" | "encoder" | "byte_bound", "max_tokens", "reason"?}`
(documents/sizing.py): `byte_bound` with its reason when neither EMBED_TOKENIZER nor the model
service gives the encoder's tokenizer. `documents.encoder`: whether the encoder now served is
the one the library's vectors were made with, `{"state": "same" | "changed" | "unknown",
"remedy"?}` as this process's last search found it (documents/encoder_check.py: /healthz
itself never calls the model service; `unknown`: no search since the start, no vector yet, or
the model service gives none; `changed`: dense and hybrid search fall back to keyword search
and documents fail `encoder_changed` until the operator runs the `remedy`). Always 200 while
the app runs: the page polls it to show "model loading" before the first message and to name
the model, and a liveness probe must not restart the app because the model is still loading.

`/readyz` is for load balancers (App Service's health check path, a Kubernetes readiness
probe): 200 `{"status": "ready", "model"}` only when the sidecar is reachable, ready and
accepts this app's key; else 503 with `Retry-After` and the app's error envelope, whose `type`
says why (`upstream_unavailable`, `loading`, `restarting`, `model_failed`,
`upstream_unauthorized`). It says no more than `/healthz` does: no reason text, no folders.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify

from chatapp.documents.index.vector_space import REMEDY
from chatapp.documents.search.retrieval import Searcher
from chatapp.errors import error_response
from chatapp.relay.upstream import DEFAULT_RETRY_AFTER, NOT_REACHABLE

bp = Blueprint("health", __name__)


def _model_name(sidecar: dict[str, Any]) -> str | None:
    detail = sidecar.get("detail")
    name = detail.get("model") if isinstance(detail, dict) else None
    if not isinstance(name, str) or not name.strip():
        return None
    return name.strip()[:100]


# image_input: whether the model reads images (the sidecar's /readyz once ready; an OpenAI
# server's model list when it says `input_modalities`); absent: unknown. speech: whether the
# page's microphone can be used (relay/upstream_speech.py), without the reason text.
PUBLIC_DETAIL = ("ready", "phase", "phase_seconds", "model", "image_input", "speech")
PUBLIC_SPEECH = ("served", "phase", "max_seconds")


@bp.get("/healthz")
def healthz() -> Response:
    sidecar = current_app.extensions["upstream"].readiness()
    detail = sidecar.get("detail")
    if isinstance(detail, dict):
        public = {key: detail[key] for key in PUBLIC_DETAIL if key in detail}
        if not isinstance(public.get("image_input", False), bool):
            del public["image_input"]  # only a yes or a no means anything to the page
        speech = public.pop("speech", None)
        if isinstance(speech, dict):
            public["speech"] = {key: speech[key] for key in PUBLIC_SPEECH if key in speech}
        sidecar["detail"] = public
    # How the library's passages are measured (documents/sizing.py): the byte bound, and why,
    # is said here rather than found later in smaller passages and worse search.
    searcher = current_app.extensions["documents"].searcher
    passages = searcher.sizing.current().public()
    body = {"status": "ok", "model": _model_name(sidecar), "sidecar": sidecar}
    documents = {"passages": passages, "encoder": _encoder(searcher)}
    response = jsonify(body | {"documents": documents})
    response.headers["Cache-Control"] = "no-store"
    return response


def _encoder(searcher: Searcher) -> dict[str, str]:
    """/healthz's `documents.encoder`: said here, not found later in rankings of noise."""
    if searcher.encoder is None:
        return {"state": "unknown"}
    state = searcher.encoder.known()  # the last search's check: no call to the model service
    if state != "changed":
        return {"state": state}
    return {"state": state, "remedy": REMEDY[0].upper() + REMEDY[1:] + "."}


# The sidecar's phases on the way to ready (its /readyz): all of them are "loading" here.
LOADING_PHASES = ("starting", "downloading", "loading", "warming_up")


def _not_ready(sidecar: dict[str, Any]) -> tuple[str, str]:
    """(type, sentence) for a sidecar that cannot take a chat now."""
    if not sidecar.get("reachable"):
        return "upstream_unavailable", NOT_REACHABLE
    if sidecar.get("error") == "upstream_unauthorized":
        return "upstream_unauthorized", (
            "The model service refuses this app's key (set UPSTREAM_API_KEY, or "
            "SIDECAR_API_KEY, to a key it accepts)."
        )
    detail = sidecar.get("detail")
    phase = detail.get("phase") if isinstance(detail, dict) else None
    if phase == "failed":
        return "model_failed", "The model service could not load the model; see its log."
    if phase == "restarting":
        return "restarting", "The model is restarting."
    if phase in LOADING_PHASES:
        return "loading", f"The model is still loading (phase {phase})."
    return "loading", "The model is not ready yet."


@bp.get("/readyz")
def readyz() -> Response:
    sidecar = current_app.extensions["upstream"].readiness()
    if sidecar.get("ready"):
        response = jsonify({"status": "ready", "model": _model_name(sidecar)})
        response.headers["Cache-Control"] = "no-store"
        return response
    type, sentence = _not_ready(sidecar)
    # A probe retries on its own schedule; the header is for people and scripts polling it.
    return error_response(503, sentence, type, {"Retry-After": str(DEFAULT_RETRY_AFTER)})
