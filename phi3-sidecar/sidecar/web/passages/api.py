"""POST /v1/passages/warm: grounded prompts' passages read into the passage store while the
model is idle, before anyone asks (issue 54's PASSAGE_WARM: the chat app sends its library's
passages, newest documents first; docs/documents.md, "Passages read once").

A grounded question whose prompt holds the same tokens from its first up to a stored run's
passage finds those positions read (model/kv/passages.py, exact reuse). So an item here is the
prompt a grounded question would have, cut after its passages: the same messages (system
message, the user turn's text before the question) and `passages`, the texts in them to keep.
Nothing is generated and no admission place is taken: each item's prompt is built (tokenized
and fitted, as a request's) and its run noted; the worker reads noted runs only when no
request runs and no question's own wish waits, a piece at a time, and only while the store has
room without putting anything out.

Request, application/json, at most MAX_BODY_BYTES (unknown fields: 400 naming them):
  items          1-64 of {"messages": [{"role", "content": "..."}] (text only, as /predict's
                 rules: system only first, the last from the user), "passages": [texts that
                 stand verbatim in the messages, 1-32]}
  passage_scope  whose passage store (as /predict's; within the API key's owner)
  model          with MODELS_FILE, whose store (an id or alias; absent: the default's); it
                 must be loaded (503 not_ready otherwise: nothing is loaded to warm it)

Reply, 200 application/json: {"object": "passage_warming", "items": [{"index": i, "tokens": n,
"reason": null | "..."}]}: n, the prompt's tokens up to its last passage now waiting to be
read; 0 with the reason when nothing was noted ("stored already", "the passage store is off",
"no passage was found in the prompt", or why the prompt could not be built). Refusals as
/predict's: 503 not_ready, 413, 415, 400/422 invalid fields.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Self

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sidecar import ipc
from sidecar.web.deps import ModelsDep, RecordDep, SettingsDep
from sidecar.web.errors import not_ready
from sidecar.web.generation.messages import (
    MAX_MESSAGES,
    CacheScope,
    ChatMessage,
    Passages,
    check_passages,
    check_roles,
)
from sidecar.web.generation.pipeline import OWNER_CHARS, read_body

MAX_WARM_ITEMS = 64
WARM_PATH = "/v1/passages/warm"

router = APIRouter()


class WarmItem(BaseModel):
    """A grounded prompt cut after its passages."""

    model_config = ConfigDict(strict=True, extra="forbid")

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    passages: Annotated[Passages, Field(min_length=1)]

    @model_validator(mode="after")
    def _rules(self) -> Self:
        check_roles([m.role for m in self.messages])
        check_passages(self.passages, [m.content for m in self.messages])
        return self


class WarmRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    items: list[WarmItem] = Field(min_length=1, max_length=MAX_WARM_ITEMS)
    passage_scope: CacheScope | None = None
    model: Annotated[str, Field(max_length=256)] | None = None


@router.post(WARM_PATH)
async def warm_passages(
    request: Request, settings: SettingsDep, models: ModelsDep, record: RecordDep
) -> dict[str, Any]:
    body = await read_body(request, settings.max_body_bytes, WarmRequest)
    entry = models.registry.resolve(body.model)
    resident = models.resident(entry)
    if resident is None:  # never loaded for this: its store would be gone with it
        raise not_ready("available", f"model {entry.id!r} is not loaded: nothing to warm", 5)
    model = resident.client
    if not model.phase.ready:
        raise not_ready(model.phase.name, model.phase.reason, model.phase.retry_after_s())
    owner = request.scope.get("state", {}).get("key_owner", "")
    scope = ipc.owned_scope(owner[:OWNER_CHARS], body.passage_scope)
    replies = [
        model.submit(
            ipc.Generate(
                record.request_id,
                tuple((m.role, m.content) for m in item.messages),
                max_new_tokens=1,
                use_cache=False,
                passages=tuple(item.passages),
                passage_scope=scope,
                warm=True,
            )
        )
        for item in body.items
    ]
    answers = await asyncio.gather(*(reply.start for reply in replies))
    items: list[dict[str, Any]] = []
    for index, answer in enumerate(answers):
        if isinstance(answer, ipc.Warmed):
            items.append({"index": index, "tokens": answer.tokens, "reason": answer.reason})
        elif isinstance(answer, ipc.Rejected):
            items.append({"index": index, "tokens": 0, "reason": answer.message})
        else:  # the worker died meanwhile
            raise not_ready(model.phase.name, model.phase.reason, model.phase.retry_after_s())
    record.prompt_tokens = sum(item["tokens"] for item in items)
    return {"object": "passage_warming", "items": items}
