"""Images in the model worker (model/vision.py, the engine's image path,
model/generator/generation.py's first step, worker.py's refusals) on the real tiny phi3v model
and onnxruntime-genai's own image processor: images change the reply, typed tags stay text, an
image costs its tokens against the context, guidance holds with an image, a refused image is a
refusal with the worker alive, and text-only requests on the vision model work without the
conversation cache."""

from __future__ import annotations

import json
import queue
import threading
from collections import defaultdict
from dataclasses import replace
from multiprocessing import Pipe
from pathlib import Path
from typing import Any

import pytest

from scripts.run import services
from scripts.run.services import request_line
from sidecar import ipc
from sidecar.model.engine import Engine, og
from sidecar.model.generator.generation import Generation
from sidecar.model.prompt.builder import PromptTooLong
from sidecar.model.vision import ImageRefused, image_tokens
from sidecar.model.worker import Scheduler
from sidecar.web.structured.guidance import prepared
from tests.models.test_models_tiny_vision import png
from tests.sidecar.support import predict

RED, BLUE, GREY = (200, 30, 30), (30, 30, 200), (128, 128, 128)
QUESTION = "What is in the picture?"


RED_PNG, BLUE_PNG = png(467, 311, RED), png(487, 206, BLUE)  # 1,921 and 2,353 tokens


def asking(*images: bytes, text: str = QUESTION, new: int = 12, **extra: Any) -> ipc.Generate:
    """One user message with the images in front of its text (as /predict places them)."""
    slots = tuple((0, 0) for _ in images)
    return ipc.Generate(
        "vision-test", (("user", text),), new, images=images, image_slots=slots, **extra
    )


@pytest.fixture(scope="module")
def engine(tiny_vision_model_dir: Path) -> Engine:
    engine = Engine(tiny_vision_model_dir, prompt_cache_mb=64, prefill_chunk=16)
    engine.warm_up()
    return engine


def run(generation: Generation | Any) -> str:
    pieces = []
    while generation.finish is None:
        pieces.append(generation.step() or "")
    generation.release(reusable=True)
    return "".join(pieces)


def reply(engine: Engine, request: ipc.Generate) -> str:
    return run(engine.start(request))


def test_a_vision_model_reads_images_on_the_generator_path(engine: Engine) -> None:
    assert engine.image_input and engine.batch is None  # its decoder reads embeddings


def test_images_decide_the_reply(engine: Engine) -> None:
    red = reply(engine, asking(RED_PNG))
    assert reply(engine, asking(RED_PNG)) == red  # the same image, the same greedy reply
    assert reply(engine, asking(BLUE_PNG)) != red
    assert reply(engine, ipc.Generate("t", (("user", QUESTION),), 12)) != red  # no image


def test_the_prompt_is_the_processors_own(engine: Engine, tiny_vision_model_dir: Path) -> None:
    """The ids the worker builds (text encoded around each image, the image's run of -k) are
    those onnxruntime-genai's processor makes from the tagged prompt, and so is the reply."""
    generation = engine.start(asking(RED_PNG, BLUE_PNG))
    model = og.Model(str(tiny_vision_model_dir))
    tagged = "<|user|>\n<|image_1|>\n<|image_2|>\n" + QUESTION + "<|end|>\n<|assistant|>\n"
    inputs = model.create_multimodal_processor()(
        tagged, images=og.Images.open_bytes(RED_PNG, BLUE_PNG)
    )
    assert generation.prompt.ids == [int(i) for i in inputs["input_ids"].as_numpy().ravel()]
    assert generation.prompt.image_tokens == 1921 + 2353
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=8192)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    stream, text = og.Tokenizer(model).create_stream(), ""
    for _ in range(12):
        generator.generate_next_token()
        text += stream.decode(int(generator.get_next_tokens()[0]))
    assert run(generation) == text


def test_two_images_in_order(engine: Engine) -> None:
    both = engine.start(asking(RED_PNG, BLUE_PNG))
    assert both.prompt.image_tokens == image_tokens(467, 311) + image_tokens(487, 206)
    text = run(both)
    assert text != reply(engine, asking(BLUE_PNG, RED_PNG))  # each image in its place


