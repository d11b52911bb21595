"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API, what its
SDKs' `client.responses.create/stream/parse` call (and Microsoft's current Azure chat
quickstart). The same pipeline as Chat Completions (generation/pipeline.py): the request is said as
a Chat Completions request (responses/schemas.py) and runs as one; only the body, the reply's
format and the stored responses (responses/store.py) are the Responses API's own.

Request, application/json (unknown fields are refused with 400 invalid_value, naming them):
  input         a string (one user message), or a list of items: messages ({"role": "user" |
                "system" | "developer" | "assistant", "content": a string or text parts,
                input_text / output_text, and in user messages input_image parts {"type":
                "input_image", "image_url": "data:image/png;base64,...", "detail"} (checked
                as Chat Completions' image_url parts; by file_id: refused, no files are
                stored); "type": "message" may be left out; system and developer only where
                the conversation starts), function_call items (an earlier reply's calls, sent
                back) and function_call_output items ({"call_id", "output"}: a call's result).
                Other items and parts (files, reasoning, item_reference) are refused
  instructions  a system message in front of the conversation; not carried over to a
                response that continues this one (as OpenAI's)
  model         any string up to 256 characters, echoed
  max_output_tokens, temperature, top_p   as Chat Completions' max_completion_tokens,
                temperature (absent: greedy), top_p; not OpenAI's here: top_k, seed, stop
  text          {"format": {"type": "text"} | {"type": "json_object"} | {"type":
                "json_schema", "name", "schema", "description", "strict"}}: held to by the
                same grammar and final check as Chat Completions' response_format
  tools         function tools {"type": "function", "name", "description", "parameters",
                "strict"} (up to 128; other tool types refused); tool_choice "none" | "auto" |
                "required" | {"type": "function", "name"}; parallel_tool_calls. Calls come
                back as function_call output items, results go in as function_call_output
  include ["message.output_text.logprobs"], top_logprobs (0 to 20)   each output token's
                log probability (model/logprobs.py: which distribution); not with tools
  stream        true: server-sent events (below); stream_options {"include_obfuscation"}
  store (default true), previous_response_id   the response is kept (RESPONSE_STORE_MB) and
                a later request continues its conversation, reading only its new tokens from
                the conversation cache; GET /v1/responses/{id} returns it, DELETE removes it
  prompt_cache_key, else user   the conversation cache's scope, and a stored response's:
                only a request of the same API key and scope continues it
  metadata      OpenAI's limits, echoed; safety_identifier accepted, changes nothing
  Accepted only where they change nothing: background false, truncation "auto", service_tier
  "auto", reasoning, max_tool_calls, conversation, prompt null.

Reply, stream false: 200, the response object {"id": "resp_...", "object": "response",
  "created_at", "status": "completed" | "incomplete" ("incomplete_details": {"reason":
  "max_output_tokens"}: the length limit, the context or REPLY_TIME_LIMIT_S), "model",
  "output": [{"type": "message", "id": "msg_...", "role": "assistant", "status", "content":
  [{"type": "output_text", "text", "annotations": [], "logprobs": [...]}]}] or function_call
  items {"type": "function_call", "id": "fc_...", "call_id", "name", "arguments", "status"},
  "usage": {"input_tokens", "input_tokens_details": {"cached_tokens", "image_tokens"},
  "output_tokens",
  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens"}, and the request's
  settings echoed}. A structured reply that fails its final check: 500 invalid_reply.
Reply, stream true: text/event-stream, `event: <type>` and `data: <json>` with a rising
  `sequence_number`: response.created, response.in_progress; for text
  response.output_item.added, response.content_part.added, response.output_text.delta ...,
  response.output_text.done, response.content_part.done, response.output_item.done; for each
  call response.output_item.added, response.function_call_arguments.delta (the whole
  arguments: a call is held until complete), response.function_call_arguments.done,
  response.output_item.done; then response.completed or response.incomplete. A generation
  that fails after the first byte, or a structured reply that fails its final check, ends with
  response.failed (its response's "error": {"code": "server_error", "message"}).
Errors before the reply: as Chat Completions' (OpenAI's shape, errors.REFUSALS' /v1 columns),
  with fields named as this API names them; 404 response_not_found for a previous_response_id,
  GET or DELETE of a response this caller has not stored.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from fastapi import APIRouter, Request, Response

from sidecar import ipc
from sidecar.web.audio.parts import audio_allowance, transcribe_parts
from sidecar.web.chat_completions.api import _calls, _Checked, _json
from sidecar.web.chat_completions.schemas import ChatCompletionRequest, scope_of
from sidecar.web.chat_completions.tool_protocol import Call
from sidecar.web.deps import (
    ImagesDep,
    PipelineDep,
    RecordDep,
    ResponseStoreDep,
    SettingsDep,
    SpeechDep,
)
from sidecar.web.errors import ApiError
from sidecar.web.generation.messages import AudioPart
from sidecar.web.generation.pipeline import read_body
from sidecar.web.images.decoding import body_allowance
from sidecar.web.responses.schemas import ResponsesRequest, refusal_of, untagged
from sidecar.web.responses.store import ResponseStore, Stored, new_id
from sidecar.web.structured import settle as structured
from sidecar.web.structured.reply_check import ReplyCheck

router = APIRouter()


@router.post("/v1/responses")
async def create_response(
    request: Request,
    settings: SettingsDep,
    pipeline: PipelineDep,
    record: RecordDep,
    store: ResponseStoreDep,
    images: ImagesDep,
    speech: SpeechDep,
) -> Response:
    # images' data URLs and audio's base64, beyond MAX_BODY_BYTES
    allowance = body_allowance(settings) + audio_allowance(settings)
    try:
        body = await read_body(request, settings.max_body_bytes, ResponsesRequest, allowance)
    except ApiError as error:
        raise untagged(error) from None
    record.stream = body.stream
    owner = _owner(request)
    scope = scope_of(body.prompt_cache_key, body.user)
    earlier: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        previous = store.continuing(body.previous_response_id, owner, scope)
        if previous is None:
            raise ApiError(
                "response_not_found",
                "previous_response_id: no stored response with this id for this API key and "
                "prompt_cache_key (or user)",
                param="previous_response_id",
            )
        earlier = previous.conversation
    chat, conversation = body.as_chat(earlier)
    try:
        # input_audio parts read as the user's text, as in chat (web/audio/parts.py)
        audio_seconds = await transcribe_parts(request, speech, settings, list(chat.messages))
        checked = await images.prepare(chat.image_refs(), record)  # 400s naming the input
        check = await structured.settle(chat, record)  # 400 invalid_schema
    except ApiError as error:
        raise refusal_of(error) from None
    generate = chat.generate(record.request_id, settings.max_new_tokens, checked)
    entry = pipeline.resolve(body.model)  # 404 model_not_found with MODELS_FILE
    model = entry.id if pipeline.strict or body.model is None else body.model
    kept = heard(conversation, chat) if audio_seconds is not None else conversation
    draft = Draft(body, chat, model, kept, owner, store, audio_seconds)
    reply_format = (ResponseEvents if body.stream else ResponseObject)(draft, check)
    try:
        return await pipeline.run(request, record, generate, reply_format, entry)
    except ApiError as error:
        if error.reason == "invalid_guidance":  # name the field the grammar came from
            error.param = "tools" if body.tools else "text.format"
        raise


@router.get("/v1/responses/{response_id}")
@router.head("/v1/responses/{response_id}", include_in_schema=False)
async def get_response(
    response_id: str, request: Request, store: ResponseStoreDep
) -> dict[str, Any]:
    return _stored(store, response_id, _owner(request)).response


@router.delete("/v1/responses/{response_id}")
async def delete_response(
    response_id: str, request: Request, store: ResponseStoreDep
) -> dict[str, Any]:
    _stored(store, response_id, _owner(request))
    store.delete(response_id, _owner(request))
    return {"id": response_id, "object": "response", "deleted": True}


@router.api_route(
    "/v1/responses/{response_id}",
    methods=["POST", "PUT", "PATCH", "OPTIONS", "TRACE"],
    include_in_schema=False,
)
async def other_method(response_id: str) -> None:
    """The path has two routes (GET, DELETE): Starlette's own 405 names one route's methods."""
    raise ApiError(
        "method_not_allowed", "Method Not Allowed", headers={"Allow": "DELETE, GET, HEAD"}
    )


def _stored(store: ResponseStore, response_id: str, owner: str) -> Stored:
    stored = store.get(response_id, owner)
    if stored is None:
        raise ApiError("response_not_found", "no stored response with this id for this API key")
    return stored


def _owner(request: Request) -> str:
    """The API key the request came in with (guards/access.py), as stored responses know it."""
    owner: str = request.scope.get("state", {}).get("key_owner", "")
    return owner


class Draft:
    """One response: what it echoes of its request, its output as it is made, and where it is
    kept when it is done."""

    def __init__(
        self,
        body: ResponsesRequest,
        chat: ChatCompletionRequest,
        model: str,
        conversation: list[dict[str, Any]],
        owner: str,
        store: ResponseStore,
        audio_seconds: float | None = None,
    ) -> None:
        self.id = new_id()
        self.audio_seconds = audio_seconds  # the input_audio parts' (web/audio/parts.py)
        self.body = body
        self.tools = chat.calls_tools
        self.keep_logprobs = chat.logprobs_count is not None
        self._created_at = int(time.time())
        self._model = model
        self._conversation = conversation
        self._owner = owner
        self._store = store
        self._stored = body.store and store.enabled

    def object(self, status: str, output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        body = self.body
        text_format = body.text.format if body.text is not None else None
        choice = body.tool_choice
        if choice is None or isinstance(choice, str):
            tool_choice: Any = choice or "auto"
        else:
            tool_choice = choice.model_dump()
        return {
            "id": self.id,
            "object": "response",
            "created_at": self._created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self._model,
            "output": output,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "store": self._stored,
            "temperature": body.temperature,
            "text": {
                "format": text_format.model_dump(by_alias=True, exclude_none=True)
                if text_format is not None
                else {"type": "text"}
            },
            "tool_choice": tool_choice,
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or ()],
            "top_logprobs": body.top_logprobs or 0,
            "top_p": body.top_p,
            "truncation": "auto",
            "usage": None,
            "user": body.user,
            "prompt_cache_key": body.prompt_cache_key,
            "metadata": body.metadata or {},
            **extra,
        }

    def done(
        self, end: ipc.End, started: ipc.Started, output: list[dict[str, Any]], reply: Any
    ) -> dict[str, Any]:
        """The finished response object; kept in the store when asked to (with the
        conversation it ends, `reply` the Chat Completions message of its output)."""
        incomplete = end.finish in ("length", "time_limit")
        details: dict[str, Any] = {
            "cached_tokens": started.cached_tokens,
            "image_tokens": started.image_tokens,  # of input_tokens
        }
        if self.audio_seconds is not None:  # read as their transcripts' tokens
            details["audio_seconds"] = self.audio_seconds
        usage = {
            "input_tokens": started.prompt_tokens,
            "input_tokens_details": details,
            "output_tokens": end.generated_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": started.prompt_tokens + end.generated_tokens,
        }
        response = self.object(
            "incomplete" if incomplete else "completed",
            output,
            usage=usage,
            incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
        )
        if self._stored:
            conversation = [*self._conversation, *([reply] if reply is not None else [])]
            kept = Stored(self.id, self._owner, self.body_scope, response, conversation)
            response["store"] = self._store.put(kept)
        return response

    def failed(self, message: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        error = {"code": "server_error", "message": message}
        return self.object("failed", output, error=error)

    @property
    def body_scope(self) -> str | None:
        return scope_of(self.body.prompt_cache_key, self.body.user)


def heard(conversation: list[dict[str, Any]], chat: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The conversation as a stored response keeps it: each input_audio part replaced by a
    text part holding its transcript, so the store never holds the audio's base64. The
    transcripts come in the conversation's order (`as_chat` keeps it; only user messages hold
    audio, and a stored conversation holds none)."""
    transcripts = iter(
        [
            part.text
            for message in chat.messages
            for part in getattr(message, "content", None) or ()
            if isinstance(part, AudioPart)
        ]
    )
    kept = []
    for message in conversation:
        content = message.get("content")
        if isinstance(content, list):
            content = [
                {"type": "text", "text": next(transcripts)}
                if part.get("type") == "input_audio"
                else part
                for part in content
            ]
            message = {**message, "content": content}
        kept.append(message)
    return kept


def _message(item_id: str, text: str, status: str, logprobs: list[Any]) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": [part],
    }


def _function_call(call: Call, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_" + secrets.token_hex(12),
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


class _Response(_Checked):
    """What both formats keep: the text shown, each token's log probabilities."""

    def __init__(self, draft: Draft, check: ReplyCheck | None) -> None:
        super().__init__(check, draft.tools)
        self._draft = draft
        self.keep_logprobs = draft.keep_logprobs
        self._shown: list[str] = []
        self._all_logprobs: list[dict[str, Any]] = []
        self._message_id = "msg_" + secrets.token_hex(12)

    def _feed(self, text: str) -> str:
        """The text to show now (a tool call is held until it is complete)."""
        self._keep(text)
        shown = self._splitter.feed(text) if self._splitter is not None else text
        self._shown.append(shown)
        return shown

    def _pending_logprobs(self) -> list[dict[str, Any]]:
        out = self._logprobs_out()
        entries: list[dict[str, Any]] = out["content"] if out is not None else []
        self._all_logprobs += entries
        return entries

    def _output(self, end: ipc.End, rest: str | None, calls: list[Call] | None) -> tuple[Any, Any]:
        """The output items (after the text `rest` is shown: None, a call or nothing), and the
        reply as the Chat Completions message a later turn continues from."""
        if calls:
            items = [_function_call(call) for call in calls]
            message = {"role": "assistant", "content": None}
            return items, message | {"tool_calls": [call.as_openai() for call in calls]}
        if rest is None:  # a call cut off by the limit: no output
            return [], None
        text = "".join(self._shown)
        self._pending_logprobs()
        status = "incomplete" if end.finish in ("length", "time_limit") else "completed"
        item = _message(self._message_id, text, status, self._all_logprobs)
        return [item], {"role": "assistant", "content": text}


class ResponseObject(_Response):
    """stream false: the response object when the reply is complete."""

    media_type = "application/json"
    buffered = True

    def piece(self, text: str) -> bytes:
        self._feed(text)
        return b""

    def tail(self, end: ipc.End, started: ipc.Started) -> bytes:
        rest, calls = _calls(self._splitter, end)
        self._shown.append(rest or "")
        output, reply = self._output(end, rest, calls)
        return _json(self._draft.done(end, started, output, reply))


class ResponseEvents(_Response):
    """stream true: the Responses API's server-sent events."""

    media_type = "text/event-stream"

    def __init__(self, draft: Draft, check: ReplyCheck | None) -> None:
        super().__init__(draft, check)
        self._sequence = 0
        self._open = False  # the message item and its text part have been added

    def _event(self, kind: str, **data: Any) -> bytes:
        event = {"type": kind, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return f"event: {kind}\ndata: ".encode() + _json(event) + b"\n\n"

    def head(self) -> bytes:
        response = self._draft.object("in_progress", [])
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def _opened(self) -> bytes:
        if self._open:
            return b""
        self._open = True
        item = _message(self._message_id, "", "in_progress", [])
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        where = {"item_id": self._message_id, "output_index": 0}
        return self._event("response.output_item.added", output_index=0, item=item) + self._event(
            "response.content_part.added", content_index=0, part=part, **where
        )

    def _delta(self, text: str) -> bytes:
        where = {"item_id": self._message_id, "output_index": 0, "content_index": 0}
        entries = self._pending_logprobs()
        return self._opened() + self._event(
            "response.output_text.delta", delta=text, logprobs=entries, **where
        )

    def piece(self, text: str) -> bytes:
        shown = self._feed(text)
        return self._delta(shown) if shown else b""

    def tail(self, end: ipc.End, started: ipc.Started) -> bytes:
        rest, calls = _calls(self._splitter, end)
        events = b""
        if rest:
            self._shown.append(rest)
            events += self._delta(rest)
        output, reply = self._output(end, rest, calls)
        if output and output[0]["type"] == "message":
            message = output[0]
            part = message["content"][0]
            where = {"item_id": self._message_id, "output_index": 0}
            events += self._opened()
            events += self._event(
                "response.output_text.done",
                text=part["text"],
                logprobs=part["logprobs"],
                content_index=0,
                **where,
            )
            events += self._event("response.content_part.done", content_index=0, part=part, **where)
            events += self._event("response.output_item.done", output_index=0, item=message)
        for index, item in enumerate(output if calls else ()):
            added = item | {"arguments": "", "status": "in_progress"}
            where = {"item_id": item["id"], "output_index": index}
            events += self._event("response.output_item.added", output_index=index, item=added)
            events += self._event(
                "response.function_call_arguments.delta", delta=item["arguments"], **where
            )
            events += self._event(
                "response.function_call_arguments.done",
                arguments=item["arguments"],
                name=item["name"],
                **where,
            )
            events += self._event("response.output_item.done", output_index=index, item=item)
        response = self._draft.done(end, started, output, reply)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return events + self._event(kind, response=response)

    def refused(self, error: ApiError) -> bytes:
        return self._failed(error.message)

    def failure(self) -> bytes:
        return self._failed("the generation failed after the reply started; see the sidecar log")

    def _failed(self, message: str) -> bytes:
        return self._event("response.failed", response=self._draft.failed(message, []))
