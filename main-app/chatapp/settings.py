"""Settings: the one home for every knob of the chat app.

`create_app` starts from `DEFAULTS`, then applies `from_environ(os.environ)`, then the test
config. Nothing here reads the environment at import time. `HOST` and `PORT` are read by the
servers that run the app (`chatapp.gunicorn_conf`, `python -m chatapp`) through `listen_address`;
`WEB_CONCURRENCY` and `GUNICORN_CONNECTIONS` size gunicorn (`server_size`).

Every variable, its default and what it means: `DESCRIPTIONS` below, and the page generated
from it, docs/configuration.md (`python -m scripts.gen_docs`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from chatapp.guards.host import allowed

DEFAULTS: dict[str, Any] = {
    "SIDECAR_URL": "http://localhost:8000",
    "SIDECAR_CONNECT_TIMEOUT": 3.0,
    "SIDECAR_READ_TIMEOUT": 300.0,
    "RELAY_TIME_LIMIT": 220.0,
    "HEARTBEAT_INTERVAL": 1.0,
    "QUEUED_STREAM_AFTER": 3.0,
    # Flask's own name; the environment says MAX_REQUEST_BYTES. The sidecar's default limit.
    "MAX_CONTENT_LENGTH": 64 * 1024,
    "REQUEST_BODY_TIMEOUT": 10.0,
    # The sidecar's MAX_IMAGE_BYTES and MAX_IMAGES (chatapp/relay/images.py).
    "MAX_IMAGE_BYTES": 5 * 1024 * 1024,
    "MAX_IMAGES": 4,
    "MAX_IMAGE_CHATS": 4,
    "MAX_IMPORT_BYTES": 8 * 1024 * 1024,
    "MAX_MESSAGES": 200,
    "MAX_NEW_TOKENS": None,
    "MAX_NEW_TOKENS_LIMIT": 4096,
    "LOG_LEVEL": "info",
    "UPSTREAM_API": "predict",
    "UPSTREAM_MODEL": None,
    "UPSTREAM_SPEECH_MODEL": "whisper-1",
    "UPSTREAM_API_KEY": None,
    "ALLOWED_HOSTS": None,  # unset: the loopback names (chatapp/guards/host.py)
    "WEBSITE_HOSTNAME": None,
    "METRICS": True,
    # Documents (chatapp/documents/, docs/documents.md).
    "DOCUMENT_MAX_BYTES": 20 * 1024 * 1024,
    "DOCUMENT_MAX_PAGES": 2000,
    "DOCUMENT_MAX_FILES": 20,
    "DOCUMENT_SEARCH": "hybrid",
    "DOCUMENT_KEYWORD_WEIGHT": 0.3,
    "DOCUMENT_INDEXER": "thread",
    "DOCUMENT_INDEXER_THREADS": 2,
    "DOCUMENT_READ_TIMEOUT": 120.0,
    "DOCUMENT_READ_MEMORY_MB": 512,
    "DOCUMENT_PASSAGES": 6,
    "DOCUMENT_CONTEXT_TOKENS": 1200,
    "DOCUMENT_MIN_SCORE": 0.2,
    "PASSAGE_WARM": False,
    "PASSAGE_WARM_PASSAGES": 256,
    "EMBED_MODEL": "all-minilm-l6-v2",
    "EMBED_TOKENIZER": None,
    "EMBED_MAX_TOKENS": 256,
    "OTEL_EXPORTER_OTLP_ENDPOINT": None,
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": None,
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    "APPLICATIONINSIGHTS_CONNECTION_STRING": None,
    "TRACES_FILE": None,
    "OTEL_SERVICE_NAME": "phi3-chat-app",
    "OTEL_SDK_DISABLED": False,
    # The database (chatapp/store/): unset, a SQLite file in DATA_DIR.
    "DATABASE_URL": None,
    "DATA_DIR": "data",
    # Who is asking (chatapp/accounts/), and how long chats are kept.
    "AUTH_MODE": "none",
    "AUTH_HEADER": "X-Forwarded-User",
    "AUTH_NAME_HEADER": None,
    "TRUSTED_PROXIES": [],
    "CHAT_RETENTION_DAYS": None,
}

# Read by the server that runs the app, not by create_app (listen_address, server_size).
SERVER_DEFAULTS: dict[str, Any] = {
    "HOST": "0.0.0.0",
    "PORT": 8080,
    "WEB_CONCURRENCY": 2,
    "GUNICORN_CONNECTIONS": 1000,
    "REQUEST_HEADERS_TIMEOUT": 5,
}

# What each environment variable means (docs/configuration.md is generated from it; a test
# requires one for every variable the app reads).
DESCRIPTIONS: dict[str, str] = {
    "SIDECAR_URL": "Base URL of the model service: the sidecar, or an OpenAI-compatible server "
    "(its root or its `/v1`).",
    "UPSTREAM_API": "How to talk to it: `predict` (our sidecar's `POST /predict`, events) or "
    "`openai` (`POST /v1/chat/completions` on any OpenAI-compatible server; docs/models.md, "
    "'Other model servers').",
    "UPSTREAM_MODEL": "With `openai`, the model to ask for; unset, the first one the server lists "
    "at `GET /v1/models`.",
    "UPSTREAM_SPEECH_MODEL": "With `openai`, the `model` sent to the server's `POST "
    "/v1/audio/transcriptions` for the page's microphone (OpenAI's `whisper-1`; a local "
    "server's speech model). Our sidecar answers with its own speech model whatever is sent "
    "(docs/speech.md).",
    "SIDECAR_CONNECT_TIMEOUT": "Seconds to open a connection to the sidecar.",
    "SIDECAR_READ_TIMEOUT": "The longest silence, in seconds, tolerated from the sidecar, before "
    "its answer starts and between two pieces of a reply. The prefill of a long prompt on a slow "
    "CPU is silence too, hence the generous default.",
    "RELAY_TIME_LIMIT": "The longest a chat may take, in seconds from its request: the relay "
    "then ends the reply with an `error` line of type `reply_time_limit` and hangs up (the "
    "sidecar stops generating). App Service's front end cuts every request at 230 s, silently "
    "for the page; this ends it first, with a sentence. It also bounds the wait for the reply "
    "to start (`SIDECAR_READ_TIMEOUT` never waits longer). Our sidecar's own "
    "`REPLY_TIME_LIMIT_S` (210) usually ends the reply before, as a normal end "
    "(`finish_reason` `length`).",
    "QUEUED_STREAM_AFTER": "Seconds the relay waits for the model service to start its answer "
    "before it starts the stream itself, with heartbeats (a chat the sidecar keeps queued behind "
    "others), so that a browser that leaves is noticed and its request leaves the queue. A "
    "refusal before then is the page's HTTP status (a retry countdown for `loading`, `busy`); "
    "one after it is the stream's last line (`chatapp.relay.pending`).",
    "HEARTBEAT_INTERVAL": "Seconds of sidecar silence after which the relay writes a "
    '`{"ping": true}` line, so that a browser that went away is noticed quickly.',
    "MAX_REQUEST_BYTES": "The largest accepted `POST /chat` body, else 413; a body with images "
    "may be larger by its images' data URLs alone (`MAX_IMAGE_BYTES`, `MAX_IMAGES`). Keep it at "
    "most the sidecar's `MAX_BODY_BYTES` (same default). The page drops the oldest turns of a "
    "long conversation to stay under it (the sidecar would leave them out of the context "
    "anyway).",
    "MAX_IMAGE_BYTES": "The largest image file a chat may carry, in bytes (after base64), else "
    "413; the page makes a larger one smaller before it sends it (at most 1344 x 1344 pixels' "
    "worth). Keep it at most the sidecar's `MAX_IMAGE_BYTES` (same default).",
    "MAX_IMAGES": "The most images in one `POST /chat` (the whole conversation), else 413; the "
    "page leaves the oldest turns out to stay under it. 0: the app takes no image and the "
    "page offers none. Keep it at most the sidecar's `MAX_IMAGES` (same default). The "
    "largest body `POST /chat` then reads is `MAX_REQUEST_BYTES` plus this many images in "
    "base64 (about 28 MiB by default).",
    "MAX_IMAGE_CHATS": "Chats with images (a body larger than `MAX_REQUEST_BYTES`) each app "
    "process relays at once, each holding its body in memory until its reply ends; one more "
    "is answered 503 `busy` with `Retry-After` without being read (the page waits and sends "
    "it again). Text-only chats are not counted.",
    "MAX_IMPORT_BYTES": "The largest text of a chat imported with `POST /api/chats` (the "
    "page's own chats, on first sign-in): the body less its images' data URLs, else 413. Its "
    "images have the room `POST /chat` gives them (`MAX_IMAGES`, each at most "
    "`MAX_IMAGE_BYTES`), so the largest import body is this plus about 28 MiB by default. A "
    "long chat's text (2,000 messages at most) is larger than one request's "
    "(`MAX_REQUEST_BYTES`): the model sees only its newest turns that fit.",
    "REQUEST_BODY_TIMEOUT": "Seconds a client has to send a request's whole body, from the end "
    "of its headers; then `POST /chat` answers 408 `request_timeout` and the connection is "
    "closed, so a stalled or endless body cannot hold a socket "
    "(`chatapp.guards.body_deadline`; under "
    "gunicorn's gevent worker, as deployed).",
    "REQUEST_HEADERS_TIMEOUT": "Seconds a client has to send a request's headers, and that an "
    "idle kept-alive connection lives; then the connection is closed (gunicorn's `keepalive`), "
    "so slow and idle clients cannot hold sockets.",
    "MAX_MESSAGES": "The most messages in one conversation, else 413.",
    "MAX_NEW_TOKENS": "Sent to the sidecar as `max_new_tokens` when the browser does not send "
    "one; unset, the sidecar decides.",
    "MAX_NEW_TOKENS_LIMIT": "The largest `max_new_tokens` (and `min_new_tokens`) a browser may ask "
    "for, else 400; the page's settings offer up to this.",
    "UPSTREAM_API_KEY": "Sent as `Authorization: Bearer <key>`, for our sidecar started with "
    "`API_KEY` or any server that wants a key.",
    "SIDECAR_API_KEY": "The same setting as `UPSTREAM_API_KEY`, by its older name.",
    "ALLOWED_HOSTS": "The Host header values this app answers, comma-separated: names, "
    "`*.example.com` (its subdomains) or `*` (any); others get 400 `invalid_host`, against DNS "
    "rebinding. Unset: the loopback names only (`localhost`, `127.0.0.1`, `[::1]`, any port). "
    "Set it to every name the app is reached by: a custom domain, a compose or Kubernetes "
    "service name. `/healthz`, `/readyz` and `/metrics` answer any name (probes and scrapers).",
    "WEBSITE_HOSTNAME": "Set by App Service to the site's own name "
    "(`<app>.azurewebsites.net`): answered beside the loopback names or `ALLOWED_HOSTS`.",
    "LOG_LEVEL": "`debug`, `info`, `warning` or `error`: the app's JSON log lines from that level "
    "up (one `info` line per chat, see `chatapp.observability.logs`).",
    "METRICS": "Serve `GET /metrics` (Prometheus text; counts and timings, never text or ids); "
    "`false` removes the route, e.g. on a public site nobody scrapes.",
    "DOCUMENT_MAX_BYTES": "The largest file a library takes, in bytes; a larger one is listed as "
    "failed with `too_large` (a DOCX may unpack to 20 times this, a zip bomb's refusal).",
    "DOCUMENT_MAX_PAGES": "The most pages of a PDF that is read; more: failed, `too_large`.",
    "DOCUMENT_MAX_FILES": "The most files one `POST /api/documents` takes, else 413.",
    "DOCUMENT_SEARCH": "How the library is searched: `hybrid` (both, relative score fusion: "
    "each method's scores scaled over its candidates, then weighed), `dense` (the encoder's "
    "vectors), `keyword` (full-text, BM25) or `fusion` (both, reciprocal rank fusion). The "
    "default is what the evaluation suite chose (docs/benchmarks/rag.md); without an encoder, "
    "`keyword` whatever is set.",
    "DOCUMENT_KEYWORD_WEIGHT": "With `DOCUMENT_SEARCH=hybrid`, the weight of keyword scores "
    "(0-1; the encoder's get the rest): a passage scores its scaled cosine times 1 less this, "
    "plus its document's best scaled keyword score times this. 0.3 was chosen on the suite.",
    "DOCUMENT_INDEXER": "Where documents are read and embedded, always outside the request: "
    "`thread` (an OS thread of the app's process: the development server, tests), `process` "
    "(one indexer process beside gunicorn's workers, started by its master: what "
    "`chatapp.gunicorn_conf` sets when unset), `off` (none here: another instance indexes).",
    "DOCUMENT_INDEXER_THREADS": "Documents the indexer process reads at once (with "
    "`DOCUMENT_INDEXER=process`). Each document asks the model service for its own passages' "
    "vectors, so one small file at a time leaves the encoder's second thread idle: two read "
    "the FAQ's small files 1.6x as fast as one (docs/documents.md). With two or more, the last "
    "is a quick lane: it gives a document back after 5 s, so a small file never waits for a "
    "large one.",
    "DOCUMENT_READ_TIMEOUT": "Seconds a document's reading (parsing and cutting, in a process "
    "of its own) may take; past it the reader is killed and the document fails `too_slow`. "
    "Embedding its passages is not counted.",
    "DOCUMENT_READ_MEMORY_MB": "The address space of each reader process (one per indexer "
    "thread), in MiB: a file that needs more fails `too_large`, and the indexer's own memory "
    "never grows with a file. Keep `DOCUMENT_INDEXER_THREADS` times this within the app's "
    "memory.",
    "DOCUMENT_PASSAGES": 'The most passages a grounded turn (`"documents": true`) is given.',
    "DOCUMENT_CONTEXT_TOKENS": "The most chat-model tokens a grounded turn's passages take "
    "(estimated from the encoder's count, docs/documents.md): room left in a 4,096-token "
    "context for the conversation and the reply.",
    "PASSAGE_WARM": "Send the library's passages to our sidecar's passage store ahead of "
    "questions (`POST /v1/passages/warm`; `UPSTREAM_API=predict` only): the model reads them "
    "while idle, newest documents first, within the store's bound, and a first question whose "
    "best passage is one of them finds it read (docs/documents.md, 'Passages read once'). The "
    "indexer sends each document once it is ready, and the newest `PASSAGE_WARM_PASSAGES` at "
    "its start and every 10 minutes (a restarted sidecar is warmed again).",
    "PASSAGE_WARM_PASSAGES": "With `PASSAGE_WARM`, the most passages of the library sent in "
    "one sweep, newest documents first.",
    "DOCUMENT_MIN_SCORE": "With `DOCUMENT_SEARCH` `hybrid` or `dense`, the least cosine "
    "similarity to the question a passage "
    "needs to be given to a grounded turn; below it the turn is told nothing relevant was "
    "found (-1 keeps everything).",
    "EMBED_MODEL": "The `model` sent to the model service's `POST /v1/embeddings` (our sidecar "
    "takes any; Ollama and llama.cpp want their encoder's name).",
    "EMBED_TOKENIZER": "The encoder's folder (its `tokenizer.json`: the sidecar's "
    "`EMBED_MODEL_PATH`) or the file itself: passages are measured with it, exactly. Unset: "
    "with the tokenizer the model service gives (our sidecar's `GET /v1/embeddings/tokenizer`, "
    "kept in `DATA_DIR`), else by a bound that never undercounts (UTF-8 bytes: passages about "
    "a quarter of `EMBED_MAX_TOKENS` for English), which `/healthz` says "
    "(`documents.passages`).",
    "EMBED_MAX_TOKENS": "The most tokens of a passage (its heading included, special tokens "
    "counted): the encoder's limit (256 for all-MiniLM-L6-v2, whose longer inputs the sidecar "
    "refuses) or less. The encoder's own limit when lower (its folder's, with "
    "`EMBED_TOKENIZER`; else the model service's `max_input_tokens` in `/v1/models`).",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "OpenTelemetry's standard variable: send spans over OTLP/HTTP "
    "(protobuf) to this collector, at its `/v1/traces` (`http://localhost:4318`).",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "The full URL for spans, used as it is.",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "The only one installed; others are refused.",
    "APPLICATIONINSIGHTS_CONNECTION_STRING": "Send spans to this Application Insights resource "
    "(Azure Monitor; App Service's name for it).",
    "TRACES_FILE": "Append spans to this file as OTLP JSON lines (disconnected sites).",
    "OTEL_SERVICE_NAME": "The spans' `service.name`.",
    "OTEL_SDK_DISABLED": "`true` turns tracing off whatever is set.",
    "DATABASE_URL": "The database that keeps users and chats, as a SQLAlchemy URL: "
    "`sqlite:///PATH` (a file; `sqlite:////abs/path`) or "
    "`postgresql+psycopg://USER:PASSWORD@HOST/DB` (`postgresql://` works too; for several "
    "instances). Unset: the SQLite file `chatapp.db` in "
    "`DATA_DIR`. Migrations run when the app starts, once however many workers start together.",
    "DATA_DIR": "The folder of the app's own files (made if missing): the SQLite database when "
    "`DATABASE_URL` is unset. Relative paths are from the working directory; the image sets "
    "`/data`, a volume in the compose file.",
    "AUTH_MODE": "Who is asking (docs/deploy.md, 'Sign-in'): `none` (one local user; identity "
    "headers are ignored; the page keeps chats in the browser), `appservice` (App Service's "
    "Easy Auth headers `X-MS-CLIENT-PRINCIPAL-ID` and `-NAME`, which its front end strips from "
    "what clients send; a request without them is 401 `unauthenticated`) or `header` (a "
    "reverse proxy's `AUTH_HEADER`, believed only on connections from `TRUSTED_PROXIES`). "
    "With a user, chats are kept on the server, per user.",
    "AUTH_HEADER": "With `AUTH_MODE=header`: the request header that names the user "
    "(oauth2-proxy's `X-Forwarded-User` with `--pass-user-headers`; `X-Auth-Request-User` "
    "behind nginx's auth_request).",
    "AUTH_NAME_HEADER": "With `AUTH_MODE=header`: a header with the user's display name "
    "(`X-Forwarded-Email`, `X-Forwarded-Preferred-Username`); unset, the name is the user.",
    "TRUSTED_PROXIES": "With `AUTH_MODE=header`: the addresses (IPs or CIDR networks, "
    "comma-separated) of the proxy that signs people in; the identity header is believed only "
    "on connections from them (required in that mode). Make the app reachable only through "
    "the proxy too.",
    "CHAT_RETENTION_DAYS": "Delete the chats and library documents not updated for this many "
    "days, a document with its kept file and passages (each app process sweeps at start and "
    "hourly); unset: kept until their owner deletes them.",
    "HOST": "The address the server listens on.",
    "PORT": "The port the server listens on (App Service sends outside traffic to 8080).",
    "WEB_CONCURRENCY": "gunicorn worker processes.",
    "GUNICORN_CONNECTIONS": "Connections each gunicorn process serves at once (gevent: one "
    "greenlet per connection, so long streams and slow clients hold no thread; a request's "
    "headers must arrive within 5 s). Past it a process stops accepting: new connections wait "
    "in the kernel's queue, unanswered, until one of its connections closes. Each needs up to "
    "two open files (its own, and a chat's call to the model service): the start line `open "
    "files` warns when the open-files limit, raised to the hard limit at start, is below "
    "2 x this + 64.",
}

LOG_LEVELS = ("debug", "info", "warning", "error")
UPSTREAM_APIS = ("predict", "openai")
SEARCH_METHODS = ("hybrid", "dense", "keyword", "fusion")
INDEXERS = ("thread", "process", "off")


class SettingsError(ValueError):
    """An environment variable holds a value the app cannot use."""


def _url(name: str, raw: str) -> str:
    """http(s) URL"""
    url = raw.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise SettingsError(f"{name} must start with http:// or https://, got {raw!r}")
    return url


def _positive_float(name: str, raw: str) -> float:
    """seconds, > 0"""
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise SettingsError(f"{name} must be greater than 0, got {raw!r}")
    return value


def _positive_int(name: str, raw: str) -> int:
    """whole number, >= 1"""
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a whole number, got {raw!r}") from None
    if value < 1:
        raise SettingsError(f"{name} must be at least 1, got {raw!r}")
    return value


def _whole(name: str, raw: str) -> int:
    """whole number, >= 0"""
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a whole number, got {raw!r}") from None
    if value < 0:
        raise SettingsError(f"{name} must be at least 0, got {raw!r}")
    return value


def _log_level(name: str, raw: str) -> str:
    """one of LOG_LEVELS"""
    level = raw.strip().lower()
    if level not in LOG_LEVELS:
        raise SettingsError(f"{name} must be one of {', '.join(LOG_LEVELS)}, got {raw!r}")
    return level


def _secret(name: str, raw: str) -> str:
    """secret text"""
    return raw.strip()


def _upstream_api(name: str, raw: str) -> str:
    """one of UPSTREAM_APIS"""
    api = raw.strip().lower()
    if api not in UPSTREAM_APIS:
        raise SettingsError(f"{name} must be one of {', '.join(UPSTREAM_APIS)}, got {raw!r}")
    return api


def _model(name: str, raw: str) -> str:
    """text"""
    return raw.strip()


def _hosts(name: str, raw: str) -> list[str]:
    """host names, comma-separated"""
    # Matched by chatapp/guards/host.py: a name, "*.example.com" (its subdomains), "*" (any).
    return [h.strip().lower() for h in raw.split(",") if h.strip()]


def _host_name(name: str, raw: str) -> str:
    """a host name"""
    return raw.strip().lower()


def _bool(name: str, raw: str) -> bool:
    """true or false"""
    value = raw.strip().lower()
    if value not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise SettingsError(f"{name} must be true or false, got {raw!r}")
    return value in ("1", "true", "yes", "on")


def _text(name: str, raw: str) -> str:
    """text"""
    return raw.strip()


def _auth_mode(name: str, raw: str) -> str:
    """none, appservice or header"""
    mode = raw.strip().lower()
    if mode not in ("none", "appservice", "header"):
        raise SettingsError(f"{name} must be none, appservice or header, got {raw!r}")
    return mode


def _header_name(name: str, raw: str) -> str:
    """an HTTP header name"""
    header = raw.strip()
    if not re.fullmatch(r"[A-Za-z0-9-]{1,100}", header):
        raise SettingsError(f"{name} must be an HTTP header name, got {raw!r}")
    return header


def _networks(name: str, raw: str) -> list[Any]:
    """IP addresses or CIDR networks, comma-separated"""
    import ipaddress

    networks = []
    for part in raw.split(","):
        if part.strip():
            try:
                networks.append(ipaddress.ip_network(part.strip(), strict=False))
            except ValueError:
                raise SettingsError(f"{name}: {part.strip()!r} is not an IP address") from None
    return networks


def _database_url(name: str, raw: str) -> str:
    """sqlite:///PATH or postgresql+psycopg://..."""
    # The form only: chatapp.store.database parses it (SQLAlchemy is not loaded here, where
    # gunicorn's master reads the settings before its workers patch the standard library).
    url = raw.strip()
    if not url.startswith(("sqlite:///", "postgresql://", "postgresql+psycopg://")):
        raise SettingsError(
            f"{name} must start with sqlite:/// or postgresql+psycopg:// (or postgresql://)"
        )
    return url


