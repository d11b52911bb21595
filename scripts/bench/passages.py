"""The passage store (issue 54; sidecar/model/kv/passages.py): how close a grounded answer stays
when its passages come from the store, and what it saves a grounded question's first word.

`python -m scripts.bench passages --model smollm2` (the quality gate, on the real SmolLM2-135M-
Instruct): the Python FAQ's questions (scripts/bench/rag_faq.py), each with its top passages
(BM25 over the FAQ's answers, each answer one passage of at most --passage-chars; the app's
grounding format and instructions, the app's system prompt), read two ways through the
sidecar's own batched path (BatchDecoder, PassageStore, batch.passages.plan):
- exact: the whole prompt read as it is;
- reuse: each passage's K/V from the store (read alone after the reading prefix, kept in
  --encoding, its keys rotated to where the prompt puts it), its first N tokens read again
  with the prompt's context, for each N of --recompute.
For each: the mean negative log-likelihood per token of the FAQ's own answer (its first
--answer-tokens tokens, teacher-forced after the prompt), and the greedy reply's first 32
tokens. The gate: NLL within +3% of the exact read's, and the first 32 tokens identical for at
least 80% of the questions.

`python -m scripts.bench passages --preset phi3-mini --timing` (time, on Phi-3-mini's shapes):
the first token of a bare question, of a grounded one whose passages (--passages of about
--passage-tokens tokens) are not in the store (store off, and store on: a miss), and of one
whose passages the store holds, in the model worker's engine, median of --repeats.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from scripts.bench.common import ensure_model
from scripts.bench.rag_faq import Pair, faq_pairs

SYSTEM = "You are a helpful assistant. Answer briefly."
INSTRUCTION = (
    "Answer the question below from these passages, and cite each passage you use as [n] "
    "with its number. If they do not answer it, say that the documents do not cover it."
)
GREEDY_TOKENS = 32
_WORD = re.compile(r"[a-z0-9_]+")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="a model folder, or 'smollm2' (the real model, built)")
    parser.add_argument("--preset", default="tiny", help="a generated model (without --model)")
    parser.add_argument("--timing", action="store_true", help="time, not quality")
    parser.add_argument("--questions", type=int, default=60, help="FAQ questions (quality)")
    parser.add_argument("--passages", type=int, default=3, help="passages per question")
    parser.add_argument("--passage-chars", type=int, default=1100)
    parser.add_argument("--passage-tokens", type=int, default=250, help="(timing)")
    parser.add_argument("--answer-tokens", type=int, default=64)
    parser.add_argument("--recompute", default="0,4,16,32", help="moved reuse's N, a list")
    parser.add_argument("--encoding", default="int8", choices=("int8", "fp16", "fp32"))
    parser.add_argument("--repeats", type=int, default=3, help="(timing)")


def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        model = ensure_model(args, Path(scratch))
        return timing(model, args) if args.timing else quality(model, args)


# -- the quality gate -------------------------------------------------------------------------


def top_passages(pairs: list[Pair], count: int, chars: int) -> list[list[int]]:
    """Each question's `count` best answers by BM25 (the answers are the passages)."""
    docs = [Counter(_WORD.findall(p.answer[:chars].lower())) for p in pairs]
    lengths = [sum(d.values()) for d in docs]
    average = sum(lengths) / len(lengths)
    frequency = Counter(word for d in docs for word in d)

    def score(query: list[str], index: int) -> float:
        total = 0.0
        for word in query:
            tf = docs[index][word]
            if tf:
                idf = math.log(1 + (len(docs) - frequency[word] + 0.5) / (frequency[word] + 0.5))
                total += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * lengths[index] / average))
        return total

    ranked = []
    for pair in pairs:
        query = _WORD.findall(pair.question.lower())
        order = sorted(range(len(pairs)), key=lambda i: -score(query, i))
        ranked.append(order[:count])
    return ranked


