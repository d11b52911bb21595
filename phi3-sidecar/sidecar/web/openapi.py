"""GET /openapi.json: the sidecar's API as OpenAPI 3.1, for clients and for the fuzz test.

The generation routes read their bodies themselves (pipeline.read_body: 415, 413, 400 before
any schema), so FastAPI cannot infer them; their request bodies are the same pydantic models
the routes validate with, and every error answer is the one envelope with the statuses of
errors.REFUSALS. tests/sidecar/web/test_sidecar_fuzz.py drives schemathesis from this document.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from sidecar.embeddings.service import TOKENIZER_PATH
from sidecar.web.chat_completions.schemas import ChatCompletionRequest
from sidecar.web.completions.api import CompletionRequest
from sidecar.web.embeddings.api import EmbeddingRequest
from sidecar.web.errors import REFUSALS
from sidecar.web.passages.api import WARM_PATH, WarmRequest
from sidecar.web.predict.api import PredictRequest
from sidecar.web.responses.schemas import ResponsesRequest

REF = "#/components/schemas/{model}"
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {"message": {"type": "string"}, "type": {"type": "string"}},
        }
    },
}
STATUS_TEXT = {400: "Bad request", 401: "Unauthorized", 404: "Not found", 405: "Wrong method"}
STATUS_TEXT |= {413: "Too large", 415: "Not JSON", 422: "Invalid field", 500: "Internal error"}
STATUS_TEXT |= {503: "Not ready, or the queue is full (Retry-After)"}


def install(app: FastAPI) -> None:
    """Serve the document at /openapi.json (built once, on first use)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def build(app: FastAPI) -> dict[str, Any]:
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    bodies: list[type[BaseModel]] = [
        PredictRequest,
        ChatCompletionRequest,
        CompletionRequest,
        ResponsesRequest,
        EmbeddingRequest,
        WarmRequest,
    ]
    _, definitions = models_json_schema([(body, "validation") for body in bodies], ref_template=REF)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(definitions.get("$defs", {}))
    components["Error"] = ERROR
    errors = _errors()
    # An object, or server-sent events: each a JSON object in `data` (chunks, or the Responses
    # API's events), or [DONE].
    json_or_events = {
        "application/json": {"schema": {"type": "object"}},
        "text/event-stream": {
            "schema": {
                "type": "object",
                "required": ["data"],
                "properties": {"data": {"type": "string"}},
            }
        },
    }
    for path, body, ok in (
        ("/predict", "PredictRequest", {"text/plain": {"schema": {"type": "string"}}}),
        ("/v1/chat/completions", "ChatCompletionRequest", json_or_events),
        ("/v1/completions", "CompletionRequest", json_or_events),
        ("/v1/responses", "ResponsesRequest", json_or_events),
        (
            "/v1/embeddings",
            "EmbeddingRequest",
            {"application/json": {"schema": {"type": "object"}}},
        ),
        (WARM_PATH, "WarmRequest", {"application/json": {"schema": {"type": "object"}}}),
    ):
        operation = schema["paths"][path]["post"]
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": REF.format(model=body)}}},
        }
        operation["responses"] = {"200": {"description": "The reply", "content": ok}, **errors}
    # Speech to text (web/audio/): a multipart upload; every refusal the table has (404 when
    # no speech model is served, 413 past SPEECH_MAX_BYTES, 400 for each bad part)
    transcription = schema["paths"].get("/v1/audio/transcriptions", {}).get("post")
    if transcription is not None:
        transcription.setdefault("responses", {}).pop("422", None)
        transcription["responses"].update(errors)
    schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"] = {
        "text/plain": {"schema": {"type": "string"}}
    }
    # The encoder's tokenizer.json: 304 for an If-None-Match that holds it, 400 without one
    tokenizer = schema["paths"][TOKENIZER_PATH]["get"]
    tokenizer["responses"]["200"]["content"] = {"application/json": {"schema": {"type": "object"}}}
    tokenizer["responses"]["304"] = {"description": "Not Modified: the ETag sent is current"}
    tokenizer["responses"]["400"] = errors["400"]
    # The models' load, unload and pin (web/models/api.py): 404 without MODELS_FILE or for an
    # unknown model, 409 model_busy, 503 when no room can be made
    for path, item in schema["paths"].items():
        if path.startswith("/v1/models/") and "post" in item:
            item["post"].setdefault("responses", {}).pop("422", None)
            item["post"]["responses"].update(errors)
    model_id = schema["paths"]["/v1/models/{model_id}"]["get"]["parameters"][0]
    model_id["schema"]["examples"] = [app.state.settings.served_model_name]
    for item in schema["paths"].values():
        for method, operation in item.items():
            if method in ("get", "head", "delete"):
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)  # FastAPI's own validation answer: not ours
                responses.update({k: v for k, v in errors.items() if k in ("401", "404", "503")})
    return schema


def _errors() -> dict[str, Any]:
    statuses = sorted({answer.status for answer in REFUSALS.values()} | {405})
    content = {"application/json": {"schema": {"$ref": REF.format(model="Error")}}}
    return {
        str(status): {"description": STATUS_TEXT.get(status, "Refused"), "content": content}
        for status in statuses
    }