def _search_method(name: str, raw: str) -> str:
    """one of SEARCH_METHODS"""
    method = raw.strip().lower()
    if method not in SEARCH_METHODS:
        raise SettingsError(f"{name} must be one of {', '.join(SEARCH_METHODS)}, got {raw!r}")
    return method


def _indexer(name: str, raw: str) -> str:
    """one of INDEXERS"""
    where = raw.strip().lower()
    if where not in INDEXERS:
        raise SettingsError(f"{name} must be one of {', '.join(INDEXERS)}, got {raw!r}")
    return where


def _number_from(low: float, high: float) -> Callable[[str, str], float]:
    """A parser of a number from `low` to `high` (its docstring the documented kind)."""

    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"{name} must be a number, got {raw!r}") from None
        if not low <= value <= high:
            raise SettingsError(f"{name} must be from {low:g} to {high:g}, got {raw!r}")
        return value

    parse.__doc__ = f"number, {low:g} to {high:g}"
    return parse


_similarity = _number_from(-1, 1)
_weight = _number_from(0, 1)


def _read_memory(name: str, raw: str) -> int:
    """whole number, 64 or more"""
    value = _positive_int(name, raw)
    if value < 64:  # Python and the readers need about 20 MiB before any file
        raise SettingsError(f"{name} must be at least 64, got {raw!r}")
    return value


