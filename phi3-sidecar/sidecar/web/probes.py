"""GET /healthz (liveness), /readyz (readiness, with the load phase) and /metrics."""

from __future__ import annotations

import time

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from sidecar.web.deps import (
    AdmissionDep,
    EmbeddingsDep,
    MetricsDep,
    ModelDep,
    SettingsDep,
    SpeechDep,
)
from sidecar.web.observability.gauges import Gauges

router = APIRouter()


@router.get("/healthz")
@router.head("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    """Liveness: the process answers (also while the model loads or has failed)."""
    return {"status": "ok"}


@router.get("/readyz")
@router.head("/readyz", include_in_schema=False)
async def readyz(
    model: ModelDep, settings: SettingsDep, embeddings: EmbeddingsDep, speech: SpeechDep
) -> JSONResponse:
    """Readiness: 200 once the model is loaded and a warm-up token was generated. `embeddings`
    says whether /v1/embeddings is served (its phase); it does not change the status: chat
    goes on without an encoder that failed. `speech` says the same of speech to text
    (/v1/audio/transcriptions, input_audio parts)."""
    phase = model.phase
    ready = phase.ready
    body: dict[str, object] = {
        "ready": ready,
        "phase": phase.name,
        "reason": phase.reason,
        "phase_seconds": round(time.monotonic() - phase.since, 1),
        "model": settings.served_model_name,
        "embeddings": embeddings.readiness(),
        "speech": speech.readiness(),
    }
    if ready:
        body["max_length"] = phase.max_length
        body["image_input"] = phase.image_input  # the model reads images (issue 36)
        body["passage_reuse"] = phase.passage_reuse  # the passage store (issue 54)
        return JSONResponse(body)
    headers = {"Retry-After": str(phase.retry_after_s())}
    return JSONResponse(body, status_code=503, headers=headers)


@router.get("/metrics")
@router.head("/metrics", include_in_schema=False)
async def metrics_text(
    model: ModelDep, admission: AdmissionDep, metrics: MetricsDep
) -> PlainTextResponse:
    gauges = Gauges(
        ready=model.phase.ready,
        active=admission.active,
        waiting=admission.waiting,
        worker_restarts=model.restarts,
        cache=model.cache_stats,
    )
    return PlainTextResponse(metrics.render(gauges), media_type="text/plain; version=0.0.4")
