"""What routes get from the app, through Annotated dependencies (one per object on app.state)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from sidecar.embeddings.service import Embeddings
from sidecar.settings import Settings
from sidecar.speech.service import Speech
from sidecar.web.generation.admission import Admission
from sidecar.web.generation.model_client import ModelClient
from sidecar.web.generation.pipeline import Pipeline
from sidecar.web.images.decoding import Images
from sidecar.web.models.pool import ModelPool
from sidecar.web.observability.metrics import Metrics
from sidecar.web.observability.record import RequestRecord
from sidecar.web.responses.store import ResponseStore


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_model(request: Request) -> ModelClient:
    """The default model's worker (web/models/: pinned, always resident)."""
    models: ModelPool = request.app.state.models
    return models.default


def get_models(request: Request) -> ModelPool:
    models: ModelPool = request.app.state.models
    return models


def get_admission(request: Request) -> Admission:
    admission: Admission = request.app.state.admission
    return admission


def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


def get_pipeline(request: Request) -> Pipeline:
    pipeline: Pipeline = request.app.state.pipeline
    return pipeline


def get_response_store(request: Request) -> ResponseStore:
    store: ResponseStore = request.app.state.response_store
    return store


def get_images(request: Request) -> Images:
    images: Images = request.app.state.images
    return images


def get_embeddings(request: Request) -> Embeddings:
    embeddings: Embeddings = request.app.state.embeddings
    return embeddings


def get_speech(request: Request) -> Speech:
    speech: Speech = request.app.state.speech
    return speech


def get_record(request: Request) -> RequestRecord:
    """The request's log record (made by RequestLogMiddleware)."""
    record: RequestRecord = request.scope["state"]["record"]
    return record


SettingsDep = Annotated[Settings, Depends(get_settings)]
ModelDep = Annotated[ModelClient, Depends(get_model)]
ModelsDep = Annotated[ModelPool, Depends(get_models)]
AdmissionDep = Annotated[Admission, Depends(get_admission)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
PipelineDep = Annotated[Pipeline, Depends(get_pipeline)]
RecordDep = Annotated[RequestRecord, Depends(get_record)]
ResponseStoreDep = Annotated[ResponseStore, Depends(get_response_store)]
ImagesDep = Annotated[Images, Depends(get_images)]
EmbeddingsDep = Annotated[Embeddings, Depends(get_embeddings)]
SpeechDep = Annotated[Speech, Depends(get_speech)]