def _embed_tokens(name: str, raw: str) -> int:
    """whole number, 16 to 8192"""
    value = _positive_int(name, raw)
    if not 16 <= value <= 8192:
        raise SettingsError(f"{name} must be from 16 to 8192, got {raw!r}")
    return value


def _otlp_protocol(name: str, raw: str) -> str:
    """http/protobuf"""
    if raw.strip() != "http/protobuf":
        raise SettingsError(f"{name} must be http/protobuf (the one installed), got {raw!r}")
    return raw.strip()


# Environment variable -> (config key, parser).
_FROM_ENV: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "SIDECAR_URL": ("SIDECAR_URL", _url),
    "SIDECAR_CONNECT_TIMEOUT": ("SIDECAR_CONNECT_TIMEOUT", _positive_float),
    "SIDECAR_READ_TIMEOUT": ("SIDECAR_READ_TIMEOUT", _positive_float),
    "RELAY_TIME_LIMIT": ("RELAY_TIME_LIMIT", _positive_float),
    "HEARTBEAT_INTERVAL": ("HEARTBEAT_INTERVAL", _positive_float),
    "QUEUED_STREAM_AFTER": ("QUEUED_STREAM_AFTER", _positive_float),
    "MAX_REQUEST_BYTES": ("MAX_CONTENT_LENGTH", _positive_int),
    "REQUEST_BODY_TIMEOUT": ("REQUEST_BODY_TIMEOUT", _positive_float),
    "MAX_IMAGE_BYTES": ("MAX_IMAGE_BYTES", _positive_int),
    "MAX_IMAGES": ("MAX_IMAGES", _whole),
    "MAX_IMAGE_CHATS": ("MAX_IMAGE_CHATS", _positive_int),
    "MAX_IMPORT_BYTES": ("MAX_IMPORT_BYTES", _positive_int),
    "MAX_MESSAGES": ("MAX_MESSAGES", _positive_int),
    "MAX_NEW_TOKENS": ("MAX_NEW_TOKENS", _positive_int),
    "MAX_NEW_TOKENS_LIMIT": ("MAX_NEW_TOKENS_LIMIT", _positive_int),
    "LOG_LEVEL": ("LOG_LEVEL", _log_level),
    "UPSTREAM_API": ("UPSTREAM_API", _upstream_api),
    "UPSTREAM_MODEL": ("UPSTREAM_MODEL", _model),
    "UPSTREAM_SPEECH_MODEL": ("UPSTREAM_SPEECH_MODEL", _model),
    "UPSTREAM_API_KEY": ("UPSTREAM_API_KEY", _secret),
    "SIDECAR_API_KEY": ("UPSTREAM_API_KEY", _secret),  # the same setting by its #12 name
    "ALLOWED_HOSTS": ("ALLOWED_HOSTS", _hosts),
    "WEBSITE_HOSTNAME": ("WEBSITE_HOSTNAME", _host_name),
    "METRICS": ("METRICS", _bool),
    "DOCUMENT_MAX_BYTES": ("DOCUMENT_MAX_BYTES", _positive_int),
    "DOCUMENT_MAX_PAGES": ("DOCUMENT_MAX_PAGES", _positive_int),
    "DOCUMENT_MAX_FILES": ("DOCUMENT_MAX_FILES", _positive_int),
    "DOCUMENT_SEARCH": ("DOCUMENT_SEARCH", _search_method),
    "DOCUMENT_INDEXER": ("DOCUMENT_INDEXER", _indexer),
    "DOCUMENT_INDEXER_THREADS": ("DOCUMENT_INDEXER_THREADS", _positive_int),
    "DOCUMENT_READ_TIMEOUT": ("DOCUMENT_READ_TIMEOUT", _positive_float),
    "DOCUMENT_READ_MEMORY_MB": ("DOCUMENT_READ_MEMORY_MB", _read_memory),
    "DOCUMENT_PASSAGES": ("DOCUMENT_PASSAGES", _positive_int),
    "DOCUMENT_CONTEXT_TOKENS": ("DOCUMENT_CONTEXT_TOKENS", _positive_int),
    "DOCUMENT_MIN_SCORE": ("DOCUMENT_MIN_SCORE", _similarity),
    "DOCUMENT_KEYWORD_WEIGHT": ("DOCUMENT_KEYWORD_WEIGHT", _weight),
    "PASSAGE_WARM": ("PASSAGE_WARM", _bool),
    "PASSAGE_WARM_PASSAGES": ("PASSAGE_WARM_PASSAGES", _positive_int),
    "EMBED_MODEL": ("EMBED_MODEL", _model),
    "EMBED_TOKENIZER": ("EMBED_TOKENIZER", _text),
    "EMBED_MAX_TOKENS": ("EMBED_MAX_TOKENS", _embed_tokens),
    "OTEL_EXPORTER_OTLP_ENDPOINT": ("OTEL_EXPORTER_OTLP_ENDPOINT", _url),
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", _url),
    "OTEL_EXPORTER_OTLP_PROTOCOL": ("OTEL_EXPORTER_OTLP_PROTOCOL", _otlp_protocol),
    "APPLICATIONINSIGHTS_CONNECTION_STRING": ("APPLICATIONINSIGHTS_CONNECTION_STRING", _text),
    "TRACES_FILE": ("TRACES_FILE", _text),
    "OTEL_SERVICE_NAME": ("OTEL_SERVICE_NAME", _text),
    "OTEL_SDK_DISABLED": ("OTEL_SDK_DISABLED", _bool),
    "DATABASE_URL": ("DATABASE_URL", _database_url),
    "DATA_DIR": ("DATA_DIR", _text),
    "AUTH_MODE": ("AUTH_MODE", _auth_mode),
    "AUTH_HEADER": ("AUTH_HEADER", _header_name),
    "AUTH_NAME_HEADER": ("AUTH_NAME_HEADER", _header_name),
    "TRUSTED_PROXIES": ("TRUSTED_PROXIES", _networks),
    "CHAT_RETENTION_DAYS": ("CHAT_RETENTION_DAYS", _positive_int),
}