def grounded_messages(question: str, passages: list[str]) -> tuple[Any, ...]:
    lines = ["Passages from my documents:", ""]
    for n, text in enumerate(passages, start=1):
        lines += [f"[{n}] Python FAQ", text, ""]
    lines.append(INSTRUCTION)
    block = "\n".join(lines)
    return (("system", SYSTEM), ("user", f"{block}\n\nQuestion: {question}"))


class Reader:
    """The model's batched decoder, two passage stores over it (one holding each prompt's own
    run, for exact reuse; one holding each passage's run alone, for moved reuse), and reads of
    one prompt three ways."""

    def __init__(self, model: Path, encoding: str) -> None:
        from sidecar.model.batch.setup import PassageOptions, passage_reuse
        from sidecar.model.engine import Engine
        from sidecar.model.kv.passages import PassageStore

        self.engine = Engine(
            model,
            prefill_chunk=64,
            decode_batch_rows=4,
            max_concurrency=4,
            prompt_cache_mb=0,
            kv_compact=encoding,
            passages=PassageOptions(8 * 2**30, 0, 0, "moved"),
        )
        batch = self.engine.batch
        if batch is None or batch.passages is None or not batch.passages.moves:
            why = passage_reuse(batch)
            raise SystemExit(f"no moved reuse on this model: {why}")
        self.decoder, self.exact = batch.decoder, batch.passages
        self.moved = PassageStore(self.exact.rotary, 8 * 2**30, self.exact.encoding, 0, "moved")
        self.chunk = 512

    def prompt(self, messages: tuple[Any, ...], passages: list[str]) -> Any:
        from sidecar.ipc import Generate
        from sidecar.model.prompt.passages import mark

        request = Generate("bench", messages, GREEDY_TOKENS, passages=tuple(passages))
        built = self.engine.prompts.build(request, self.engine.max_length)
        return mark(self.engine.prompts, request, built, self.engine.max_length)

    def fill(self, store: Any, prompt: Any) -> None:
        """The prompt's run read alone into `store`, as the idle worker reads it."""
        from sidecar.model.batch import passages as batch_passages
        from sidecar.model.batch.passages import PassageReading

        batch_passages.plan(store, prompt, None, 0)  # notes it as wanted
        while (wanted := store.next_wanted(self.decoder.pool.bytes_per_token)) is not None:
            reading = PassageReading(store, self.decoder, wanted, 3, 64)
            while not reading.done:
                reading.step()

    def read(self, prompt: Any, slot: int, store: Any = None) -> tuple[np.ndarray, int]:
        """The prompt read into `slot` (`store`: with its placements); the last logits and
        the tokens placed."""
        from sidecar.model.batch import passages as batch_passages

        self.decoder.pool.free(slot)
        placements = [] if store is None else batch_passages.plan(store, prompt, None, 0)
        ids, position, logits = prompt.ids, 0, None
        while position < len(ids):
            for placement in placements:
                if placement.at == position:
                    store.place(
                        placement.kv,
                        self.decoder.pool,
                        slot,
                        placement.source,
                        placement.at,
                        placement.tokens,
                    )
                    position = placement.end
            ahead = [p.at for p in placements if p.at > position]
            end = min([position + self.chunk, len(ids), *ahead])
            logits = self.decoder.run(slot, np.array([ids[position:end]]), [position])
            position = end
        assert logits is not None
        return logits[0], sum(p.tokens for p in placements)

    def answer_nll(self, prompt: Any, slot: int, first: np.ndarray, answer: list[int]) -> float:
        """Mean negative log-likelihood per token of `answer` after the prompt in `slot`."""
        rows = [first]
        if len(answer) > 1:
            every = self.decoder.run(slot, np.array([answer[:-1]]), [len(prompt.ids)], every=True)
            rows += list(every[0])
        total = 0.0
        for row, token in zip(rows, answer, strict=True):
            values = row.astype(np.float64)
            top = values.max()
            total += float(top + math.log(np.exp(values - top).sum()) - values[token])
        return total / len(answer)

    def greedy(self, prompt: Any, slot: int, first: np.ndarray) -> list[int]:
        tokens = [int(first.argmax())]
        position = len(prompt.ids)
        while len(tokens) < GREEDY_TOKENS and tokens[-1] not in self.engine.eos_ids:
            logits = self.decoder.run(slot, np.array([[tokens[-1]]]), [position])
            position += 1
            tokens.append(int(logits[0].argmax()))
        return tokens

    def measure(
        self, prompt: Any, answer: list[int], store: Any = None
    ) -> tuple[float, list[int], int]:
        """The answer's NLL, the greedy reply and the tokens placed, read that way."""
        first, placed = self.read(prompt, 1, store)
        nll = self.answer_nll(prompt, 1, first, answer)
        first, _ = self.read(prompt, 1, store)
        return nll, self.greedy(prompt, 1, first), placed


