"""The chat models a model service lists (`GET /v1/models`), for the page's model picker
(`GET /api/models`, relay/model_list.py). Both upstream modules read their list with these.

Our sidecar lists each chat model with `state` (`loaded`, `loading`, `available`, `failed`),
`default`, `load_s`, `input_modalities` and `aliases` (docs/api.md, "Several models"), then
its encoder and its speech model, which have a `type` and no `state`: in a list where some
entry has a `state`, the chat models are those entries. Another server's list (Ollama,
llama-server, vLLM, LM Studio) says less: each entry is a chat model but those that say they
are something else (a `type` such as `embedding` or `transcription`, or an encoder's
`dimensions`); whether it is loaded is not said (`state` None).

What a model reads: its `input_modalities` when the list gives them. Our sidecar knows them
only once the model has been loaded (a model not resident is listed as reading text), so for
a model that is not `loaded` a list without "image" is no answer, and the page offers images
(the sidecar's refusal of an image then says the model reads text only).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from chatapp.errors import ApiError
from chatapp.relay import wire
from chatapp.relay.upstream import (
    NOT_REACHABLE,
    ChatModel,
    Connection,
    host_refused,
    unauthorized,
)

STATES = ("loaded", "loading", "available", "failed")  # ChatModel.state
# What a server's `type` says a chat model is (LM Studio's llm and vlm); anything else is not.
CHAT_TYPES = ("chat", "llm", "vlm", "text", "text-generation")
MAX_MODELS = 200  # a server that lists more (a hub's catalogue) offers these to the page
MAX_ALIASES = 32


def fetch(connection: Connection, path: str) -> tuple[int, Any]:
    """(status, body) of the model list; a 503 `upstream_unavailable` when nothing answers."""
    answer = connection.get_json(path)
    if answer is None:
        raise ApiError("upstream_unavailable", NOT_REACHABLE, status=503)
    return answer


def refusal(status: int, body: Any) -> ApiError:
    """The app's error for a model list that did not come (any status but 200)."""
    if status in (401, 403):
        return unauthorized()
    error = body.get("error") if isinstance(body, dict) else None
    said = (error.get("type"), error.get("code")) if isinstance(error, dict) else ()
    if status == 400 and "invalid_host" in said:  # its ALLOWED_HOSTS, not the person's
        return host_refused()
    return ApiError(
        "upstream_error", f"The model service's model list answered {status}.", status=502
    )


def first_id(body: Any) -> str | None:
    """The first id the list names, whatever its kind (the model an OpenAI-compatible server
    answers with when UPSTREAM_MODEL names none: upstream_openai.py)."""
    for entry in _entries(body):
        if isinstance(entry.get("id"), str):
            return str(entry["id"])
    return None


def chat_models(body: Any, default: str | None = None) -> list[ChatModel]:
    """The chat models of a model list's body, in its order. `default` names the model that
    answers a chat naming none (UPSTREAM_MODEL), listed first if the list lacks it; None: the
    one the list marks `default` (our sidecar's), else the first."""
    entries = _entries(body)
    ours = any("state" in entry for entry in entries)
    found: list[ChatModel] = []
    for entry in entries:
        model = _chat_model(entry, ours)
        if model is not None and all(other.id != model.id for other in found):
            found.append(model)
        if len(found) == MAX_MODELS:
            break
    if default is None:
        marked = next((m.id for m in found if m.default), None)
        default = marked or (found[0].id if found else None)
    if default is not None and all(m.id != default for m in found):
        found.insert(0, ChatModel(default))
    return [replace(m, default=m.id == default) for m in found]


def _entries(body: Any) -> list[dict[str, Any]]:
    data = body.get("data") if isinstance(body, dict) else None
    return [entry for entry in data if isinstance(entry, dict)] if isinstance(data, list) else []


def _chat_model(entry: dict[str, Any], ours: bool) -> ChatModel | None:
    """An entry as a chat model; None for an encoder, a speech model, a malformed entry."""
    name = entry.get("id")
    if not wire.valid_model(name):
        return None
    kind = entry.get("type")
    if ours and "state" not in entry:
        return None  # our sidecar's encoder or speech model
    if (isinstance(kind, str) and kind.lower() not in CHAT_TYPES) or "dimensions" in entry:
        return None
    state = entry.get("state") if entry.get("state") in STATES else None
    load_s = _seconds(entry.get("load_s"))
    aliases = entry.get("aliases")
    return ChatModel(
        id=str(name),
        default=entry.get("default") is True,
        state=state,
        load_s=None if load_s is None else round(load_s, 1),
        input_modalities=_modalities(entry.get("input_modalities"), state),
        aliases=tuple(
            a
            for a in (aliases if isinstance(aliases, list) else [])[:MAX_ALIASES]
            if wire.valid_model(a)
        ),
    )


def _seconds(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None


def _modalities(value: Any, state: str | None) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    if state not in (None, "loaded") and "image" not in value:
        return None  # not loaded: our sidecar does not know yet (the module's docstring)
    return tuple(v for v in value if v in ("text", "image", "audio"))
