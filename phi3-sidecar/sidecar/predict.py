"""POST /predict: the sample's contract ({"input_text": ...} -> streamed text/plain), done right.

Everything that can be refused is refused before the response starts, with a proper status:
the body (415, 413, 400, 422), readiness (503), the queue (503), the context (413); the
pipeline that does it (pipeline.py) is shared with /v1/chat/completions (openai_api.py).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from sidecar import ipc, pipeline
from sidecar.deps import Record, Worker
from sidecar.schemas import PredictRequest
from sidecar.streaming import ReplyFormat

router = APIRouter()


@router.post("/predict")
async def predict(request: Request, worker: Worker, record: Record) -> Response:
    body = await pipeline.read_body(request, worker.settings.max_body_bytes, PredictRequest)
    max_new_tokens = body.max_new_tokens or worker.settings.max_new_tokens
    generate = ipc.Generate(
        record.request_id,
        body.conversation(),
        max_new_tokens,
        min_new_tokens=min(body.min_new_tokens or 0, max_new_tokens),
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
    )
    return await pipeline.run(request, worker, record, generate, ReplyFormat())
