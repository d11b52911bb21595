"""GET /v1/embeddings/tokenizer: the encoder's own `tokenizer.json`, as it was loaded.

A client that cuts texts into inputs (the chat app's passages) counts their tokens with it,
exactly as /v1/embeddings will, wherever it runs: no shared folder. /v1/models names this route
and the file's sha256 in the encoder's `tokenizer` object, and its `max_input_tokens` is the
limit the counts are held to. The file is the one the encoder read, special tokens and
truncation as written there: a counting client turns truncation and padding off and reads a
word of more than `max_input_chars_per_word` characters by its pieces, as the encoder does
(embeddings/encoder.py `split_long_words`). An input sent with `input_type` is read with the
encoder's prompt before it (/v1/models `prompts`): count the prompt's tokens too.

Reply, 200 application/json: the file's bytes, `ETag: "<sha256>"` (a request whose
`If-None-Match` holds it gets 304), `X-Max-Input-Tokens`. Refusals as /v1/embeddings: 400
embeddings_not_served (no encoder), 503 not_ready (loading, or failed: `phase`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from sidecar.embeddings.service import TOKENIZER_PATH
from sidecar.web.deps import EmbeddingsDep
from sidecar.web.embeddings.api import ready_encoder

router = APIRouter()


@router.get(TOKENIZER_PATH)
@router.head(TOKENIZER_PATH, include_in_schema=False)
async def encoder_tokenizer(request: Request, embeddings: EmbeddingsDep) -> Response:
    encoder = ready_encoder(embeddings)
    data, digest = embeddings.tokenizer_json, embeddings.tokenizer_sha256
    assert data is not None and digest is not None  # set before the encoder is ready
    headers = {
        "ETag": f'"{digest}"',
        "X-Max-Input-Tokens": str(encoder.spec.max_tokens),
        "Cache-Control": "no-cache",  # another encoder may be loaded by a restart: ask again
    }
    if digest in request.headers.get("If-None-Match", ""):
        return Response(status_code=304, headers=headers)
    return Response(data, media_type="application/json", headers=headers)