def test_typed_image_tags_stay_text(engine: Engine) -> None:
    """Three typed <|image_1|> with one image: one image's tokens, not three (handed to the
    processor as a prompt, they made 5,763 image slots), and the tags are in the prompt as text."""
    typed = "<|image_1|>" * 3 + " What is this?"
    generation = engine.start(asking(RED_PNG, text=typed))
    ids = generation.prompt.ids
    assert generation.prompt.image_tokens == sum(1 for i in ids if i < 0) == 1921
    text = engine.tokenizer.decode([i for i in ids if i >= 0])
    assert text.count("<|image_1|>") == 3
    run(generation)
    # and with no image at all, typed tags are text too (a text-only request)
    plain = engine.start(ipc.Generate("t", (("user", typed),), 4))
    assert plain.prompt.image_tokens == 0 and min(plain.prompt.ids) >= 0
    run(plain)


def test_an_image_between_words(engine: Engine) -> None:
    """The slot is a character offset: the text on each side is encoded as it stands."""
    text = "Left of it, and right of it."
    generation = engine.start(
        ipc.Generate("t", (("user", text),), 4, images=(RED_PNG,), image_slots=((0, 11),))
    )
    ids = generation.prompt.ids
    first, last = ids.index(-1), len(ids) - ids[::-1].index(-1)
    assert last - first == 1921
    before = engine.tokenizer.decode(ids[:first])
    after = engine.tokenizer.decode(ids[last:])
    assert before.endswith("Left of it,") and after.startswith("\n and right of it.")
    run(generation)


def test_a_prompt_too_long_with_its_image_is_refused(tiny_vision_model_dir: Path) -> None:
    engine = Engine(tiny_vision_model_dir, max_length=1900)
    with pytest.raises(PromptTooLong) as refused:
        engine.start(asking(RED_PNG))
    assert refused.value.image_tokens == 1921 and refused.value.limit == 1900
    assert refused.value.prompt_tokens > 1921


def test_older_turns_go_with_their_images(tiny_vision_model_dir: Path) -> None:
    """An image counts like any tokens: the older turn that no longer fits goes, its image
    with it, and the newest turn keeps its own (numbered image 1 for the processor)."""
    engine = Engine(tiny_vision_model_dir, max_length=3000)
    messages: tuple[tuple[ipc.Role, str], ...] = (
        ("user", "First."),
        ("assistant", "A red one."),
        ("user", "And this?"),
    )
    request = ipc.Generate(
        "t", messages, 8, images=(RED_PNG, BLUE_PNG), image_slots=((0, 0), (2, 0))
    )
    generation = engine.start(request)
    assert generation.prompt.dropped_messages == 2
    assert generation.prompt.image_tokens == 2353  # the blue one's, the newest turn's
    assert -2 not in generation.prompt.ids  # renumbered: the blue one is image 1 now
    alone = engine.start(asking(BLUE_PNG, text="And this?", new=8))
    assert generation.prompt.ids == alone.prompt.ids
    assert run(generation) == run(alone)


def test_guidance_with_an_image(engine: Engine) -> None:
    schema = prepared(
        {
            "type": "object",
            "properties": {"colour": {"enum": ["red", "green", "blue"]}},
            "required": ["colour"],
            "additionalProperties": False,
        }
    )
    guided = ipc.Guidance("json_schema", json.dumps(schema))
    generation = engine.start(asking(RED_PNG, new=64, guidance=guided))
    assert generation.prompt.image_tokens == 1921
    assert json.loads(run(generation))["colour"] in ("red", "green", "blue")


def test_text_only_on_the_vision_model_skips_the_cache(engine: Engine) -> None:
    """onnxruntime-genai refuses rewind_to for phi3v, and lending a kept generator means
    rewinding it: the warm-up found that out, so every request gets a new one (cache_reason
    no_rewind), and a conversation's next turn works as its first did."""
    assert not engine.cache.rewinds
    first = engine.start(ipc.Generate("t", (("user", "Hello"),), 8))
    assert first.cache_reason == "no_rewind" and first.cached_tokens == 0
    said = run(first)
    turns: tuple[tuple[ipc.Role, str], ...] = (
        ("user", "Hello"),
        ("assistant", said),
        ("user", "And then?"),
    )
    second = engine.start(ipc.Generate("t", turns, 8))
    assert second.cache_reason == "no_rewind" and second.cached_tokens == 0
    assert run(second)
    assert engine.cache_stats().entries == 0
    image = engine.start(asking(RED_PNG))
    assert image.cache_reason == "no_rewind"
    run(image)