def quality(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    pairs = faq_pairs()
    ranked = top_passages(pairs, args.passages, args.passage_chars)
    reader = Reader(model, args.encoding)
    ways: list[tuple[str, int | None]] = [("exact run", None)]
    ways += [("moved", int(n)) for n in args.recompute.split(",")]
    nll: dict[str, list[float]] = {"exact read": []}
    same: dict[str, int] = {}
    placed: dict[str, list[int]] = {}
    step = max(1, len(pairs) // args.questions)
    chosen = list(range(0, len(pairs), step))[: args.questions]
    for index in chosen:
        pair = pairs[index]
        texts = [pairs[i].answer[: args.passage_chars].strip() for i in ranked[index]]
        prompt = reader.prompt(grounded_messages(pair.question, texts), texts)
        answer = reader.engine.prompts.encode_alone(pair.answer)[: args.answer_tokens]
        reader.fill(reader.exact, prompt)
        for text in texts:  # each passage's own run: where moved reuse finds it
            alone = grounded_messages(pair.question, [text])
            reader.fill(reader.moved, reader.prompt(alone, [text]))
        base_nll, base_reply, _ = reader.measure(prompt, answer)
        nll["exact read"].append(base_nll)
        for label, recompute in ways:
            name = label if recompute is None else f"moved, N={recompute}"
            store = reader.exact if recompute is None else reader.moved
            if recompute is not None:
                store.recompute = recompute
            value, reply, tokens = reader.measure(prompt, answer, store)
            nll.setdefault(name, []).append(value)
            same[name] = same.get(name, 0) + (reply == base_reply)
            placed.setdefault(name, []).append(tokens)
    questions = len(chosen)
    base = statistics.fmean(nll["exact read"])
    rows = []
    print(
        f"\n{questions} Python FAQ questions, {args.passages} passages each, store in "
        f"{args.encoding}; exact read: mean NLL {base:.4f} per answer token"
    )
    print(
        f"{'reuse':<14} | {'mean NLL':>9} | {'vs exact':>8} | {'32 tokens same':>14} | "
        f"{'tokens placed':>13} | gate"
    )
    for name in same:
        mean = statistics.fmean(nll[name])
        share = same[name] / questions
        passes = mean <= base * 1.03 and share >= 0.8
        rows.append(
            {
                "reuse": name,
                "nll": mean,
                "nll_ratio": mean / base,
                "greedy_same": share,
                "placed_mean": statistics.fmean(placed[name]),
                "passes": passes,
            }
        )
        print(
            f"{name:<14} | {mean:>9.4f} | {mean / base:>7.3f}x | {share:>13.0%} | "
            f"{statistics.fmean(placed[name]):>13.0f} | {'pass' if passes else 'fail'}"
        )
    return {"questions": questions, "encoding": args.encoding, "exact_nll": base, "rows": rows}


# -- time -------------------------------------------------------------------------------------


def timing(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    from sidecar.ipc import Generate
    from sidecar.model.batch.setup import PassageOptions
    from sidecar.model.engine import Engine
    from sidecar.model.kv.passages import Reuse

    words = [w for p in faq_pairs() for w in p.answer.split()]
    sizing = Engine(model, decode_batch_rows=4, max_concurrency=4)  # its tokenizer

    def passage(seed: int) -> str:
        """FAQ words from a place of its own, about --passage-tokens of the model's tokens."""
        start = (seed * 997) % (len(words) - 2000)
        count = args.passage_tokens // 2
        while len(sizing.prompts.encode_alone(" ".join(words[start : start + count]))) < (
            args.passage_tokens
        ):
            count += 8
        return " ".join(words[start : start + count])

    def first_token(engine: Engine, request: Any) -> tuple[float, int]:
        began = time.perf_counter()
        generation = engine.start(request)
        while generation.step() is None and generation.finish is None:
            pass
        seconds = time.perf_counter() - began
        placed = getattr(generation, "passage_cached_tokens", 0)
        generation.release(reusable=False)
        return seconds, placed

    def idle(engine: Engine) -> None:
        assert engine.batch is not None
        while engine.batch.tidy():
            pass

    def engine_with(ram: int, kind: str) -> Engine:
        reuse: Reuse = "moved" if kind == "moved" else "exact"
        made = Engine(
            model,
            decode_batch_rows=4,
            max_concurrency=4,
            prompt_cache_mb=512,
            passages=PassageOptions(ram, 0, 16, reuse),
        )
        made.warm_up()
        return made

    kinds = ("bare", "off", "miss", "exact", "warmed", "moved")
    results: dict[str, list[float]] = {k: [] for k in kinds}
    placed: dict[str, int] = {}
    for kind in ("off", "exact", "warmed", "moved"):
        engine = engine_with(0 if kind == "off" else 4 * 2**30, kind)
        for repeat in range(args.repeats):
            texts = [passage(repeat * 10 + i) for i in range(args.passages)]
            question = f"What does passage {repeat} say? ({kind})"
            grounded = Generate(
                "bench",
                grounded_messages(question, texts),
                1,
                passages=tuple(texts),
                passage_scope="s",
            )
            bare = Generate("bench", (("system", SYSTEM), ("user", question)), 1)
            if kind == "off":
                results["bare"].append(first_token(engine, bare)[0])
                results["off"].append(first_token(engine, grounded)[0])
                continue
            if kind == "warmed":  # PASSAGE_WARM: its best passage alone, read before it is asked
                best = texts[:1]
                ahead = Generate(
                    "bench", grounded_messages("", best), 1, passages=tuple(best), passage_scope="s"
                )
                engine.warm_passages(ahead, None)
                idle(engine)
                seconds, placed[kind] = first_token(engine, grounded)
                results[kind].append(seconds)
                continue
            results["miss"].append(first_token(engine, grounded)[0])
            idle(engine)  # the prompt's run read into the store
            order = texts if kind == "exact" else texts[::-1]  # moved: another order
            again = Generate(
                "bench",
                grounded_messages(f"And what else? ({repeat})", order),
                1,
                passages=tuple(order),
                passage_scope="s",
            )
            seconds, placed[kind] = first_token(engine, again)
            results[kind].append(seconds)
    median = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"\nfirst token, median of {args.repeats}, {args.passages} passages of about "
        f"{args.passage_tokens} tokens; prompt tokens from the store: {placed}"
    )
    print(f"{'prompt':<44} | {'seconds':>8} | vs bare")
    labels = {
        "bare": "bare question",
        "off": "grounded, store off",
        "miss": "grounded, not in the store",
        "exact": "grounded, same passages in the store",
        "warmed": "grounded, its best passage warmed",
        "moved": "grounded, moved (PASSAGE_REUSE=moved)",
    }
    for key, label in labels.items():
        print(f"{label:<44} | {median[key]:>8.2f} | {median[key] - median['bare']:+.2f} s")
    print(f"not in the store against store off: {median['miss'] / median['off']:.3f}x")
    return {"median_s": median, "placed_tokens": placed, "all": results}
