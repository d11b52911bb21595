"""POST /v1/chat/completions: OpenAI's Chat Completions API, next to /predict.

Azure App Service's built-in SLM sidecar extensions answer at this path, so OpenAI client code
(base URL http://localhost:8000/v1) works against this sidecar too. It is /predict's pipeline
(generation/pipeline.py): the same admission queue, worker, validation rules, error envelope and
statuses, cancellation, log line and metrics; only the body (chat_completions/schemas.py) and the
reply's format differ.

Request, application/json (unknown fields are refused with 400 invalid_value, naming them):
  messages      as /predict's (roles system|user|assistant, system only first, the last one
                from the user), plus role developer (OpenAI's newer name for system) and a
                message `name` (accepted, not shown to the model); content is a string or a
                list of parts: text [{"type": "text", "text": "..."}], joined with newlines,
                and, in user messages, images {"type": "image_url", "image_url": {"url":
                "data:image/png;base64,...", "detail"}} (generation/messages.py: where each stands;
                images/decoding.py: what is accepted; a model that reads text only answers 400
                image_input_unsupported); other parts (input_audio, ...) are refused
  model         any string of up to 256 characters, echoed (absent: the served model's name).
                Not checked against the one model served: clients often send a fixed name.
                With MODELS_FILE: the model that answers, by id or alias (docs/api.md,
                "Several models"); another name is 404 model_not_found; the reply names the id.
                GET /v1/models/{id} is the place where an unknown id is a 404 model_not_found.
  max_completion_tokens or max_tokens   /predict's max_new_tokens (both: only if equal)
  temperature, top_p, seed, top_k       as /predict: absent temperature means greedy (OpenAI's
                default is 1); top_k is not OpenAI's (vLLM has it)
  stop          a string or up to 4 (model/stops.py): the reply ends before the first one, no
                part of it ever shown, finish_reason "stop"
  stream        bool, default false; stream_options {"include_usage", "include_obfuscation"}
                only with it (no obfuscation padding is sent)
  response_format  {"type": "text" | "json_object"} or {"type": "json_schema", "json_schema":
                {"name", "description", "schema", "strict"}}: the reply is held to the schema
                by a grammar (structured/guidance.py) and checked when it ends
                (structured/reply_check.py), so it parses and validates unless finish_reason is
                "length"; a schema no reply can be held to is refused before the reply
                (structured/settle.py, structured/schema_rules.py)
  tools, tool_choice ("none" | "auto" | "required" | {"type": "function", "function":
                {"name"}}), parallel_tool_calls   function tools through
                chat_completions/tool_protocol.py's text protocol, held to by a grammar; messages
                may then hold an assistant's tool_calls (content null) and role "tool" messages with
                tool_call_id. stop cannot be combined with response_format or tools (it could cut
                the structure)
  logprobs, top_logprobs (0 to 20, only with logprobs true)   each token's log probability and
                its most likely alternatives, in the distribution it was chosen from
                (model/logprobs.py; web/chat_completions/logprobs.py writes them); not with tools
  Accepted only where they change nothing (absent, null or this value), else 400 naming the
  field: n 1, presence_penalty 0, frequency_penalty 0, logit_bias {}. Accepted with any value
  of their type: store, metadata (OpenAI's limits), safety_identifier. prompt_cache_key (else
  user), a string: scopes the conversation cache: only requests with the same key reuse each
  other's cached tokens.
  llama.cpp server fields (what apps written for App Service's built-in model sidecar extension
  send), with llama.cpp's meaning where there is one: n_predict (the length limit, -1: the
  default; one that differs from max_tokens is a 400 naming it), cache_prompt (false: this
  request neither reads from nor leaves anything in the conversation cache), repeat_penalty,
  top_k 0 and seed -1 (as absent); llama.cpp's other sampling knobs and reply extras (min_p,
  typical_p, mirostat, n_probs, ...) are accepted with a value of their type and ignored:
  chat_completions/llamacpp_fields.py lists them and says why.

Reply, stream false: 200 application/json once the reply is complete:
  {"id": "chatcmpl-<request id>", "object": "chat.completion", "created": <unix seconds>,
   "model": ..., "choices": [{"index": 0, "message": {"role": "assistant", "content": ...},
   "logprobs": null (with logprobs: {"content": [{"token", "logprob", "bytes",
   "top_logprobs"}], "refusal": null}),
   "finish_reason": "stop" | "length" | "tool_calls"}],  ("length" also when the reply
   reached REPLY_TIME_LIMIT_S, counted from the request's arrival: outcome time_limit)
   "usage": {"prompt_tokens": ..., "completion_tokens": ..., "total_tokens": ...,
             "prompt_tokens_details": {"cached_tokens": ..., "image_tokens": ...}}}
  (image_tokens: of prompt_tokens, those that stand for images)
  With PROMPT_LOOKUP_TOKENS on, a greedy reply's usage also has "completion_tokens_details":
  {"accepted_prediction_tokens": ..., "rejected_prediction_tokens": ...}: the prompt-lookup
  draft tokens the model accepted and rejected.
  completion_tokens counts every generated token, the end token included (the log line's
  generated_tokens). Nothing is sent before the end, so a generation that fails gets a status:
  500 internal_error, or 503 not_ready when the model worker died; a structured reply that
  fails its final check, 500 invalid_reply.

Reply, stream true: 200 text/event-stream, events `data: <json>\n\n` sent as the text comes:
  chat.completion.chunk objects (id, created and model as above, "choices": [{"index": 0,
  "delta": ..., "logprobs": null (with logprobs, on each content chunk: its tokens'),
  "finish_reason": null}]): first delta {"role": "assistant", "content": ""}, then deltas
  {"content": "..."} (whole characters), then delta {"content": ""} with the finish_reason (a
  reply that calls tools: content null in the message; streamed, the call is held until it is
  complete and sent as one delta {"tool_calls": [{"index", "id", "type", "function": {"name",
  "arguments"}}]} per call); with
  include_usage every chunk has "usage": null and one more chunk follows with "choices": []
  and the usage; the last event is `data: [DONE]`. Nothing else is sent: no SSE comments
  (readers that JSON-parse every line throw on one), and U+2028, U+2029 and U+0085 escaped
  (readers that split lines there, as httpx's aiter_lines does, would cut an event). After
  STREAM_KEEPALIVE_S of silence (the queue, a long prompt, a tool call held) a chunk with
  delta {"content": ""} says nothing. While a prompt of 256 tokens or more to read is read,
  the same chunk with a `progress` member {"read", "total", "seconds_left"} comes at each of
  the worker's reports and every PROGRESS_INTERVAL_S (generation/progress.py; an extension the
  openai SDK keeps aside as an unknown member). A request not started within
  STREAM_START_AFTER_S gets its 200, headers and first chunk at once
  (generation/early_start.py): a refusal after that is an error event, `data: {"error":
  {...}}` with the refusal's fields, and no [DONE]. An error after the first byte ends the
  response without [DONE] and without its final chunk (as /predict), logged with the id; a
  structured reply that fails its final check ends with an error event instead, `data:
  {"error": {...}}` (code invalid_reply), and no [DONE].

Errors before the reply: OpenAI's {"error": {"message", "type", "param", "code"}} with OpenAI's
statuses (errors.py REFUSALS, its openai columns): 400 invalid_request_error (code
invalid_value with the field in param, context_length_exceeded, invalid_json, ...), 401
invalid_api_key, 404 model_not_found / not_found, 413 request_too_large, 415, and 503
server_error (model_not_ready, with "phase"; overloaded) with Retry-After, which the openai SDK
honours when it retries. A client that disconnects stops its generation within one token, also
while it waits for a non-streamed reply.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response

from sidecar import ipc
from sidecar.web.audio.parts import audio_allowance, transcribe_parts
from sidecar.web.chat_completions import logprobs
from sidecar.web.chat_completions.schemas import ChatCompletionRequest
from sidecar.web.chat_completions.tool_protocol import Call, ReplySplitter, read_calls
from sidecar.web.deps import (
    ImagesDep,
    PipelineDep,
    RecordDep,
    SettingsDep,
    SpeechDep,
)
from sidecar.web.errors import ApiError
from sidecar.web.generation.pipeline import read_body
from sidecar.web.generation.progress import ProgressEvent
from sidecar.web.generation.reply import ReplyFormat
from sidecar.web.images.decoding import body_allowance
from sidecar.web.structured import settle as structured
from sidecar.web.structured.reply_check import ReplyCheck

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(
    request: Request,
    settings: SettingsDep,
    pipeline: PipelineDep,
    record: RecordDep,
    images: ImagesDep,
    speech: SpeechDep,
) -> Response:
    # images' data URLs and audio's base64, beyond MAX_BODY_BYTES
    allowance = body_allowance(settings) + audio_allowance(settings)
    body = await read_body(request, settings.max_body_bytes, ChatCompletionRequest, allowance)
    record.stream = body.stream
    # input_audio parts read as the user's text (400s naming the part)
    audio_seconds = await transcribe_parts(request, speech, settings, list(body.messages))
    checked = await images.prepare(body.image_refs(), record)  # 400s naming the image
    check = await structured.settle(body, record)  # 400 invalid_schema
    generate = body.generate(record.request_id, settings.max_new_tokens, checked)
    entry = pipeline.resolve(body.model)  # 404 model_not_found with MODELS_FILE
    model = entry.id if pipeline.strict or body.model is None else body.model
    ids = Ids(f"chatcmpl-{record.request_id}", int(time.time()), model)
    tools = body.calls_tools
    guided_by = "tools" if body.tools else "response_format"  # the field the grammar came from
    reply_format: _Checked
    if body.stream:
        reply_format = EventStream(ids, body.include_usage, tools, check, guided_by)
    else:
        reply_format = Completion(ids, tools, check)
    reply_format.keep_logprobs = body.logprobs_count is not None
    reply_format.audio_seconds = audio_seconds
    try:
        return await pipeline.run(request, record, generate, reply_format, entry)
    except ApiError as error:
        if error.reason == "invalid_guidance":
            error.param = guided_by
        raise


@dataclass(frozen=True)
class Ids:
    """What every object of one reply repeats."""

    id: str
    created: int
    model: str

    def object(self, kind: str, **fields: Any) -> dict[str, Any]:
        head = {"id": self.id, "object": kind, "created": self.created, "model": self.model}
        return head | fields


def _usage(
    end: ipc.End, started: ipc.Started, audio_seconds: float | None = None
) -> dict[str, Any]:
    completion = end.generated_tokens
    details: dict[str, Any] = {
        "cached_tokens": started.cached_tokens,
        "image_tokens": started.image_tokens,
        "passage_cached_tokens": started.passage_cached_tokens,
    }
    if audio_seconds is not None:  # input_audio parts, read as their transcripts' tokens
        details["audio_seconds"] = audio_seconds
    return {
        "prompt_tokens": started.prompt_tokens,  # image tokens included
        "completion_tokens": completion,
        "total_tokens": started.prompt_tokens + completion,
        "prompt_tokens_details": details,
        **_completion_details(end.drafts),
    }


def _completion_details(drafts: ipc.Drafts | None) -> dict[str, Any]:
    """Prompt-lookup drafts as OpenAI reports predicted outputs: draft tokens the model
    accepted and rejected (present only with PROMPT_LOOKUP_TOKENS on, greedy requests)."""
    if drafts is None:
        return {}
    rejected = drafts.checked - drafts.accepted
    details = {
        "accepted_prediction_tokens": drafts.accepted,
        "rejected_prediction_tokens": rejected,
    }
    return {"completion_tokens_details": details}


def _finish_reason(end: ipc.End, calls: list[Call] | None = None) -> str:
    # time_limit (REPLY_TIME_LIMIT_S) is "length" too: the reply was cut short by a limit, the
    # reason OpenAI clients (and llama.cpp's own time limit) know for it.
    if end.finish in ("length", "time_limit"):
        return "length"
    return "tool_calls" if calls else "stop"


def _calls(splitter: ReplySplitter | None, end: ipc.End) -> tuple[str | None, list[Call] | None]:
    """At the end of a reply that may call tools: the text still held (None: no content),
    and the calls (None for a text reply, and for a call cut off by a limit, which is
    dropped: so is the start of the marker when the limit came first)."""
    if splitter is None:
        return "", None
    rest = splitter.rest()
    if splitter.calling:
        return None, read_calls(rest)
    if rest and _finish_reason(end) == "length" and splitter.undecided:
        return None, None
    return rest, None


def _json(data: dict[str, Any]) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


class _Checked(ReplyFormat):
    """A reply format whose finished structured reply is checked (structured/reply_check.py) before
    it is delivered as valid; None: nothing to check."""

    def __init__(self, check: ReplyCheck | None, tools: bool) -> None:
        self._check = check
        self._whole: list[str] = []  # the reply as written, kept only to be checked
        self._splitter = ReplySplitter() if tools else None
        self.keep_logprobs = False  # logprobs: true (web/chat_completions/logprobs.py)
        self.audio_seconds: float | None = None  # the input_audio parts' (web/audio/parts.py)
        self._logprobs: list[ipc.TokenLogprob] = []  # not yet written

    def logprobs(self, entries: list[ipc.TokenLogprob]) -> None:
        self._logprobs += entries

    def _logprobs_out(self) -> dict[str, Any] | None:
        """The choice's `logprobs`: the entries not yet written (None: not asked for)."""
        if not self.keep_logprobs:
            return None
        out, self._logprobs = self._logprobs, []
        return {"content": logprobs.entries(out), "refusal": None}

    def _keep(self, text: str) -> None:
        if self._check is not None:
            self._whole.append(text)

    def refusal(self, end: ipc.End) -> ApiError | None:
        if self._check is None or end.finish != "eos":  # cut off by a limit: says so itself
            return None
        calling = self._splitter is not None and self._splitter.calling
        problem = self._check.problem("".join(self._whole), calling)
        if problem is None:
            return None
        return ApiError("invalid_reply", f"the finished reply fails its final check: {problem}")


