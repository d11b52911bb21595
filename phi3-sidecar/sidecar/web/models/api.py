"""GET /v1/models, GET /v1/models/{id}, and with MODELS_FILE the models' load, unload and pin.

The list is OpenAI's: every chat model configured (its id, `object`, `created`, `owned_by`),
then the encoder and the speech model if served; each chat model also says, as ours:
`input_modalities` (what it reads, as its last worker to get ready said, also once
unloaded: ["text"] until one was), `aliases`, `state` (`loaded`, `loading`, `available`: not
resident, loads when asked for; `failed`), `pinned`, `default`, `memory_bytes` (measured at its first load; null
before) and `load_s` (its last load's seconds: a cold load's expected wait; null before).
GET /v1/models/{id} takes an id or an alias; any other name is 404 model_not_found.

POST /v1/models/{id}/load (resident now, room made as for a request; 503 overloaded when the
models answering fill the budget), /unload (409 model_busy for a pinned model or one
answering), /pin and /unpin (a pinned model is never unloaded): 200 with the model's object.
Behind the API key like every /v1 route. Without MODELS_FILE these four are 404: one model.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from sidecar.web.deps import EmbeddingsDep, ModelsDep, SpeechDep
from sidecar.web.errors import ApiError
from sidecar.web.models.pool import ModelPool
from sidecar.web.models.registry import ModelEntry

router = APIRouter()


@router.get("/v1/models")
@router.head("/v1/models", include_in_schema=False)
async def list_models(
    models: ModelsDep, embeddings: EmbeddingsDep, speech: SpeechDep
) -> dict[str, Any]:
    """OpenAI's model list: the chat models, and the encoder and speech model if served."""
    extra = [m for m in (embeddings.model_object(), speech.model_object()) if m is not None]
    data = [model_object(models, entry) for entry in models.registry.entries]
    return {"object": "list", "data": [*data, *extra]}


@router.post("/v1/models/{model_id:path}/load")
async def load_model(model_id: str, models: ModelsDep) -> dict[str, Any]:
    entry = _configured(models, model_id)
    await models.load(entry)
    return model_object(models, entry)


@router.post("/v1/models/{model_id:path}/unload")
async def unload_model(model_id: str, models: ModelsDep) -> dict[str, Any]:
    entry = _configured(models, model_id)
    await models.unload(entry)
    return model_object(models, entry)


@router.post("/v1/models/{model_id:path}/pin")
async def pin_model(model_id: str, models: ModelsDep) -> dict[str, Any]:
    entry = _configured(models, model_id)
    models.pinned.add(entry.id)
    return model_object(models, entry)


@router.post("/v1/models/{model_id:path}/unpin")
async def unpin_model(model_id: str, models: ModelsDep) -> dict[str, Any]:
    entry = _configured(models, model_id)
    if entry is models.registry.default:
        raise ApiError("model_busy", f"model {entry.id!r} is the default: it stays pinned")
    models.pinned.discard(entry.id)
    return model_object(models, entry)


# After the POST routes: its path would take their paths' last part (a 405's Allow)
@router.get("/v1/models/{model_id:path}")
@router.head("/v1/models/{model_id:path}", include_in_schema=False)
async def get_model(
    model_id: str, models: ModelsDep, embeddings: EmbeddingsDep, speech: SpeechDep
) -> dict[str, Any]:
    for other in (embeddings.model_object(), speech.model_object()):
        if other is not None and model_id == other["id"]:
            return other
    return model_object(models, _named(models, model_id))


def _named(models: ModelPool, model_id: str) -> ModelEntry:
    """The model of an id or alias; without MODELS_FILE only the one model's name."""
    default = models.registry.default
    if not models.registry.strict and model_id != default.id:
        raise ApiError(
            "model_not_found", f"no model {model_id!r} here; GET /v1/models lists the one served"
        )
    return models.registry.resolve(model_id)


def _configured(models: ModelPool, model_id: str) -> ModelEntry:
    if not models.registry.strict:
        raise ApiError("not_found", "one model is served (MODELS_FILE is not set): nothing to load")
    return models.registry.resolve(model_id)


def model_object(models: ModelPool, entry: ModelEntry) -> dict[str, Any]:
    try:  # when the model folder was written: the closest thing to OpenAI's "created"
        created = int((entry.settings.model_path / "genai_config.json").stat().st_mtime)
    except OSError:
        created = 0
    resident = models.resident(entry)
    image_input = models.image_input.get(entry.id, False)
    if resident is not None and resident.client.image_input is not None:
        image_input = resident.client.image_input
    return {
        "id": entry.id,
        "object": "model",
        "created": created,
        "owned_by": "phi3-sidecar",
        "input_modalities": ["text", "image"] if image_input else ["text"],
        "aliases": list(entry.aliases),
        "state": models.state(entry),
        "pinned": entry.id in models.pinned,
        "default": entry is models.registry.default,
        "memory_bytes": models.memory_bytes(entry),
        "load_s": _rounded(models.load_s(entry)),
    }


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)
