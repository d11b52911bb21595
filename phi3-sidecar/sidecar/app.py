"""The app factory: settings in, FastAPI app out; the model worker starts in the lifespan.

Routes here are the probes and metrics; /predict lives in predict.py, /v1/chat/completions in
openai_api.py.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse

from sidecar import errors
from sidecar.deps import Worker
from sidecar.logs import RequestLogMiddleware
from sidecar.metrics import Gauges, Metrics
from sidecar.openai_api import router as openai_router
from sidecar.predict import router as predict_router
from sidecar.settings import Settings
from sidecar.worker_client import WorkerClient


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = Metrics()
    worker = WorkerClient(settings, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await worker.start()  # returns at once: the port opens while the model loads
        try:
            yield
        finally:
            await worker.stop()

    app = FastAPI(
        title="phi3-sidecar",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        # FastAPI's built-in OpenTelemetry hooks: off, so a request costs only what this
        # service does (the one log line and /metrics are its observability).
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    app.state.settings = settings
    app.state.worker = worker
    app.state.metrics = metrics
    errors.install(app)
    app.add_middleware(RequestLogMiddleware, metrics=metrics)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers (also while the model loads or has failed)."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(worker: Worker) -> JSONResponse:
        """Readiness: 200 once the model is loaded and a warm-up token was generated."""
        phase = worker.phase
        ready = phase.name == "ready"
        body: dict[str, object] = {
            "ready": ready,
            "phase": phase.name,
            "reason": phase.reason,
            "phase_seconds": round(time.monotonic() - phase.since, 1),
        }
        if ready:
            body["max_length"] = phase.max_length
            return JSONResponse(body)
        headers = {"Retry-After": str(errors.RETRY_NOT_READY_S)}
        return JSONResponse(body, status_code=503, headers=headers)

    @app.get("/metrics")
    async def metrics_text(worker: Worker) -> PlainTextResponse:
        gauges = Gauges(
            ready=worker.phase.name == "ready",
            active=worker.admission.active,
            waiting=worker.admission.waiting,
        )
        return PlainTextResponse(metrics.render(gauges), media_type="text/plain; version=0.0.4")

    app.include_router(predict_router)
    app.include_router(openai_router)
    return app
