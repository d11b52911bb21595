"""The response body of `POST /chat`: the NDJSON lines of one model service reply.

`Relay` turns the upstream's events (`upstream.py`: `Text`, `Loading`, `Progress`, `Done`,
`Refused`, `Broken`) into the browser's lines (`wire.py`): a grounded turn's `sources` first of
all, a `loading` line for each of the model service's while the model asked for loads, a
`progress` line for each of its own while it reads a long prompt, a `delta` per
piece as soon as it arrives, the `done` line
with the model's token count, the speed, the model the chat named and the checked citations
of a grounded turn, or an
`error` line after the first byte (`upstream_disconnected`, `upstream_timeout`,
`reply_time_limit`, a refusal in a started stream). While the model service is silent it
writes a heartbeat line every `HEARTBEAT_INTERVAL` seconds: a WSGI app only learns that the
browser left when a write fails, and then the server closes the response (`Relay.close`),
which closes the upstream connection so the sidecar stops generating and logs the chat's line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator

from chatapp.documents.search.grounding import Grounding
from chatapp.observability.logs import ChatRecord
from chatapp.relay import wire
from chatapp.relay.pending import PendingReply
from chatapp.relay.upstream import Broken, Done, Loading, Progress, Refused, ReplyStream

# The name the relay's log lines have always carried (chatapp/relay/chat.py's too).
log = logging.getLogger("chatapp.relay")


class Relay:
    """The response body: NDJSON lines from one sidecar reply. Closing it drops the upstream
    and logs the chat's line."""

    def __init__(
        self,
        reply: ReplyStream | PendingReply,
        record: ChatRecord,
        heartbeat: float,
        stall: float,
        time_limit: float = float("inf"),
        on_end: Callable[[str, str, bool], None] | None = None,
        grounding: Grounding | None = None,
        on_usage: Callable[[int | None, int | None], None] | None = None,
    ) -> None:
        self._reply = reply
        # Told the model service's (prompt_tokens, dropped_messages) when the reply is done
        self._on_usage = on_usage
        # A grounded turn (chatapp/documents/search/grounding.py): the reply's text is kept, for the
        # citations its done line carries.
        self._grounding = grounding
        self._record = record
        self._outcome = "client_gone"  # unless the relay reaches an end of its own
        self._lines = self._relay(heartbeat, stall, record.started + time_limit)
        # A stored chat's turn (chatapp/chats/turns.py): the reply's text, how it ended, and
        # whether anything came, before the done line or once the response is closed.
        self._on_end = on_end
        self._text: list[str] = []

    def _learn(self, done: Done) -> None:
        """Hand the reply's usage to `on_usage`; a failure there never touches the reply."""
        if self._on_usage is None:
            return
        try:
            self._on_usage(done.prompt_tokens, done.dropped_messages)
        except Exception:
            log.exception("learning from a reply's usage failed")

    def __iter__(self) -> Iterator[bytes]:
        return self._lines

    def close(self) -> None:
        # Called by the WSGI server when the response ends or the client went away, even if
        # iteration never started (so the upstream is never left open).
        self._lines.close()
        self._reply.close()
        self._record.finish(200, self._outcome)
        self._end_turn()

    def _end_turn(self) -> None:
        """Hand the reply to `on_end` once: before the done line (a stored chat's turn is kept
        by the time its client reads the end, so the chat it reads next holds it), or at
        close for a reply that ended otherwise."""
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            done = self._outcome == "done"
            finish = (self._record.finish_reason or "stop") if done else self._outcome
            on_end("".join(self._text), finish, done or bool(self._text))

    def _relay(
        self, heartbeat: float, stall: float, deadline: float
    ) -> Generator[bytes, None, None]:
        record = self._record
        started = record.started
        first = last = silent_since = started
        try:
            if self._grounding is not None:  # before the model is asked anything (issue 54)
                yield wire.sources(self._grounding.sources())
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    # Before App Service's front end cuts the request (230 s) without a word.
                    log.warning("the chat reached RELAY_TIME_LIMIT; ending its reply")
                    self._outcome = "reply_time_limit"
                    yield wire.error(TOO_LONG, "reply_time_limit")
                    return
                event = self._reply.next(timeout=min(heartbeat, left))
                now = time.monotonic()
                if event is None:
                    if now - silent_since >= stall:
                        log.warning(
                            "the model service silent for %s s mid-reply; hanging up", stall
                        )
                        self._outcome = "upstream_timeout"
                        yield wire.error(STALLED, "upstream_timeout")
                        return
                    yield wire.PING
                    continue
                if isinstance(event, Done):
                    self._outcome = "done"
                    record.finish_reason = event.finish_reason
                    if event.prompt_tokens is not None:
                        record.prompt_tokens = event.prompt_tokens
                    if event.cached_tokens is not None:
                        record.cached_tokens = event.cached_tokens
                    if event.dropped_messages is not None:
                        record.dropped_messages = event.dropped_messages
                    if event.passage_cached_tokens:
                        record.passage_cached_tokens = event.passage_cached_tokens
                    record.generated_tokens = event.generated_tokens
                    self._end_turn()
                    tokens = record.tokens
                    yield wire.done(
                        tokens,
                        *_speed(started, first, last, record.pieces, tokens),
                        finish_reason=event.finish_reason,
                        prompt_tokens=record.prompt_tokens,
                        cached_tokens=record.cached_tokens,
                        dropped_messages=record.dropped_messages,
                        passage_cached_tokens=record.passage_cached_tokens,
                        model=record.model,
                        **(
                            {}
                            if self._grounding is None
                            else self._grounding.done_fields("".join(self._text))
                        ),
                    )
                    self._learn(event)  # after the done line: the reader waits for none of it
                    return
                if isinstance(event, Refused):  # refused after the stream started (upstream.py)
                    log.warning("the model service refused a started chat: %s", event.error.type)
                    self._outcome = event.error.type
                    error = event.error
                    yield wire.error(error.message, error.type, error.retry_after)
                    return
                if isinstance(event, Progress):  # a long prompt being read: the service lives
                    silent_since = now
                    yield wire.progress(event.read, event.total, event.seconds_left)
                    continue
                if isinstance(event, Loading):  # the model asked for loads: the service lives
                    silent_since = now
                    yield wire.loading(event.model, event.seconds, event.seconds_left)
                    continue
                if isinstance(event, Broken):
                    type = "upstream_timeout" if event.timed_out else "upstream_disconnected"
                    message = STALLED if event.timed_out else (event.message or STOPPED)
                    log.warning("reply broke off after %d pieces: %s", record.pieces, type)
                    self._outcome = type
                    yield wire.error(message, type)
                    return
                silent_since = last = now
                if record.pieces == 0:
                    first = now
                record.pieces += 1
                if self._on_end is not None or self._grounding is not None:
                    self._text.append(event.text)
                yield wire.delta(event.text)
        finally:
            self._reply.close()
            speed = _speed(started, first, last, record.pieces, record.tokens)
            record.ttft_ms, record.tokens_per_s = speed


STALLED = "The model service stopped responding in the middle of the reply."
STOPPED = "The model service stopped in the middle of the reply."
TOO_LONG = "The reply took longer than this site allows for one message; it is cut off here."


def _speed(
    started: float, first: float, last: float, pieces: int, tokens: int
) -> tuple[float | None, float | None]:
    """(ttft_ms, tokens_per_s), None where a value cannot be measured: the tokens after the
    first piece over the time from the first piece to the last (the first piece counted as one
    token, so a first piece that carried several makes the rate a little high)."""
    ttft_ms = round((first - started) * 1000, 1) if pieces else None
    tokens_per_s = None
    if pieces >= 2 and last > first and tokens >= 2:
        tokens_per_s = round((tokens - 1) / (last - first), 1)
    return ttft_ms, tokens_per_s
