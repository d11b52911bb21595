"""Engine doubles: the sidecar's real engine, wrapped, for what the real one cannot do on
demand. Loaded in the model worker through the sidecar's own seam (ENGINE_FACTORY); the
settings that do that are `faulty()` and `paced()`.

- FaultyEngine: faults triggered by a marker in the newest user message (an exception after
  the first token, or the worker process dying).
- PacedEngine: waits before each token (and optionally before each chunk of a prompt, and
  before loading), so that a test, or a person, can stop, kill or crowd a reply while it is
  being written, or read a long prompt as slowly as a big model on a slow CPU; the tiny model
  would otherwise finish in milliseconds.
- `gated()`: the faulty engine, each worker's load held until the test opens its gate, so that
  "still loading" and "restarting" last exactly as long as a test needs them (no timing).
- PoisonedEngine: the real batched path, left to the worker as it is (one model call for all
  decoding rows), each batched step paced, and one row poisoned on a marker (logits that hold
  NaN, a sampler or stop filter that raises, a model call that fails whenever it holds the
  row, a grammar in error): what one row can do to the others.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sidecar import ipc
from sidecar.model.batch.row import BatchGeneration
from sidecar.model.batch.scheduler import BatchScheduler
from sidecar.model.engine import Engine
from sidecar.model.engine import load_engine as load_real_engine
from sidecar.model.generator.generation import Generation
from sidecar.model.kv.tiers import Restored
from sidecar.model.prompt.builder import Prompt
from sidecar.model.prompt.process import PromptSpec
from sidecar.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def faulty() -> dict[str, str]:
    """Sidecar settings for the faulty engine."""
    return {"ENGINE_FACTORY": "tests.support.engines:load_faulty_engine", "PYTHONPATH": str(REPO)}


def paced(
    pace: float = 0.05, load_delay: float = 0.0, prefill_pace: float = 0.0, image_step: float = 0.0
) -> dict[str, str]:
    """Sidecar settings for the paced engine: `pace` seconds before each token,
    `prefill_pace` before each chunk of PREFILL_CHUNK prompt tokens, `image_step` more before
    the first step of a reply with images (a vision model's slow read of its images)."""
    return {
        "ENGINE_FACTORY": "tests.support.engines:load_paced_engine",
        "PYTHONPATH": str(REPO),
        "PACE_S": str(pace),
        "PREFILL_PACE_S": str(prefill_pace),
        "IMAGE_STEP_S": str(image_step),
        "LOAD_DELAY_S": str(load_delay),
    }


def gated(gate_dir: Path) -> dict[str, str]:
    """Sidecar settings for the gated faulty engine: the Nth worker's load (the first, then each
    replacement's) waits until the file `gate_dir/load-N` exists (`open_gate`)."""
    return {
        "ENGINE_FACTORY": "tests.support.engines:load_gated_engine",
        "PYTHONPATH": str(REPO),
        "LOAD_GATE_DIR": str(gate_dir),
    }


def open_gate(gate_dir: Path, load: int) -> None:
    """Let the `load`th worker of a `gated()` sidecar finish loading."""
    (gate_dir / f"load-{load}").touch()


RAISE = "[[fault:raise]]"  # the second token step raises (an error after the first byte)
# Starting the reply raises as onnxruntime-genai's tokenizer does on text it cannot take: a
# TypeError whose message quotes the whole text (with the newest user message here)
START = "[[fault:start]]"
EXIT = "[[fault:exit]]"  # the worker process dies at the second token step
SECRET = "secret-internal-detail-1234"  # in the exception text; must never reach a client


class FaultyGeneration:
    def __init__(self, real: Generation | BatchGeneration, fault: str | None) -> None:
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

    @property
    def fault(self) -> Exception | None:
        return self._real.fault

    @property
    def cached_tokens(self) -> int:
        return self._real.cached_tokens

    @property
    def cache_reason(self) -> str:
        return self._real.cache_reason

    @property
    def restored(self) -> Restored:
        return self._real.restored

    def release(self, reusable: bool) -> None:
        self._real.release(reusable)

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

    def drafts(self) -> ipc.Drafts | None:
        return self._real.drafts()

    def take_logprobs(self) -> tuple[ipc.TokenLogprob, ...]:
        return self._real.take_logprobs()


class FaultyEngine:
    def __init__(self, real: Engine) -> None:
        self._real = real
        self.max_length = real.max_length
        self.image_input = real.image_input

    def start(self, request: ipc.Generate, *, prompt: Prompt | None = None) -> FaultyGeneration:
        # the newest user message, or a plain prompt's text (/v1/completions)
        newest = request.messages[-1][1] if request.messages else str(request.prompt or "")
        if START in newest:
            raise TypeError(f"encode(): incompatible function arguments. Invoked with: {newest!r}")
        fault = next((f for f in (RAISE, EXIT) if f in newest), None)
        return FaultyGeneration(self._real.start(request, prompt=prompt), fault)

    def prompt_spec(self) -> PromptSpec:
        return self._real.prompt_spec()

    def warm_up(self) -> None:
        self._real.warm_up()

    def cache_stats(self) -> ipc.CacheStats:
        return self._real.cache_stats()


def load_faulty_engine(settings: Settings) -> FaultyEngine:
    return FaultyEngine(load_real_engine(settings))


class PacedGeneration:
    def __init__(
        self,
        real: Generation | BatchGeneration,
        pace: float,
        prefill_pace: float,
        first_step: float = 0.0,
    ) -> None:
        self._real = real
        self._pace = pace
        self._prefill_pace = prefill_pace
        self._first_step = first_step

    def __getattr__(self, name: str) -> Any:  # prompt, generated, finish, tokens_per_s, ...
        return getattr(self._real, name)

    def step(self) -> str | None:
        # A step is a token, or a chunk of the prompt (the worker's pings are answered between
        # steps, so neither wait looks like a stalled worker).
        time.sleep(self._prefill_pace if self._real.prefilling else self._pace)
        time.sleep(self._first_step)
        self._first_step = 0.0
        return self._real.step()


class PacedEngine:
    def __init__(
        self, real: Engine, pace: float, prefill_pace: float = 0.0, image_step: float = 0.0
    ) -> None:
        self._real = real
        self._pace = pace
        self._prefill_pace = prefill_pace
        self._image_step = image_step
        self.max_length = real.max_length
        self.image_input = real.image_input

    def start(self, request: ipc.Generate, *, prompt: Prompt | None = None) -> PacedGeneration:
        first_step = self._image_step if request.images else 0.0
        real = self._real.start(request, prompt=prompt)
        return PacedGeneration(real, self._pace, self._prefill_pace, first_step)

    def reading_chunk(self, generation: PacedGeneration) -> int:
        """The worker asks this of a wrapper that hides the batch (worker._call_tokens)."""
        real = generation._real
        if isinstance(real, BatchGeneration):
            assert self._real.batch is not None
            return self._real.batch.chunk_for(real)
        return real.reading_chunk()

    def prompt_spec(self) -> PromptSpec:
        return self._real.prompt_spec()

    def warm_up(self) -> None:
        self._real.warm_up()

    def cache_stats(self) -> ipc.CacheStats:
        return self._real.cache_stats()


def load_paced_engine(settings: Settings) -> PacedEngine:
    time.sleep(float(os.environ.get("LOAD_DELAY_S", "0")))  # a model that takes long to load
    pace = float(os.environ.get("PACE_S", "0.05"))
    prefill_pace = float(os.environ.get("PREFILL_PACE_S", "0"))
    image_step = float(os.environ.get("IMAGE_STEP_S", "0"))
    return PacedEngine(load_real_engine(settings), pace, prefill_pace, image_step)


def load_faulty_slow_engine(settings: Settings) -> FaultyEngine:
    """The faulty engine, two seconds to load: a replacement worker's coming back can be seen."""
    time.sleep(2.0)
    return load_faulty_engine(settings)


def load_faulty_hanging_replacement(settings: Settings) -> FaultyEngine:
    """The faulty engine the first time; every later worker (a replacement) hangs while it
    loads, as a stuck driver or file system would. Counts loads in $LOAD_COUNT_FILE."""
    counter = Path(os.environ["LOAD_COUNT_FILE"])
    loads = int(counter.read_text() or "0") if counter.exists() else 0
    counter.write_text(str(loads + 1))
    if loads >= 1:
        time.sleep(3600)  # the watchdog kills this process
    return load_faulty_engine(settings)


def load_gated_engine(settings: Settings) -> FaultyEngine:
    """The faulty engine once this worker's gate is open (`gated`); loads counted in the gate's
    folder, as the web process starts one worker at a time."""
    gate = Path(os.environ["LOAD_GATE_DIR"])
    counter = gate / "loads"
    load = int(counter.read_text() or "0") + 1 if counter.exists() else 1
    counter.write_text(str(load))
    while not (gate / f"load-{load}").exists():
        time.sleep(0.05)
    return load_faulty_engine(settings)


def poisoned(pace: float = 0.02) -> dict[str, str]:
    """Sidecar settings for the poisoned engine: `pace` seconds before each batched step."""
    return {
        "ENGINE_FACTORY": "tests.support.engines:load_poisoned_engine",
        "PYTHONPATH": str(REPO),
        "PACE_S": str(pace),
    }


# Each poisons its row from the reply's third token on (it has joined the decoding rows by
# then); each exception's message holds SECRET and the row's newest user message, which must
# reach no log line (LOG_PROMPTS off).
NAN_ROW = "[[fault:nan]]"  # the row's logits are NaN (a model that overflowed)
SAMPLER_BUG = "[[fault:sampler]]"  # choosing the row's token raises
STOPS_BUG = "[[fault:stops]]"  # the row's stop filter raises
CALL_BUG = "[[fault:call]]"  # every decode call that holds the row raises, a call of it alone too
DEAD_GRAMMAR = "[[fault:grammar]]"  # llguidance's matcher is in error: the grammar allows nothing
POISONS = (NAN_ROW, SAMPLER_BUG, STOPS_BUG, CALL_BUG, DEAD_GRAMMAR)
_POISONED_AFTER = 2  # tokens


class PoisonedEngine:
    """The real engine; its batch is the worker's (the scheduler steps it, as in production)."""

    def __init__(self, real: Engine, pace: float) -> None:
        assert real.batch is not None, "the poisoned engine needs the batched path"
        self._real = real
        self.batch: BatchScheduler = real.batch
        self.max_length = real.max_length
        self.image_input = real.image_input
        self._failing: dict[int, str] = {}  # id(generation) -> its message: CALL_BUG rows
        step, run = self.batch.step, self.batch.decoder.run

        def paced_step() -> list[tuple[BatchGeneration, str | None]]:
            time.sleep(pace)  # so that replies started one after another decode together
            return step()

        def failing_run(
            first: int, ids: np.ndarray, lengths: Sequence[int], *, every: bool = False
        ) -> np.ndarray:
            held = self.batch.decoding[first : first + len(ids)]
            for generation in held:
                message = self._failing.get(id(generation))
                if message is not None and generation.generated >= _POISONED_AFTER:
                    raise RuntimeError(f"injected model call failure: {SECRET} {message}")
            return run(first, ids, lengths, every=every)

        self.batch.step = paced_step  # type: ignore[method-assign]
        self.batch.decoder.run = failing_run  # type: ignore[method-assign]

    def start(self, request: ipc.Generate) -> Generation | BatchGeneration:
        generation = self._real.start(request)
        newest = request.messages[-1][1]
        poison = next((p for p in POISONS if p in newest), None)
        if poison is not None:
            assert isinstance(generation, BatchGeneration), "poisons are for batched rows"
            self._poison(generation, poison, f"{SECRET} {newest}")
        return generation

    def _poison(self, generation: BatchGeneration, poison: str, message: str) -> None:
        def poisoned() -> bool:
            return generation.generated >= _POISONED_AFTER

        if poison == CALL_BUG:
            self._failing[id(generation)] = message
            return
        if poison == STOPS_BUG:
            generation._stops = _BrokenStops(generation._stops, poisoned, message)  # type: ignore[assignment]
            return
        if poison == SAMPLER_BUG:
            pick = generation._sampler.pick

            def broken_pick(logits: np.ndarray, banned: Any = ()) -> int:
                if poisoned():
                    raise IndexError(f"injected sampler bug: {message}")
                return pick(logits, banned)

            generation._sampler.pick = broken_pick  # type: ignore[method-assign]
            return
        take = generation.take

        def poisoned_take(logits: np.ndarray) -> str:
            if poisoned() and poison == NAN_ROW:
                logits = np.full_like(logits, np.nan)
            if poisoned() and poison == DEAD_GRAMMAR and generation.guide is not None:
                _break_matcher(generation.guide, len(logits))
            return take(logits)

        generation.take = poisoned_take  # type: ignore[method-assign]

    def warm_up(self) -> None:
        self._real.warm_up()

    def cache_stats(self) -> ipc.CacheStats:
        return self._real.cache_stats()


def _break_matcher(guide: Any, vocab_size: int) -> None:
    """Feed llguidance's real matcher a token its grammar forbids: it is in error from then on
    (its error quotes the grammar's state and the reply's last tokens)."""
    allowed = guide.masked(np.zeros(vocab_size, dtype=np.float32))
    if allowed is not None:
        guide.consume(int(np.flatnonzero(np.isneginf(allowed))[0]))


class _BrokenStops:
    """A stop filter that raises once its reply is poisoned."""

    def __init__(self, real: Any, poisoned: Any, message: str) -> None:
        self._real, self._poisoned, self._message = real, poisoned, message

    def __bool__(self) -> bool:
        return True

    def feed(self, text: str) -> tuple[str, bool]:
        if self._poisoned():
            raise ValueError(f"injected stop filter failure: {self._message}")
        return self._real.feed(text) if self._real else (text, False)

    def flush(self) -> str:
        return str(self._real.flush())


def load_poisoned_engine(settings: Settings) -> PoisonedEngine:
    real = load_real_engine(settings)
    return PoisonedEngine(real, float(os.environ.get("PACE_S", "0.02")))
