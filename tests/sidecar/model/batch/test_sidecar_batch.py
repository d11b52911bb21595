"""Batched decode (DECODE_BATCH_ROWS > 1) through the real sidecar on generated models: greedy
replies are onnxruntime-genai's Generator's with 1 to 8 users at once, requests join and leave
mid-decode, a disconnect cancels one row only, conversations continue from cached KV, and a
seeded sampling request gives the same reply whoever else runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from scripts.run import services
from scripts.run.services import Service
from sidecar.ipc import Generate
from sidecar.model.batch.decoder import KvPool, Unsupported, read_spec
from sidecar.model.batch.sampling import Sampler
from sidecar.model.engine import Engine
from sidecar.model.folder import read_genai_config
from sidecar.model.generator.generation import Generation
from tests.sidecar import reference
from tests.sidecar.support import metrics, predict, request_line
from tests.support.kernels import rows_exact_in_batches

PROMPTS = [
    "Write a long poem about the sea.",
    "Bonjour, ça va ?",
    "こんにちは",
    "hello world",
    "Tell me about the weather in Paris today, and what I should wear outside. " * 3,
    "Hi",
    "Why is the sky blue? Explain it to a child, step by step, with an example.",
    "Compose a short letter to a friend about a trip to the mountains " * 5,
]
NEW = 48


@pytest.fixture(scope="module")
def batch_service(
    small_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """Eight replies at once, decoded three rows per model call (so a step is several calls),
    prompts read 16 tokens per step (so a joining prompt is several steps)."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-batch.log"
    with services.sidecar(
        small_model_dir,
        log,
        MAX_CONCURRENCY="8",
        QUEUE_SIZE="8",
        DECODE_BATCH_ROWS="3",
        PREFILL_CHUNK="16",
    ) as service:
        yield service


def expected(model: Path, prompt: str, new: int = NEW, **search: Any) -> str:
    return reference.generate(model, [{"role": "user", "content": prompt}], new, **search).text


def agree(
    model: Path, prompts: list[str], replies: list[str], new: int = NEW, **search: Any
) -> None:
    """Each reply is its prompt's reference reply (reference.assert_agrees: to the bit on a CPU
    whose kernels are exact in batches)."""
    assert len(replies) == len(prompts)
    for prompt, reply in zip(prompts, replies, strict=True):
        reference.assert_agrees(reply, model, [{"role": "user", "content": prompt}], new, **search)


def together(url: str, bodies: list[dict[str, Any]]) -> list[str]:
    barrier = threading.Barrier(len(bodies))

    def one(body: dict[str, Any]) -> str:
        barrier.wait()
        response = predict(url, body, timeout=300)
        assert response.status_code == 200, response.text
        return response.text

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))


@pytest.mark.parametrize("users", [1, 2, 5, 8])
def test_greedy_replies_are_the_generators_with_several_users_at_once(
    batch_service: Service, small_model_dir: Path, users: int
) -> None:
    prompts = PROMPTS[:users]
    replies = together(
        batch_service.url, [{"input_text": p, "max_new_tokens": NEW} for p in prompts]
    )
    agree(small_model_dir, prompts, replies)


def test_requests_join_and_leave_while_a_long_reply_decodes(
    batch_service: Service, small_model_dir: Path
) -> None:
    long_prompt = reference.long_reply_prompt(small_model_dir, 200)
    body = {"input_text": long_prompt, "max_new_tokens": 200}
    pieces: list[str] = []
    with httpx.stream("POST", batch_service.url + "/predict", json=body, timeout=300) as response:
        chunks = response.iter_text()
        pieces.append(next(chunks))  # it is decoding now
        # Short replies join (their prompts read between its steps) and leave before it ends.
        short = together(
            batch_service.url, [{"input_text": p, "max_new_tokens": 8} for p in PROMPTS[:4]]
        )
        pieces.extend(chunks)
    agree(small_model_dir, [long_prompt], ["".join(pieces)], 200)
    agree(small_model_dir, PROMPTS[:4], short, 8)


