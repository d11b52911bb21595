"""`GET /api/models`: the chat models the model service serves, for the page's model picker.

    GET /api/models -> 200 {"models": [{"id", "default", "state", "load_s",
                                        "input_modalities", "aliases"}]}

In the model service's order (upstream_models.py reads either API's list): `default` is the
model that answers a chat naming none; `state` `loaded`, `loading`, `available` (loads when
asked for: a chat waits `load_s`, its last load's seconds, `null` before one) or `failed` from
our sidecar, `null` from a server that does not say; `input_modalities` `["text"]` or `["text",
"image"]`, `null` when unknown. Errors are the app's envelope: 503 `upstream_unavailable`, 502
`upstream_unauthorized` or `upstream_error`.

One list serves every page for `FRESH_S` seconds (each page asks at its start, after each
reply and as it polls /healthz; a model's state changes in seconds, not faster). A failure is
not kept, nor a list in which a model is loading, nor the list once a chat names a model
(`expire`: the page asks again when the reply ends, and a cold model is loaded by then). What a
model reads is remembered once a list said it while the model was loaded, since our sidecar
knows it only then (upstream_models.py).
"""

from __future__ import annotations

import dataclasses
import threading
import time

from flask import Blueprint, Response, current_app, jsonify

from chatapp.relay.upstream import ChatModel, Upstream

bp = Blueprint("model_list", __name__)

FRESH_S = 3.0


class ModelList:
    """The upstream's chat models, asked at most once per FRESH_S however many ask."""

    def __init__(self, upstream: Upstream, fresh_s: float = FRESH_S) -> None:
        self._upstream = upstream
        self._fresh_s = fresh_s
        self._lock = threading.Lock()  # one request asks; the others wait for its answer
        self._models: list[ChatModel] = []
        self._at = float("-inf")
        self._reads: dict[str, tuple[str, ...]] = {}  # id: input_modalities seen loaded

    def current(self) -> list[ChatModel]:
        """The list, asked again when older than FRESH_S; the upstream's ApiError if it
        cannot be had."""
        with self._lock:
            if time.monotonic() - self._at >= self._fresh_s:
                self._models = [self._known(model) for model in self._upstream.models()]
                loading = any(model.state == "loading" for model in self._models)
                self._at = float("-inf") if loading else time.monotonic()
            return self._models

    def expire(self) -> None:
        """Ask again next time: a chat named a model, which may be loading for it."""
        self._at = float("-inf")

    def _known(self, model: ChatModel) -> ChatModel:
        if model.input_modalities is not None:
            if model.state in (None, "loaded"):
                self._reads[model.id] = model.input_modalities
            return model
        remembered = self._reads.get(model.id)
        if remembered is None:
            return model
        return dataclasses.replace(model, input_modalities=remembered)


@bp.get("/api/models")
def models() -> Response:
    model_list: ModelList = current_app.extensions["model_list"]
    response = jsonify({"models": [model.public() for model in model_list.current()]})
    response.headers["Cache-Control"] = "no-store"
    return response
