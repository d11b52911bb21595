"""The sidecar's real engine, slowed down: for tests that must act while a reply is under way.

The tiny model writes thousands of tokens per second, so a reply is over before a test (or a
person) can press Stop. This wrapper keeps the real model, tokenizer and sidecar code and only
waits before each token. Used through the sidecar's own seam, with the repo root on PYTHONPATH:

    ENGINE_FACTORY=tests.e2e.paced_engine:load_engine  PACE_S=0.05  LOAD_DELAY_S=0
"""

from __future__ import annotations

import os
import time
from typing import Any

from sidecar import ipc
from sidecar.model.engine import Engine, Generation
from sidecar.model.engine import load_engine as load_real_engine
from sidecar.settings import Settings


class PacedGeneration:
    def __init__(self, real: Generation, pace: float) -> None:
        self._real = real
        self._pace = pace

    def __getattr__(self, name: str) -> Any:  # prompt, generated, finish, tokens_per_s, ...
        return getattr(self._real, name)

    def step(self) -> str | None:
        if not self._real.prefilling:  # the wait is per token; prompt chunks run at full speed
            time.sleep(self._pace)
        return self._real.step()


class PacedEngine:
    def __init__(self, real: Engine, pace: float) -> None:
        self._real = real
        self._pace = pace
        self.max_length = real.max_length

    def start(self, request: ipc.Generate) -> PacedGeneration:
        return PacedGeneration(self._real.start(request), self._pace)

    def warm_up(self) -> None:
        self._real.warm_up()


def load_engine(settings: Settings) -> PacedEngine:
    time.sleep(float(os.environ.get("LOAD_DELAY_S", "0")))  # a model that takes long to load
    return PacedEngine(load_real_engine(settings), float(os.environ.get("PACE_S", "0.05")))