def from_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings present in `environ`, parsed; raises SettingsError naming a bad variable."""
    config: dict[str, Any] = {}
    for name, (key, parse) in _FROM_ENV.items():
        raw = environ.get(name, "")
        if raw.strip():
            value = parse(name, raw)
            if key in config and config[key] != value:
                raise SettingsError(f"{name} and another name of the same setting disagree")
            config[key] = value
    return config


def listen_address(environ: Mapping[str, str]) -> tuple[str, int]:
    """(HOST, PORT) for the server that runs the app."""
    host = environ.get("HOST", "").strip() or SERVER_DEFAULTS["HOST"]
    port = _positive_int("PORT", environ.get("PORT", "").strip() or str(SERVER_DEFAULTS["PORT"]))
    return host, port


def bind_address(environ: Mapping[str, str]) -> str:
    """HOST:PORT as gunicorn's `bind` takes it (an IPv6 host in brackets)."""
    host, port = listen_address(environ)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def log_level(environ: Mapping[str, str]) -> str:
    """LOG_LEVEL, for the server's own log lines (the app reads it through from_environ)."""
    raw = environ.get("LOG_LEVEL", "")
    return _log_level("LOG_LEVEL", raw) if raw.strip() else DEFAULTS["LOG_LEVEL"]


def headers_timeout(environ: Mapping[str, str]) -> int:
    """REQUEST_HEADERS_TIMEOUT, for gunicorn's `keepalive` (the gevent worker's deadline on a
    request's headers and on an idle kept-alive connection)."""
    default = str(SERVER_DEFAULTS["REQUEST_HEADERS_TIMEOUT"])
    raw = environ.get("REQUEST_HEADERS_TIMEOUT", "").strip() or default
    return _positive_int("REQUEST_HEADERS_TIMEOUT", raw)  # gunicorn takes whole seconds