def test_a_disconnect_cancels_its_row_and_the_others_go_on(
    batch_service: Service, small_model_dir: Path
) -> None:
    long_prompt = reference.long_reply_prompt(small_model_dir, 300)
    result: list[str] = []
    started = threading.Event()

    def other() -> None:
        started.wait()
        body = {"input_text": PROMPTS[4], "max_new_tokens": 40}
        result.append(predict(batch_service.url, body, timeout=300).text)

    thread = threading.Thread(target=other)
    thread.start()
    body = {"input_text": long_prompt, "max_new_tokens": 3000}
    with httpx.stream("POST", batch_service.url + "/predict", json=body, timeout=300) as response:
        rid = response.headers["x-request-id"]
        started.set()
        received = 0
        for chunk in response.iter_raw():
            received += len(chunk)
            if received >= 20:
                break
    line = request_line(batch_service, rid)
    assert line["outcome"] == "cancelled"
    assert line["generated_tokens"] < 300
    thread.join(300)
    agree(small_model_dir, [PROMPTS[4]], result, 40)
    assert metrics(batch_service.url)["sidecar_active_generations"] == 0


def test_a_conversation_continues_from_its_cached_kv(batch_service: Service) -> None:
    history: list[dict[str, str]] = []
    cached = []
    for turn in ("Tell me about the weather in Paris.", "And tomorrow?", "Thanks, and Monday?"):
        history.append({"role": "user", "content": turn})
        body = {"messages": history, "max_new_tokens": 16, "cache_scope": "batch-conversation"}
        response = predict(batch_service.url, body)
        assert response.status_code == 200
        cached.append(int(response.headers["x-cached-tokens"]))
        prompt_tokens = int(response.headers["x-prompt-tokens"])
        history.append({"role": "assistant", "content": response.text})
    assert cached[0] == 0
    assert all(0 < c < prompt_tokens for c in cached[1:])
    assert metrics(batch_service.url)["sidecar_prompt_cache_entries"] >= 1


def test_a_seeded_sampling_reply_is_the_same_whoever_else_runs(batch_service: Service) -> None:
    story = "Tell me a story."
    seeded = {"input_text": story, "temperature": 1.2, "seed": 11, "max_new_tokens": 30}
    alone = predict(batch_service.url, seeded).text
    crowd = [{"input_text": p, "max_new_tokens": 30} for p in PROMPTS[:3]]
    crowd.append({"input_text": "Hi", "temperature": 0.9, "max_new_tokens": 30})  # unseeded
    replies = together(batch_service.url, [seeded, *crowd, {**seeded, "seed": 12}])
    if rows_exact_in_batches():
        assert replies[0] == alone
    else:
        # An AVX2-only CPU's one-row and many-row kernels drift apart by up to ~0.1 in a logit
        # (tests/support/kernels.py): enough to move a draw. What holds there: the seed alone
        # gives the same reply again (docs/models.md, "Exact replies and the CPU").
        assert predict(batch_service.url, seeded).text == alone
    assert replies[-1] != alone  # another seed, another reply
    assert (
        predict(batch_service.url, {**seeded, "top_k": 1}).text
        == predict(batch_service.url, {"input_text": story, "max_new_tokens": 30}).text
    )  # top_k 1 leaves only the greedy choice


