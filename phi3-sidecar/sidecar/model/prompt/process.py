"""The prompt process: the model worker's chat prompts are rendered, tokenized and fitted here,
off the step loop.

Why a process: onnxruntime-genai's tokenizer holds the GIL for the whole text it encodes (a
thread beside the step loop stalled it for 0.88 of a 1.1 s encode), and fitting a long
conversation encodes it at least once. In the worker's own loop, three clients sending 60 KB
prompts that end refused held every running reply for seconds (issue 46). Here the step loop
only hands over the messages and reads the prompt back between two steps, so a reply beside
such requests keeps getting its tokens; what the refusals cost is this process's time, reported
with each of them (ipc.Rejected.spent_s).

The worker starts it when the model is ready (a `python` subprocess: the worker is a daemonic
multiprocessing child, which may have none of its own) and it lives as long as the worker: it
ends when its socket closes. It loads only the tokenizer and
the template (`PromptSpec`, what the engine read at load), builds each request's prompt with the
same `PromptBuilder` (so the ids are the same as in the worker), one request at a time, in
arrival order, and answers `Built`. If it dies, the requests it held are refused
(`start_failed`) and the next request starts a new one.

What it costs: about 110 MiB of RSS (SmolLM2's tokenizer, measured), which the KV bound chosen
at start does not count (it measures the service at warm-up, before this process starts): its
margin (a tenth of the memory, at least 1 GiB) holds it; and one CPU while it builds a prompt,
beside the model's threads.

Requests with images, or a plain prompt given as token ids, are not sent here: the first needs
the model's image processor (vision.py), the second no tokenizer.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from sidecar import ipc
from sidecar.model.prompt import passages
from sidecar.model.prompt.builder import (
    Prompt,
    PromptBuilder,
    PromptTooLong,
    TemplateRefused,
    UnsafePrompt,
    newest_user_text,
    rule_out,
)

log = logging.getLogger("sidecar.model.prompt_process")  # the name its log lines always had


@dataclass(frozen=True)
class PromptSpec:
    """What the prompt process needs to build prompts as the worker would (engine.Engine)."""

    path: Path  # the model folder: its tokenizer and chat template
    added_tokens: Mapping[str, int]
    bos_id: int | None
    system_role: bool
    max_token_bytes: int | None
    max_length: int  # the context, as the bound capped it at warm-up

    @classmethod
    def of(cls, builder: PromptBuilder, path: Path, max_length: int) -> PromptSpec:
        """The spec of the worker's own builder."""
        added, bound = dict(builder.added), builder.max_token_bytes
        return cls(path, added, builder.bos_id, builder.system_role, bound, max_length)


@dataclass(frozen=True)
class Job:
    request: ipc.Generate  # a text request (no images; a plain prompt as text)
    max_length: int


@dataclass(frozen=True)
class Built:
    """A job's prompt, or why it has none; `seconds`: this process's time on it."""

    key: int
    prompt: Prompt | None
    refusal: Exception | None
    seconds: float


# Imported by name, not run as __main__: what it sends must unpickle as this module's classes
_ENTRY = "from sidecar.model.prompt.process import main; main()"


def main() -> None:
    """The process's entry (_ENTRY, its argument FD: its end of the worker's socket)."""
    conn = Connection(int(sys.argv[1]))
    with contextlib.suppress(EOFError, OSError):  # the worker is gone
        serve(conn.recv(), conn)


def serve(spec: PromptSpec, conn: Connection) -> None:
    """The process's loop: a Job in, a Built out, until the socket closes."""
    # here only: onnxruntime-genai is loaded in this process, not where the worker imports this
    from sidecar.model.generator.path import template_tokenizer

    tokenizer = template_tokenizer(spec.path)
    builder = PromptBuilder(
        tokenizer,
        spec.added_tokens,
        spec.bos_id,
        system_role=spec.system_role,
        max_token_bytes=spec.max_token_bytes,
    )
    while True:
        job: Job = conn.recv()
        began = time.perf_counter()
        prompt: Prompt | None = None
        refusal: Exception | None = None
        try:
            prompt = passages.built(builder, job.request, job.max_length)
        except (PromptTooLong, UnsafePrompt, TemplateRefused) as exc:
            refusal = exc
        except Exception as exc:  # its message may quote the prompt: the type only
            refusal = RuntimeError(f"building the prompt failed: {type(exc).__name__}")
        conn.send(Built(job.request.key, prompt, refusal, time.perf_counter() - began))


class PromptProcess:
    """The worker's end: sends jobs, reads what is built, starts a new process when needed."""

    def __init__(self, spec: PromptSpec) -> None:
        self._spec = spec
        self._conn: Connection | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self.pending: dict[int, Job] = {}  # sent, not answered yet
        self.starts = 0

    @property
    def max_length(self) -> int:
        return self._spec.max_length

    @property
    def conn(self) -> Connection | None:
        """What to wait on for answers (None: no process now)."""
        return self._conn

    def rule_out(self, request: ipc.Generate) -> None:
        """The cheap check, in the worker, before a job is sent (builder.rule_out)."""
        plain = request.prompt if isinstance(request.prompt, str) else None
        text = plain if plain is not None else newest_user_text(request.messages)
        if text is not None:
            rule_out(text, self.max_length, self._spec.max_token_bytes)

    def submit(self, job: Job) -> None:
        """Send a job, starting a process if there is none (or it is gone); OSError if none
        can be started (the worker then builds the prompt itself)."""
        if self._process is not None and self._process.poll() is not None:
            self.answers()  # it died while idle: a new one starts (its jobs, if any, refused)
        for attempt in range(2):
            if self._conn is None:
                self.start()
            assert self._conn is not None
            try:
                self._conn.send(job)
            except OSError:  # it died since its last answer: its jobs are lost with it
                if attempt:
                    raise
                self.close()
                continue
            self.pending[job.request.key] = job
            return

    def answers(self) -> list[Built]:
        """What is built so far (never blocks); if the process died, a refusal for each job it
        held (the next submit starts a new one)."""
        conn, done = self._conn, []
        if conn is None:
            return []
        try:
            while conn.poll():
                built: Built = conn.recv()
                if self.pending.pop(built.key, None) is not None:
                    done.append(built)
        except Exception as exc:  # EOFError, OSError: it died; anything else: it is broken
            fields = {"jobs": len(self.pending), "error_type": type(exc).__name__}
            log.error("the prompt process died", extra={"fields": fields})
            lost = RuntimeError("the prompt process died")
            done += [Built(key, None, lost, 0.0) for key in self.pending]
            self.pending.clear()
            self.close()
        return done

    def forget(self, key: int) -> bool:
        """A job's request was cancelled: its answer will be dropped. Whether it was pending."""
        return self.pending.pop(key, None) is not None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait(5)
        self._conn, self._process = None, None

    def start(self) -> None:
        """Start the process (it loads the tokenizer while the first jobs queue up in its
        socket: the worker never waits for it)."""
        mine, theirs = socket.socketpair()
        process = subprocess.Popen(
            [sys.executable, "-c", _ENTRY, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        conn = Connection(mine.detach())
        conn.send(self._spec)
        self._conn, self._process = conn, process
        self.starts += 1
        log.info("prompt process started", extra={"fields": {"pid": process.pid}})