def test_the_images_are_one_step_and_the_text_after_them_is_chunked(engine: Engine) -> None:
    """The images and all before them are one call (onnxruntime-genai reads image features
    on a generator's first run only); the text after the last image is read PREFILL_CHUNK
    tokens a step, so a cancellation lands between any two of those steps."""
    long_text = "Describe every part of it, slowly. " * 12
    generation = engine.start(asking(RED_PNG, text=long_text))
    assert isinstance(generation, Generation)
    ids = generation.prompt.ids
    end = len(ids) - ids[::-1].index(-1)
    assert generation.step() is None and generation.prefilling
    assert generation.generator.token_count() == end  # all up to the last image, no more
    steps = 1
    while generation.prefilling:
        assert generation.step() is None
        steps += 1
    assert steps == 1 + -(-(len(ids) - end) // engine.prefill_chunk) and steps > 3
    run(generation)


def test_prompt_lookup_drafts_are_left_out_on_a_vision_model(tiny_vision_model_dir: Path) -> None:
    """onnxruntime-genai refuses drafts on a model that is more than a decoder: with
    PROMPT_LOOKUP_TOKENS set, the vision model still loads and answers (the warm-up failed)."""
    engine = Engine(tiny_vision_model_dir, prompt_lookup_tokens=3)
    engine.warm_up()
    assert engine.generators.options.prompt_lookup_tokens == 0
    for request in (ipc.Generate("t", (("user", "Hello"),), 4), asking(RED_PNG, new=4)):
        generation = engine.start(request)
        assert run(generation) and generation.drafts() is None


# -- the worker: its messages for these requests ----------------------------------------------


class Worker:
    """The model worker's scheduler on the real engine, in a thread, over real pipes; what it
    sends is read as it comes (a reader thread), so neither side waits on a full pipe."""

    def __init__(self, engine: Any) -> None:
        inbox, self._to_worker = Pipe(duplex=False)
        self._from_worker, outbox = Pipe(duplex=False)
        scheduler = Scheduler(engine, inbox, outbox)
        self._thread = threading.Thread(target=scheduler.run, daemon=True)
        self._received: queue.Queue[Any] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._by_key: defaultdict[int, list[Any]] = defaultdict(list)

    def _read(self) -> None:
        try:
            while True:
                self._received.put(self._from_worker.recv())
        except (EOFError, OSError):
            pass

    def __enter__(self) -> Worker:
        self._reader.start()
        return self

    def run(self) -> None:
        """Start the scheduler (messages sent before wait in the pipe, read in order)."""
        self._thread.start()

    def send(self, message: Any) -> None:
        self._to_worker.send(message)

    def until_end(self, key: int) -> list[Any]:
        """Every message for request `key` until its End or Rejected (others' are kept)."""
        while not any(isinstance(m, ipc.End | ipc.Rejected) for m in self._by_key[key]):
            message = self._received.get(timeout=120)
            self._by_key[getattr(message, "key", -1)].append(message)
        return self._by_key.pop(key)

    def __exit__(self, *exc: object) -> None:
        self.send(ipc.Stop())
        if self._thread.is_alive():
            self._thread.join(timeout=60)


class Recording:
    """The real engine; keeps what it started, to look at after the worker is done."""

    def __init__(self, real: Engine) -> None:
        self.real = real
        self.max_length = real.max_length
        self.image_input = real.image_input
        self.generations: list[Any] = []

    def start(self, request: ipc.Generate) -> Any:
        generation = self.real.start(request)
        self.generations.append(generation)
        return generation

    def warm_up(self) -> None:
        self.real.warm_up()

    def cache_stats(self) -> ipc.CacheStats:
        return self.real.cache_stats()


def keyed(request: ipc.Generate, key: int) -> ipc.Generate:
    return replace(request, key=key)


def test_the_worker_reports_image_tokens_and_refuses_what_it_cannot_read(
    engine: Engine,
) -> None:
    narrow = png(5377, 1, GREY)  # scaled to 5,376 pixels wide, it is no pixel high
    with Worker(engine) as worker:
        worker.run()
        worker.send(keyed(asking(RED_PNG), 1))
        worker.send(keyed(asking(narrow), 2))
        worker.send(keyed(asking(RED_PNG, BLUE_PNG, text="Two."), 3))
        mismatched = ipc.Generate("t", (("user", "x"),), 4, images=(RED_PNG,), image_slots=())
        worker.send(keyed(mismatched, 4))
        outside = ipc.Generate("t", (("user", "x"),), 4, images=(RED_PNG,), image_slots=((0, 9),))
        worker.send(keyed(outside, 5))
        worker.send(keyed(asking(BLUE_PNG), 6))
        first = worker.until_end(1)
        assert isinstance(first[0], ipc.Started) and first[0].image_tokens == 1921
        assert first[0].prompt_tokens > 1921  # the text's tokens too
        assert isinstance(first[-1], ipc.End) and first[-1].finish == "length"
        (refused,) = worker.until_end(2)
        assert isinstance(refused, ipc.Rejected) and refused.reason == "invalid_image"
        assert "image processor refused an image" in refused.message
        two = worker.until_end(3)
        assert two[0].image_tokens == 1921 + 2353 and two[-1].finish == "length"
        for key in (4, 5):
            (bad,) = worker.until_end(key)
            assert isinstance(bad, ipc.Rejected) and bad.reason == "invalid_image", bad
        after = worker.until_end(6)  # the worker is alive and well after the refusals
        assert after[0].image_tokens == 2353 and after[-1].finish == "length"


def test_the_worker_says_the_prompt_with_its_images_is_too_long(
    tiny_vision_model_dir: Path,
) -> None:
    with Worker(Engine(tiny_vision_model_dir, max_length=1900)) as worker:
        worker.run()
        worker.send(keyed(asking(RED_PNG), 1))
        (refused,) = worker.until_end(1)
    assert isinstance(refused, ipc.Rejected)
    assert refused.reason == "context_length_exceeded" and refused.limit_tokens == 1900
    assert "(1921 of them for images)" in refused.message


def test_a_cancel_that_comes_with_the_request_skips_the_image_prefill(engine: Engine) -> None:
    """Read between steps: a Cancel already waiting when the image prompt starts ends it
    before its one big call, and nothing of the prompt is read. (Small images: both
    messages fit in the pipe before the worker reads.)"""
    recording = Recording(engine)
    small = (png(20, 20, RED), png(24, 16, BLUE))
    with Worker(recording) as worker:
        worker.send(keyed(asking(*small), 1))
        worker.send(ipc.Cancel(1, noticed_at=0.0))
        worker.run()
        messages = worker.until_end(1)
    assert isinstance(messages[0], ipc.Started)
    end = messages[-1]
    assert isinstance(end, ipc.End) and end.finish == "cancelled" and end.generated_tokens == 0
    (generation,) = recording.generations
    assert generation.generator.token_count() == 0


def test_a_text_model_refuses_images_before_loading_anything(tiny_model_dir: Path) -> None:
    engine = Engine(tiny_model_dir, decode_batch_rows=4)
    assert not engine.image_input
    with pytest.raises(ImageRefused, match="reads no images"):
        engine.start(asking(RED_PNG))
    assert not engine.generators.loaded  # the Generator's model was not loaded for it
    with Worker(engine) as worker:
        worker.run()
        worker.send(keyed(asking(RED_PNG), 1))
        worker.send(keyed(ipc.Generate("t", (("user", "Hi"),), 4), 2))
        (refused,) = worker.until_end(1)
        assert isinstance(refused, ipc.Rejected) and refused.reason == "invalid_image"
        assert isinstance(worker.until_end(2)[-1], ipc.End)


def test_a_sidecar_serves_text_on_the_vision_model(
    tiny_vision_model_dir: Path, tmp_path: Path
) -> None:
    """The whole service on the phi3v folder, with its default settings: it loads (the
    batched path steps aside, logged), answers a conversation turn after turn over HTTP, and
    each request's line says why nothing was reused."""
    with services.sidecar(tiny_vision_model_dir, tmp_path / "sidecar.log") as service:
        said = ""
        turns: list[dict[str, str]] = []
        for question in ("Hello", "And then?"):
            turns.append({"role": "user", "content": question})
            response = predict(
                service.url,
                {"messages": turns, "max_new_tokens": 8},
            )
            assert response.status_code == 200, response.text
            said = response.text
            turns.append({"role": "assistant", "content": said})
            line = request_line(service, response.headers["x-request-id"])
            assert line["cache_reason"] == "no_rewind" and line["status"] == 200
        assert "the decoder reads embeddings" in service.log()  # why the batched path is off
