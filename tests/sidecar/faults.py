"""Fault injection for the model worker: the real engine, plus faults the real one cannot
produce on demand, triggered by a marker in the newest user message.

    ENGINE_FACTORY=tests.sidecar.faults:load_engine   (with the repo root on PYTHONPATH)
"""

from __future__ import annotations

import os

from sidecar import ipc
from sidecar.model.engine import Engine, Generation
from sidecar.model.engine import load_engine as load_real_engine
from sidecar.model.prompt import Prompt
from sidecar.settings import Settings

RAISE = "[[fault:raise]]"  # the second token step raises (an error after the first byte)
EXIT = "[[fault:exit]]"  # the worker process dies at the second token step
SECRET = "secret-internal-detail-1234"  # in the exception text; must never reach a client


class FaultyGeneration:
    def __init__(self, real: Generation, fault: str | None) -> None:
        self._real = real
        self._fault = fault

    @property
    def prompt(self) -> Prompt:
        return self._real.prompt

    @property
    def generated(self) -> int:
        return self._real.generated

    @property
    def finish(self) -> ipc.Finish | None:
        return self._real.finish

    def step(self) -> str | None:
        if self._real.generated >= 1 and self._fault == RAISE:
            raise RuntimeError(f"injected failure: {SECRET}")
        if self._real.generated >= 1 and self._fault == EXIT:
            os._exit(3)
        text = self._real.step()
        if text is None:  # a chunk of the prompt: no token yet
            return None
        return text or "x"  # the first piece must not be empty, so the client gets a byte

    def tokens_per_s(self) -> float | None:
        return self._real.tokens_per_s()


class FaultyEngine:
    def __init__(self, real: Engine) -> None:
        self._real = real
        self.max_length = real.max_length

    def start(self, request: ipc.Generate) -> FaultyGeneration:
        newest = request.messages[-1][1]
        fault = next((f for f in (RAISE, EXIT) if f in newest), None)
        return FaultyGeneration(self._real.start(request), fault)

    def warm_up(self) -> None:
        self._real.warm_up()


def load_engine(settings: Settings) -> FaultyEngine:
    return FaultyEngine(load_real_engine(settings))