class Completion(_Checked):
    """stream false: one chat.completion object when the reply is complete."""

    media_type = "application/json"
    buffered = True

    def __init__(self, ids: Ids, tools: bool = False, check: ReplyCheck | None = None) -> None:
        super().__init__(check, tools)
        self._ids = ids
        self._text: list[str] = []

    def piece(self, text: str) -> bytes:
        self._keep(text)
        self._text.append(self._splitter.feed(text) if self._splitter else text)
        return b""

    def tail(self, end: ipc.End, started: ipc.Started) -> bytes:
        rest, calls = _calls(self._splitter, end)
        shown = "".join(self._text)
        text = None if rest is None and not shown else shown + (rest or "")
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [call.as_openai() for call in calls]
        choice = {
            "index": 0,
            "message": message,
            "logprobs": self._logprobs_out(),
            "finish_reason": _finish_reason(end, calls),
        }
        usage = _usage(end, started, self.audio_seconds)
        return _json(self._ids.object("chat.completion", choices=[choice], usage=usage))


class EventStream(_Checked):
    """stream true: server-sent events, one chat.completion.chunk each, then [DONE]."""

    media_type = "text/event-stream"

    def __init__(
        self,
        ids: Ids,
        include_usage: bool,
        tools: bool = False,
        check: ReplyCheck | None = None,
        guided_by: str | None = None,
    ) -> None:
        super().__init__(check, tools)
        self._ids = ids
        self._include_usage = include_usage
        self._guided_by = guided_by  # names the field of an invalid_guidance refused mid-stream

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        # each token's log probabilities go with the first chunk after them
        written = self._logprobs_out() if "content" in delta or finish_reason else None
        choice = {"index": 0, "delta": delta, "logprobs": written, "finish_reason": finish_reason}
        usage = {"usage": None} if self._include_usage else {}
        return _event(self._ids.object("chat.completion.chunk", choices=[choice], **usage))

    def head(self) -> bytes:
        # "content" in the first and the last delta, as OpenAI sends it: readers that map every
        # chunk to its content (Spring's Reactor: null is an error) read them as no text.
        return self._chunk({"role": "assistant", "content": ""})

    shows_progress = True

    def keepalive(self) -> bytes:
        # A chunk, not an SSE comment: readers that JSON-parse every line (.NET's) throw on one.
        return self._chunk({"content": ""})

    def progress(self, event: ProgressEvent) -> bytes:
        # A keep-alive's chunk with one member more: readers that take every chunk's first
        # choice (most) read it as no text, SDKs keep unknown members aside (issue 54)
        choice = {"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": None}
        usage = {"usage": None} if self._include_usage else {}
        chunk = self._ids.object("chat.completion.chunk", choices=[choice], **usage)
        return _event(chunk | {"progress": event.as_json()})

    def loading(self, event: dict[str, Any]) -> bytes:
        # As progress: a keep-alive's chunk with a `loading` member (web/models/pool.py)
        choice = {"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": None}
        usage = {"usage": None} if self._include_usage else {}
        chunk = self._ids.object("chat.completion.chunk", choices=[choice], **usage)
        return _event(chunk | {"loading": event})

    def piece(self, text: str) -> bytes:
        self._keep(text)
        if self._splitter is not None:
            text = self._splitter.feed(text)  # a call is held until it is complete
        return self._chunk({"content": text}) if text else b""

    def refused(self, error: ApiError) -> bytes:
        # An error event, as llama.cpp's server and vLLM send one mid-stream (the SDK raises
        # it as an APIError); no final chunk, no [DONE]: the reply is not complete. Also a
        # refusal that came after an early start (generation/early_start.py).
        if error.reason == "invalid_guidance":
            error.param = self._guided_by
        return _event({"error": error.openai_body()})

    def tail(self, end: ipc.End, started: ipc.Started) -> bytes:
        rest, calls = _calls(self._splitter, end)
        events = self._chunk({"content": rest}) if rest else b""
        # One delta per call, whole: the SDK's stream helpers assemble deltas by index.
        for index, call in enumerate(calls or ()):
            events += self._chunk({"tool_calls": [call.as_openai(index)]})
        events += self._chunk({"content": ""}, _finish_reason(end, calls))
        if self._include_usage:
            usage = _usage(end, started, self.audio_seconds)
            events += _event(self._ids.object("chat.completion.chunk", choices=[], usage=usage))
        return events + b"data: [DONE]\n\n"


# Characters that some line readers take for line ends, which JSON leaves raw (httpx's
# aiter_lines splits at all three, as str.splitlines does): escaped, so that every event stays
# one line. They appear only inside strings, where the escape means the same character.
_LINE_ENDS = {ord(c): f"\\u{ord(c):04x}" for c in "\u0085\u2028\u2029"}


def _event(data: dict[str, Any]) -> bytes:
    line = json.dumps(data, ensure_ascii=False, separators=(",", ":")).translate(_LINE_ENDS)
    return b"data: " + line.encode() + b"\n\n"
