"""The app factory: settings in, FastAPI app out; the model worker starts in the lifespan.

Each object the routes use lives on app.state and reaches them through one dependency
(deps.py). The routes: /predict (predict/api.py), /v1/chat/completions (chat_completions/api.py),
/v1/completions (completions/api.py), /v1/responses (responses/api.py), /v1/embeddings
(embeddings/api.py, on the encoder of sidecar/embeddings/), /v1/audio/transcriptions
(audio/api.py, on the speech model of sidecar/speech/), the probes and /metrics (probes.py).
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from sidecar.embeddings.service import Embeddings
from sidecar.settings import Settings
from sidecar.speech.service import Speech
from sidecar.web import errors, openapi
from sidecar.web.audio.api import router as audio_router
from sidecar.web.chat_completions.api import router as openai_router
from sidecar.web.completions.api import router as completions_router
from sidecar.web.embeddings.api import router as embeddings_router
from sidecar.web.embeddings.tokenizer import router as tokenizer_router
from sidecar.web.generation.admission import Admission
from sidecar.web.generation.pipeline import Pipeline
from sidecar.web.guards.access import AccessMiddleware, log_state
from sidecar.web.guards.connections import Connections, connection_limit
from sidecar.web.guards.deadlines import BodyDeadline
from sidecar.web.guards.listener import accept_errors
from sidecar.web.images.decoding import Images
from sidecar.web.models.api import router as models_router
from sidecar.web.models.pool import ModelPool
from sidecar.web.models.registry import load_registry
from sidecar.web.observability.metrics import Metrics
from sidecar.web.observability.request_log import RequestLogMiddleware
from sidecar.web.observability.telemetry import TraceRequest, Tracing
from sidecar.web.passages.api import router as passages_router
from sidecar.web.predict.api import router as predict_router
from sidecar.web.probes import router as probes_router
from sidecar.web.responses.api import router as responses_router
from sidecar.web.responses.store import ResponseStore


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    # The cap's connections are counted by the HTTP protocol (__main__ hands it this object).
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    connections = Connections(
        connection_limit(settings.max_connections, nofile),
        write_timeout_s=settings.write_timeout_s,
        send_buffer=settings.send_buffer_kb * 1024,
    )
    # Each API key's fair share of the stored responses (responses/store.py).
    response_store = ResponseStore(settings.response_store_mb * 2**20, len(settings.api_keys))
    images = Images(settings)  # the image checks and their memory bound (images/decoding.py)
    metrics = Metrics(
        prompt_cache=settings.prompt_cache_mb > 0,
        connections=connections,
        response_store=response_store,
        image_memory=images.memory,
    )
    admission = Admission(settings.max_concurrency, settings.queue_size)
    # The models served (MODELS_FILE, else MODEL_PATH), a worker process each when resident; a
    # slot is held until the worker reports the generation over (generation/admission.py).
    models = ModelPool(
        load_registry(settings), admission, settings, budget_bytes=settings.models_memory_bytes
    )
    # None unless a destination is set (observability/telemetry.py)
    tracing = Tracing.from_settings(settings)
    embeddings = Embeddings(settings)  # phase "off" unless an encoder is set
    speech = Speech(settings)  # phase "off" unless a speech model is set

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        log_state(settings)  # whether authentication is on, once at start
        # Accept errors (out of descriptors) counted and throttled instead of a traceback each.
        asyncio.get_running_loop().set_exception_handler(accept_errors(connections))
        await models.start()  # returns at once: the port opens while the models load
        embeddings.start()  # the same: loads in a thread of its own
        speech.start()  # and speech
        try:
            yield
        finally:
            speech.stop()
            embeddings.stop()
            await models.stop()
            if tracing is not None:
                tracing.shutdown()  # the last spans go out

    app = FastAPI(
        title="phi3-sidecar",
        lifespan=lifespan,
        version="0.3.0",
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",  # openapi.py: the bodies and errors FastAPI cannot infer
        # FastAPI's built-in OpenTelemetry hooks: off, so a request costs only what this
        # service does (the one log line and /metrics), unless traces are configured: then
        # FastAPI makes the server spans (web/observability/telemetry.py).
        telemetry=tracing.fastapi_config()
        if tracing is not None
        else {"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.connections = connections
    app.state.admission = admission
    app.state.models = models
    app.state.embeddings = embeddings
    app.state.speech = speech
    app.state.response_store = response_store
    app.state.images = images
    app.state.pipeline = Pipeline(
        models,
        admission,
        log_prompts=settings.log_prompts,
        time_limit_s=settings.reply_time_limit_s,
        start_after_s=settings.stream_start_after_s,
        keepalive_s=settings.stream_keepalive_s,
        progress_s=settings.progress_interval_s,
    )
    errors.install(app)
    openapi.install(app)
    app.add_middleware(AccessMiddleware, settings=settings)
    # A body that stalls is refused with 408 (the headers' deadline is uvicorn's:
    # guards/deadlines.py).
    app.add_middleware(BodyDeadline, seconds=settings.request_body_timeout_s)
    if tracing is not None:  # inside RequestLogMiddleware: it reads the request's record
        app.add_middleware(TraceRequest, tracing=tracing)
    # Added last, runs first: every request gets its log line, refused ones included.
    app.add_middleware(RequestLogMiddleware, metrics=metrics)
    app.include_router(probes_router)
    app.include_router(predict_router)
    app.include_router(openai_router)
    app.include_router(completions_router)
    app.include_router(responses_router)
    app.include_router(embeddings_router)
    app.include_router(tokenizer_router)
    app.include_router(audio_router)
    app.include_router(passages_router)
    app.include_router(models_router)
    return app
