"""How passages are measured: the encoder's own tokenizer, wherever the app runs.

A passage longer than the encoder reads is refused (our sidecar) or cut silently (other
servers), so each is counted before it is kept (reading/tokens.py). Where the count comes from,
in this order (`counted_by`):

1. `setting`: `EMBED_TOKENIZER` names the encoder's folder or its `tokenizer.json` (a
   deployment that shares the sidecar's folder); the folder's own limit lowers
   `EMBED_MAX_TOKENS`.
2. `encoder`: the model service says. Its `GET /v1/models` lists the encoder (`"type":
   "embedding"`, or the id `EMBED_MODEL`) with `max_input_tokens` and a `tokenizer` object
   `{"url", "sha256"}` (our sidecar: `GET /v1/embeddings/tokenizer`). The file is fetched
   once, checked against its sha256 and by the `tokenizers` library, and kept in
   `DATA_DIR/encoder-tokenizers/<sha256>.json`, where the reader process reads it. The list is
   asked again every `CHECK_S`: a sidecar restarted with another encoder lists another file.
3. `byte_bound`: nothing says, with the reason: an OpenAI-compatible server that lists no
   tokenizer (Ollama, llama.cpp, vLLM), or ours while its encoder loads or while it cannot be
   reached (asked again after `RETRY_S`). Passages are then safe but about a quarter of the
   size for English text. `/healthz` says which (`documents.passages`), and every change is
   logged.

The limit is `EMBED_MAX_TOKENS`, lowered to what the service lists (`max_input_tokens`, or
vLLM's `max_model_len`). Where the app sends `input_type` (our sidecar: not `UPSTREAM_API=openai`,
`prompted`) and the encoder has prompts (its folder's `config_sentence_transformers.json`, or
`prompts` in the service's list: e5's "passage: " and "query: "), the sidecar writes the prompt
before each input, so the room a passage or a question has is the limit less its prompt's
tokens (reading/tokens.py `prompt_tokens`): `max_tokens` is a passage's, `question_tokens` a
question's.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import requests

from chatapp.documents.reading.tokens import (
    PROMPT_KINDS,
    ByteBound,
    EncoderTokens,
    TokenCounter,
    encoder_limit,
    encoder_prompts,
    prompt_tokens,
)

log = logging.getLogger("chatapp.documents.sizing")

CHECK_S = 60.0  # how often a service that gave its tokenizer is asked whether it still does
RETRY_S = 10.0  # how soon one that did not (loading, unreachable, not ours) is asked again
MAX_TOKENIZER_BYTES = 64 * 1024 * 1024  # multilingual tokenizers are about 17 MB
_SHA256 = re.compile(r"[0-9a-f]{64}")
CountedBy = Literal["setting", "encoder", "byte_bound"]


@dataclass(frozen=True)
class Measure:
    counted_by: CountedBy
    tokenizer: str | None  # a tokenizer.json or an encoder folder; None: the byte bound
    max_tokens: int  # the most tokens of a passage (its prompt's aside)
    reason: str | None = None  # why the byte bound
    question_tokens: int | None = None  # the most of a question (its prompt's aside); None: max
    # What each prompt the sidecar writes costs, in tokens ({} when none is written)
    prompt_tokens: Mapping[str, int] = field(default_factory=dict)

    @property
    def question_limit(self) -> int:
        return self.max_tokens if self.question_tokens is None else self.question_tokens

    def public(self) -> dict[str, Any]:
        """/healthz's `documents.passages`: no folders, no URLs."""
        body: dict[str, Any] = {"counted_by": self.counted_by, "max_tokens": self.max_tokens}
        if self.prompt_tokens:
            body["prompt_tokens"] = dict(self.prompt_tokens)
        if self.reason:
            body["reason"] = self.reason
        return body


