"""What routes get from the app (through Annotated dependencies)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from sidecar.logs import RequestRecord
from sidecar.worker_client import WorkerClient


def get_worker(request: Request) -> WorkerClient:
    worker: WorkerClient = request.app.state.worker
    return worker


def get_record(request: Request) -> RequestRecord:
    """The request's log record (made by RequestLogMiddleware)."""
    record: RequestRecord = request.scope["state"]["record"]
    return record


Worker = Annotated[WorkerClient, Depends(get_worker)]
Record = Annotated[RequestRecord, Depends(get_record)]