def test_a_repetition_penalty_gives_the_generators_reply_in_a_batch(
    batch_service: Service, small_model_dir: Path
) -> None:
    """llama.cpp's repeat_penalty on /v1 (onnxruntime-genai's repetition_penalty), decoded in
    a batch with two other replies."""
    body = {
        "messages": [{"role": "user", "content": PROMPTS[0]}],
        "max_tokens": NEW,
        "repeat_penalty": 1.5,
    }
    result: list[str] = []

    def penalised() -> None:
        answer = httpx.post(batch_service.url + "/v1/chat/completions", json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        result.append(answer.json()["choices"][0]["message"]["content"])

    thread = threading.Thread(target=penalised)
    thread.start()
    others = together(
        batch_service.url, [{"input_text": p, "max_new_tokens": NEW} for p in PROMPTS[1:3]]
    )
    thread.join(300)
    search = {"do_sample": False, "repetition_penalty": 1.5}
    agree(small_model_dir, PROMPTS[:1], result, NEW, **search)
    assert result[0] != expected(small_model_dir, PROMPTS[0], NEW)
    agree(small_model_dir, PROMPTS[1:3], others)


# --- the pieces, in this process ---------------------------------------------------------------


def test_the_sampler_is_greedy_without_temperature_and_reproducible_with_a_seed() -> None:
    logits = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    assert Sampler(None, None, None, None).pick(logits) == int(np.argmax(logits))
    assert Sampler(None, None, None, None).pick(logits, banned={int(np.argmax(logits))}) == int(
        np.argsort(-logits)[1]
    )
    draws = [[Sampler(1.0, 0, 1.0, 5).pick(logits) for _ in range(1)] for _ in range(3)]
    assert draws[0] == draws[1] == draws[2]
    top3 = set(np.argsort(-logits)[:3].tolist())
    sampler = Sampler(5.0, 3, None, 1)
    assert {sampler.pick(logits) for _ in range(200)} <= top3
    # top_p that the most likely token alone exceeds: always that token.
    peaked = logits.copy()
    peaked[7] = 50.0
    assert {Sampler(1.0, None, 0.5, 2).pick(peaked) for _ in range(50)} == {7}


def test_a_seeded_draw_is_the_same_when_two_nearly_equal_logits_swap_places() -> None:
    """What an AVX2-only CPU does to a row decoded alone and in a batch (tests/support/
    kernels.py): logits a last bit apart. The draw walks the tokens in vocabulary order, so
    the same seed lands on the same token whichever of two near ties is ahead."""
    logits = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    logits[[10, 500]] = 5.0  # two near ties that hold most of the probability
    nudged = logits.copy()
    nudged[500] = np.nextafter(np.float32(5.0), np.float32(6.0))  # now ahead of 10
    for top_k, top_p in ((None, None), (50, None), (None, 0.9)):
        draws = [Sampler(1.0, top_k, top_p, seed).pick(logits) for seed in range(300)]
        nudged_draws = [Sampler(1.0, top_k, top_p, seed).pick(nudged) for seed in range(300)]
        assert draws == nudged_draws
        assert {10, 500} <= set(draws)


def test_a_decoder_with_other_inputs_keeps_the_generator(tiny_model_dir: Path) -> None:
    config = read_genai_config(tiny_model_dir)
    assert read_spec(config).layers == config["model"]["decoder"]["num_hidden_layers"]
    config["model"]["decoder"]["inputs"]["position_ids"] = "position_ids"
    with pytest.raises(Unsupported, match="position_ids"):
        read_spec(config)


def test_rows_join_leave_and_free_their_slots_in_the_real_engine(tiny_model_dir: Path) -> None:
    """In one process: replies join at different steps, one leaves mid-decode (its row's slot
    swaps with the last decoding one), the others still give the Generator's replies, and with
    the cache off every slot's memory is given back at the end."""
    engine = Engine(tiny_model_dir, num_threads=1, decode_batch_rows=2, max_concurrency=4)
    engine.warm_up()
    batch = engine.batch
    assert batch is not None
    requests = [Generate(f"r{i}", (("user", p),), max_new_tokens=30) for i, p in enumerate(PROMPTS)]
    texts: dict[int, str] = {}
    live: dict[int, Any] = {}
    for step in range(400):
        if step % 2 == 0 and step // 2 < 4:
            live[step // 2] = engine.start(requests[step // 2])
            texts[step // 2] = ""
        index = {id(g): i for i, g in live.items()}
        for generation, text in batch.step():
            i = index[id(generation)]
            texts[i] += text or ""
            if generation.finish is not None:
                generation.release(reusable=True)
                del live[i]
        if step == 12 and 0 in live:  # the first reply's user leaves
            live.pop(0).release(reusable=True)
        if not live and step > 8:
            break
    agree(tiny_model_dir, PROMPTS[1:4], [texts[i] for i in (1, 2, 3)], 30)
    reference.assert_agrees(
        texts[0], tiny_model_dir, [{"role": "user", "content": PROMPTS[0]}], 30, cut=True
    )
    assert not batch.busy
    assert all(not key.any() for key in batch.pool.keys)  # freed pages read as zeros


def test_a_swap_gives_back_the_pages_past_the_shorter_slot(tiny_model_dir: Path) -> None:
    """A reply that leaves swaps its slot with the last decoding one; the slot that now holds
    fewer positions must not keep the longer reply's pages (the cache counts the shorter)."""
    spec = read_spec(read_genai_config(tiny_model_dir))
    pool = KvPool(spec, 2, 1024, np.float32)  # a head's 1024 positions: whole pages
    for buffer in (*pool.keys, *pool.values):
        buffer[0] = 1.0
        buffer[1, :, :10] = 2.0
    pool.swap(0, 1, 1024, 10)
    per_page = 4096 // (spec.head_size * 4)  # positions a page holds
    kept = -(-10 // per_page) * per_page  # through the page that holds position 9
    for buffer in (*pool.keys, *pool.values):
        assert (buffer[0, :, :10] == 2.0).all() and (buffer[1] == 1.0).all()
        assert not buffer[0, :, kept:].any()  # given back: reads as zeros again


def test_prompts_that_arrive_together_get_first_tokens_one_after_another(
    tiny_model_dir: Path,
) -> None:
    """The chunk a step reads is the prompt with the fewest tokens left (less a chunk per step
    it was passed over): a short prompt passes a long one that came first, two equal ones
    finish in turn, not both at the end, and the replies are still the Generator's."""
    engine = Engine(
        tiny_model_dir, num_threads=1, decode_batch_rows=4, max_concurrency=4, prefill_chunk=16
    )
    engine.warm_up()
    batch = engine.batch
    assert batch is not None
    long_prompt = PROMPTS[4] * 2
    prompts = [long_prompt, PROMPTS[4], PROMPTS[4], "Hi"]
    live = {
        id(engine.start(Generate(f"r{i}", (("user", p),), max_new_tokens=5))): i
        for i, p in enumerate(prompts)
    }
    first_token_step: dict[int, int] = {}
    texts = dict.fromkeys(range(len(prompts)), "")
    for step in range(500):
        for generation, text in batch.step():
            i = live[id(generation)]
            if text is not None:
                first_token_step.setdefault(i, step)
                texts[i] += text
            if generation.finish is not None:
                generation.release(reusable=False)
        if len(first_token_step) == len(prompts) and not batch.busy:
            break
    order = sorted(first_token_step, key=first_token_step.__getitem__)
    assert order == [3, 1, 2, 0]  # the shortest; the two equal ones in turn; the long one
    # The second of the equal prompts waits for the first's whole prompt, not one chunk
    chunks = -(-len(engine.prompts.fit((("user", PROMPTS[4]),), 5, engine.max_length).ids) // 16)
    assert chunks >= 3
    assert first_token_step[2] - first_token_step[1] >= chunks - 1
    agree(tiny_model_dir, prompts, [texts[i] for i in range(len(prompts))], 5)


def test_the_generators_model_is_loaded_only_when_a_request_needs_it(
    small_model_dir: Path,
) -> None:
    """Batched, the decoder's weights are in the direct session only; a request for the
    Generator path (here made directly) loads onnxruntime-genai's model then, and its greedy
    reply is the batched one."""
    engine = Engine(small_model_dir, num_threads=1, decode_batch_rows=4, max_concurrency=2)
    engine.warm_up()
    assert not engine.generators.loaded
    request = Generate("g", (("user", PROMPTS[6]),), max_new_tokens=20)
    batched = engine.start(request)
    assert engine.batch is not None and getattr(batched, "batched", False)
    text = ""
    while batched.finish is None:
        for _, piece in engine.batch.step():
            text += piece or ""
    batched.release(reusable=False)
    prompt = engine.prompts.fit(request.messages, 20, engine.max_length)
    alone = Generation(engine, prompt, request, cached=False)
    reference_text = ""
    while alone.finish is None:
        reference_text += alone.step() or ""
    alone.release(reusable=False)
    assert engine.generators.loaded
    assert text == reference_text