def rooms(setting: int, limit: int | None, costs: Mapping[str, int]) -> tuple[int, int]:
    """(a passage's, a question's) most tokens: EMBED_MAX_TOKENS, within the encoder's limit
    (unknown: EMBED_MAX_TOKENS itself) less the prompt written before each."""
    room = limit if limit is not None and limit >= 2 else setting
    return (
        min(setting, room - costs.get("passage", 0)),
        min(setting, room - costs.get("query", 0)),
    )


class _NotSaid(Exception):
    """The model service gave no tokenizer; str() is the reason, for /healthz."""


class PassageSizing:
    """The current `Measure` (`current()`), and a TokenCounter by it (`count`)."""

    def __init__(
        self,
        *,
        max_tokens: int,
        tokenizer: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        model: str = "",
        folder: Path | None = None,
        connect_timeout: float = 3.0,
        timeout: float = 10.0,
        prompted: bool = False,
    ) -> None:
        self.max_tokens = max_tokens
        self.prompted = prompted  # whether the embedder sends input_type (our sidecar)
        self.root = base_url.rstrip("/").removesuffix("/v1") if base_url else None
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.folder = folder or Path(tempfile.gettempdir()) / f"chatapp-tokenizers-{os.getuid()}"
        self.timeouts = (connect_timeout, timeout)
        self._next = 0.0
        self._counters: dict[str, TokenCounter] = {}
        if tokenizer:
            prompts = encoder_prompts(tokenizer) if prompted else {}
            self._measure = self._measured("setting", tokenizer, encoder_limit(tokenizer), prompts)
            self._next = math.inf
        elif self.root is None:
            self._measure = Measure("byte_bound", None, max_tokens, "no model service")
            self._next = math.inf
        else:
            self._measure = Measure("byte_bound", None, max_tokens, "not asked yet")
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> PassageSizing:
        return cls(
            max_tokens=config["EMBED_MAX_TOKENS"],
            tokenizer=config["EMBED_TOKENIZER"] or None,
            base_url=config["SIDECAR_URL"],
            api_key=config["UPSTREAM_API_KEY"],
            model=config["EMBED_MODEL"],
            folder=Path(config["DATA_DIR"]) / "encoder-tokenizers",
            prompted=config["UPSTREAM_API"] != "openai",  # as documents/service.py's embedder
            connect_timeout=config["SIDECAR_CONNECT_TIMEOUT"],
            # /healthz asks too: a slow model service holds it at most 10 s
            timeout=min(10.0, config["SIDECAR_READ_TIMEOUT"]),
        )

    def current(self) -> Measure:
        """The measure now: the model service is asked when it is time (one thread asks, the
        others wait for its answer)."""
        if time.monotonic() >= self._next:
            with self._lock:
                if time.monotonic() >= self._next:
                    self._refresh()
        return self._measure

    def count(self, text: str) -> int:
        """Tokens of `text` by the current measure; never an undercount."""
        measure = self.current()
        if measure.tokenizer is None:
            return ByteBound().count(text)
        return self._counter(measure.tokenizer).count(text)

    def _counter(self, tokenizer: str) -> TokenCounter:
        counter = self._counters.get(tokenizer)
        if counter is None:
            counter = self._counters[tokenizer] = EncoderTokens(tokenizer)
        return counter

    def _measured(
        self, counted_by: CountedBy, tokenizer: str, limit: int | None, prompts: Any
    ) -> Measure:
        """The measure by `tokenizer`: the rooms within `limit` less the prompts' tokens
        (`prompts`: the encoder's, as the service or the folder says them; anything else is
        read as none)."""
        prompts = prompts if isinstance(prompts, dict) else {}
        costs = {
            kind: prompt_tokens(self._counter(tokenizer), prompts[kind])
            for kind in PROMPT_KINDS
            if isinstance(prompts.get(kind), str)
        }
        costs = {kind: cost for kind, cost in costs.items() if cost}
        passage, question = rooms(self.max_tokens, limit, costs)
        question_tokens = question if question != passage else None
        return Measure(counted_by, tokenizer, passage, None, question_tokens, costs)

    def _refresh(self) -> None:
        measure = self._ask()
        self._next = time.monotonic() + (CHECK_S if measure.counted_by == "encoder" else RETRY_S)
        if measure != self._measure:
            level = logging.INFO if measure.counted_by == "encoder" else logging.WARNING
            log.log(level, "passages measured", extra={"fields": measure.public()})
        self._measure = measure

    def _ask(self) -> Measure:
        limit = self.max_tokens
        try:
            entry = self._listed_encoder()
            listed = entry.get("max_input_tokens") or entry.get("max_model_len")
            listed = listed if isinstance(listed, int) and listed >= 2 else None
            limit = min(limit, listed or limit)
            if entry.get("ready") is False:
                raise _NotSaid("the encoder is still loading")
            tokenizer = entry.get("tokenizer")
            if not isinstance(tokenizer, dict):
                raise _NotSaid("the model service does not give its encoder's tokenizer")
            url, sha256 = tokenizer.get("url"), tokenizer.get("sha256")
            if not (isinstance(url, str) and url.startswith("/") and isinstance(sha256, str)):
                raise _NotSaid("the model service's tokenizer entry is not readable")
            path = str(self._fetched(url, sha256))
            prompts = entry.get("prompts") if self.prompted else None
            return self._measured("encoder", path, listed, prompts or {})
        except _NotSaid as why:
            return Measure("byte_bound", None, limit, str(why))

    def _listed_encoder(self) -> dict[str, Any]:
        """The encoder's entry in the model service's /v1/models."""
        try:
            body = self._get("/v1/models").json()
        except ValueError:  # requests' JSONDecodeError, and a body that is not UTF-8
            raise _NotSaid("the model service's model list is not JSON") from None
        data = body.get("data") if isinstance(body, dict) else None
        entries = [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []
        ours = [e for e in entries if e.get("type") == "embedding"]
        named = [e for e in entries if e.get("id") == self.model]
        if not (ours or named):
            raise _NotSaid("the model service lists no encoder")
        return (ours or named)[0]

    def _get(self, path: str) -> requests.Response:
        assert self.root is not None
        try:
            response = requests.get(
                self.root + path, headers=self.headers, timeout=self.timeouts, stream=True
            )
        except requests.RequestException:
            raise _NotSaid("the model service is not reachable") from None
        if response.status_code != 200:
            response.close()
            raise _NotSaid(f"the model service answered {response.status_code} to {path}")
        return response

    def _fetched(self, url: str, sha256: str) -> Path:
        """The tokenizer.json the service names, kept under its sha256 (fetched if not yet)."""
        if not _SHA256.fullmatch(sha256):
            raise _NotSaid("the model service's tokenizer entry is not readable")
        path = self.folder / f"{sha256}.json"
        if path.is_file():  # written here, whole, under the name of its own sha256
            return path
        data = bytearray()
        with self._get(url) as response:
            try:
                for part in response.iter_content(1 << 20):
                    data += part
                    if len(data) > MAX_TOKENIZER_BYTES:
                        raise _NotSaid("the encoder's tokenizer is larger than the app takes")
            except requests.RequestException:
                raise _NotSaid("the model service is not reachable") from None
        if hashlib.sha256(data).hexdigest() != sha256:
            raise _NotSaid("the encoder's tokenizer did not match its sha256")
        try:
            from tokenizers import Tokenizer

            Tokenizer.from_str(data.decode("utf-8"))
        except Exception:  # the library's own errors: any of them means not usable here
            raise _NotSaid("the encoder's tokenizer cannot be read by this app") from None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            staged = self.folder / f".{sha256}.{os.getpid()}.{threading.get_ident()}"
            staged.write_bytes(data)
            os.replace(staged, path)  # whole or not there, for the other processes
        except OSError:
            raise _NotSaid("the encoder's tokenizer could not be kept in DATA_DIR") from None
        return path