def server_size(environ: Mapping[str, str]) -> tuple[int, int]:
    """(WEB_CONCURRENCY, GUNICORN_CONNECTIONS): gunicorn processes, and the connections each
    serves at once (gevent: one greenlet each, open streams and idle clients alike)."""
    raw = environ.get("WEB_CONCURRENCY", "").strip() or str(SERVER_DEFAULTS["WEB_CONCURRENCY"])
    workers = _positive_int("WEB_CONCURRENCY", raw)
    raw = environ.get("GUNICORN_CONNECTIONS", "").strip() or str(
        SERVER_DEFAULTS["GUNICORN_CONNECTIONS"]
    )
    return workers, _positive_int("GUNICORN_CONNECTIONS", raw)


def access_summary(environ: Mapping[str, str]) -> dict[str, Any]:
    """For the start log line: whether a key goes to the model service (never the key), which
    hosts are answered, whether /metrics is served. The app itself asks nobody for a key."""
    config = {**DEFAULTS, **from_environ(environ)}
    return {
        "upstream_api": config["UPSTREAM_API"],
        "upstream_key": "set" if config["UPSTREAM_API_KEY"] else "unset",
        "allowed_hosts": ",".join(allowed(config)) or "*",
        "metrics": config["METRICS"],
    }


def reference() -> list[tuple[str, str, Any, str]]:
    """(variable, kind of value, default, meaning) of every variable the app and its server read,
    for docs/configuration.md. A variable without a description says so instead of failing, so
    the page can always be written; tests/test_docs.py requires one."""
    rows = []
    for name, (key, parse) in _FROM_ENV.items():
        kind = (parse.__doc__ or parse.__name__).strip()
        kind = kind.replace("LOG_LEVELS", ", ".join(LOG_LEVELS))
        kind = kind.replace("UPSTREAM_APIS", ", ".join(UPSTREAM_APIS))
        kind = kind.replace("SEARCH_METHODS", ", ".join(SEARCH_METHODS))
        kind = kind.replace("INDEXERS", ", ".join(INDEXERS))
        rows.append((name, kind, DEFAULTS.get(key), DESCRIPTIONS.get(name, "")))
    for name, default in SERVER_DEFAULTS.items():
        kind = "whole number, >= 1" if isinstance(default, int) else "text"
        rows.append((name, kind, default, DESCRIPTIONS.get(name, "")))
    return rows
