"""What a conversation kept compactly (sidecar/model/kv/compact.py, KV_COMPACT) costs in
quality when its user returns: `scripts/bench/quality.py --model DIR --kv-restore int8,fp16`.

On one model folder, through the sidecar's own batched path (batch.decoder.BatchDecoder over
its KvPool, prompts fed PREFILL_CHUNK tokens a call, replies one token a call), for each text
of scripts/bench/quality_texts.json:

1. the previous turn is read into a slot in fp32: a passage's first half; for a chat, the
   prompt (the model's template) and its greedy reply, decoded as the sidecar decodes it;
2. the slot's positions go through each encoding (encode, then restore into another slot), as
   the conversation cache moves an idle conversation to compact RAM and back;
3. the rest is teacher-forced from the fp32 slot (a) and from each restored slot (b), fed the
   same way (same chunks, same calls): a passage's second half; for a chat, the next prompt
   of the set asked as the user's second turn, then (a)'s greedy reply to it.

At every fed position: top-1 agreement of (b) with (a), the perplexity of each on the true
next tokens (a chat's: the template's, then (a)'s greedy reply), and the largest |logit difference|;
for chats also how many tokens of (b)'s greedy reply equal (a)'s before the first difference
(teacher-forced: until then (b)'s own greedy reply is the one fed). Timing: encode and restore
of one slot of `timing_tokens` positions (into a slot whose pages were given back, as a
restore finds it), median of seven, the encodings taking turns; indicative on a shared CPU.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sidecar.model.batch.decoder import BatchDecoder, read_spec
from sidecar.model.cpus import cpu_budget, session_options
from sidecar.model.folder import read_genai_config
from sidecar.model.kv import compact as kv_compact
from sidecar.model.kv.compact import ENCODINGS, Encoding

REPLY_TOKENS = 48  # as scripts/bench/quality.py's chats
PREFILL_CHUNK = 64  # the sidecar's default (settings.py): chunk boundaries change the logits
TIMING_REPEATS = 7
GIB = 2**30


def parse_encodings(text: str) -> list[Encoding]:
    """'int8,fp16' as encodings, in kv.compact's order (ValueError names an unknown one)."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = sorted(names - set(ENCODINGS))
    if unknown or not names:
        raise ValueError(
            f"unknown encoding {unknown or text!r}: choose from {', '.join(ENCODINGS)}"
        )
    return [name for name in ENCODINGS if name in names]


@dataclass
class Case:
    """One text: the previous turn's tokens (kept in the slot) and the rest, fed as `segments`
    (ids, tokens per call); `targets[i]` is the true next token after fed position i."""

    label: str
    kind: str  # "passage" or "chat"
    kept: list[int]
    segments: list[tuple[list[int], int]]
    targets: list[int]
    reply_from: int = 0  # first fed position whose target is the reply's (chats)


@dataclass
class Score:
    """One encoding's figures over one kind of text."""

    agree: int = 0
    positions: int = 0
    nll_fp32: list[float] = field(default_factory=list)
    nll_encoded: list[float] = field(default_factory=list)
    max_diff: float = 0.0
    identical: int = 0
    replies: int = 0
    prefix: int = 0
    reply_tokens: int = 0
    per_text: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)  # kept, compared


@dataclass
class Reply:
    """A greedy reply: its tokens, the logits after each token fed, and the end token it
    stopped on (None: stopped by length, its last token not fed)."""

    tokens: list[int] = field(default_factory=list)
    rows: list[NDArray[np.float32]] = field(default_factory=list)
    end: int | None = None


@dataclass
class Timing:
    encode_ms: float
    restore_ms: float


class KvModel:
    """The folder's decoder on the sidecar's batched path, its tokenizer, and slots: 0 holds
    the fp32 conversation, 1.. the restored copies, the last one the timing run."""

    def __init__(self, folder: Path, slots: int, threads: int) -> None:
        import onnxruntime_genai as og

        genai_config = read_genai_config(folder)
        spec = read_spec(genai_config)
        # As model/batch/setup.py's batch_path: the session's config, the CPU budget's threads.
        options = session_options(threads, thread_spinning=True)
        config = {k: str(v) for k, v in options.items() if k.startswith("session.")}
        length = int(genai_config["model"]["context_length"])
        self.decoder = BatchDecoder(folder, spec, config, threads, slots, length)
        self.pool = self.decoder.pool
        kv_compact.THREADS = threads
        self.tokenizer = og.Tokenizer(og.Config(str(folder)))
        self.eos = frozenset(int(i) for i in self.tokenizer.eos_token_ids)
        self.name = folder.name

    def feed(self, slot: int, start: int, segments: Sequence[tuple[list[int], int]]) -> Any:
        """Feed `segments` after the slot's first `start` positions; the logits after every
        fed token [tokens, vocab]."""
        out: list[NDArray[np.float32]] = []
        position = start
        for ids, chunk in segments:
            for i in range(0, len(ids), chunk):
                part = ids[i : i + chunk]
                row = np.array([part], dtype=np.int64)
                logits = self.decoder.run(slot, row, [position], every=True)[0]
                if logits.shape[0] != len(part):
                    raise RuntimeError(
                        f"the decoder gives logits for {logits.shape[0]} of {len(part)} "
                        "positions (a pruned LM head?): teacher forcing needs every one"
                    )
                out.append(logits)
                position += len(part)
        return np.concatenate(out) if out else np.zeros((0, 0), np.float32)

    def fill(self, slot: int, ids: list[int]) -> NDArray[np.float32]:
        """Read `ids` into a slot from its start, as the sidecar reads a prompt; the last
        token's logits."""
        logits = np.zeros(0, np.float32)
        for i in range(0, len(ids), PREFILL_CHUNK):
            part = np.array([ids[i : i + PREFILL_CHUNK]], dtype=np.int64)
            logits = self.decoder.run(slot, part, [i])[0]
        return logits

    def greedy(self, slot: int, start: int, last: NDArray[np.float32]) -> Reply:
        """The greedy reply after `start` positions whose last logits are `last`, a token a
        call (the first highest logit, as the sidecar's sampler), at most REPLY_TOKENS."""
        reply = Reply()
        token = int(np.argmax(last))
        while token not in self.eos:
            reply.tokens.append(token)
            if len(reply.tokens) == REPLY_TOKENS:
                return reply  # stopped by length: the last token is not fed
            row = self.feed(slot, start + len(reply.tokens) - 1, [([token], 1)])
            reply.rows.append(row)
            token = int(np.argmax(row[-1]))
        reply.end = token
        return reply

    def encode_ids(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(text)]

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        rendered = self.tokenizer.apply_chat_template(
            json.dumps(messages), add_generation_prompt=True
        )
        return self.encode_ids(rendered)


def passage_case(model: KvModel, index: int, passage: str) -> Case:
    """Read a passage's first half into slot 0; the second half is fed."""
    ids = model.encode_ids(passage)
    half = len(ids) // 2
    model.fill(0, ids[:half])
    return Case(
        f"passage {index}", "passage", ids[:half], [(ids[half:], PREFILL_CHUNK)], ids[half + 1 :]
    )


def chat_case(model: KvModel, prompt: str, follow_up: str) -> Case:
    """Read the first turn into slot 0 (the prompt in chunks, its greedy reply a token a call,
    as the sidecar serves it), then make the second turn: the template over both turns; what
    it shares with the first turn's tokens is kept (as the conversation cache reuses the
    common prefix), the rest is fed."""
    first = [{"role": "user", "content": prompt}]
    prompt_ids = model.chat_ids(first)
    reply = model.greedy(0, len(prompt_ids), model.fill(0, prompt_ids))
    if reply.end is None:  # the sidecar feeds a reply's last token before it ends
        model.feed(0, len(prompt_ids) + len(reply.tokens) - 1, [(reply.tokens[-1:], 1)])
    said = prompt_ids + reply.tokens
    text = model.tokenizer.decode(np.array(reply.tokens, dtype=np.int32))
    second = [
        *first,
        {"role": "assistant", "content": text},
        {"role": "user", "content": follow_up},
    ]
    ids = model.chat_ids(second)
    kept = 0
    while kept < min(len(said), len(ids) - 1) and said[kept] == ids[kept]:
        kept += 1  # the last prompt token is always fed (its logits give the first token)
    return Case(
        f"chat: {prompt}", "chat", ids[:kept], [(ids[kept:], PREFILL_CHUNK)], ids[kept + 1 :]
    )


def measure(
    folder: Path,
    encodings: Sequence[Encoding],
    texts: dict[str, Any],
    *,
    threads: int = 0,
    timing_tokens: int = 1024,
) -> tuple[dict[Encoding, dict[str, Score]], dict[Encoding, Timing], KvModel]:
    threads = threads or cpu_budget().count
    model = KvModel(folder, 2 + len(encodings), threads)
    scores: dict[Encoding, dict[str, Score]] = {
        enc: {"passage": Score(), "chat": Score()} for enc in encodings
    }
    passages: list[str] = texts.get("passages", [])
    chats: list[str] = texts.get("chats", [])
    for i, passage in enumerate(passages, 1):
        compare(model, passage_case(model, i, passage), encodings, scores)
    for i, prompt in enumerate(chats):  # the second turn asks the set's next prompt
        compare(model, chat_case(model, prompt, chats[(i + 1) % len(chats)]), encodings, scores)
    timings = time_encodings(model, encodings, passages, timing_tokens)
    return scores, timings, model


def compare(
    model: KvModel,
    case: Case,
    encodings: Sequence[Encoding],
    scores: dict[Encoding, dict[str, Score]],
) -> None:
    """Slot 0 holds the case's kept positions in fp32: copy them through each encoding into
    slots 1.., feed the rest to every slot alike, and score each against slot 0. A chat's
    rest ends with slot 0's greedy reply to the second turn (a token a call)."""
    kept = len(case.kept)
    for slot, encoding in enumerate(encodings, 1):
        model.pool.free(slot)  # as a restore finds its slot: pages given back
        kv_compact.restore(kv_compact.encode(model.pool, 0, 0, kept, encoding), model.pool, slot)
    reference = model.feed(0, kept, case.segments)
    if case.kind == "chat":
        reply = model.greedy(0, kept + len(reference), reference[-1])
        case.reply_from = len(reference) - 1  # the prompt's last token predicts the reply
        fed = reply.tokens if reply.end is not None else reply.tokens[:-1]
        case.segments = [*case.segments, (fed, 1)]
        case.targets = case.targets + reply.tokens + ([reply.end] if reply.end is not None else [])
        reference = np.concatenate([reference, *reply.rows])
    for slot, encoding in enumerate(encodings, 1):
        encoded = model.feed(slot, kept, case.segments)
        score_case(case, reference, encoded, scores[encoding][case.kind])


def score_case(case: Case, a: Any, b: Any, score: Score) -> None:
    n = len(case.targets)
    a, b = a[:n], b[:n]
    same = a.argmax(axis=1) == b.argmax(axis=1)
    score.agree += int(same.sum())
    score.positions += n
    score.nll_fp32 += nll(a, case.targets).tolist()
    score.nll_encoded += nll(b, case.targets).tolist()
    score.max_diff = max(score.max_diff, float(np.abs(a - b).max()) if n else 0.0)
    text = f"{same.mean():.1%}" if n else "n/a"
    if case.kind == "chat":
        along = np.asarray(case.targets[case.reply_from :])
        matches = b[case.reply_from :].argmax(axis=1) == along
        prefix = int(np.argmin(matches)) if not matches.all() else len(along)
        score.prefix += prefix
        score.reply_tokens += len(along)
        score.replies += 1
        score.identical += prefix == len(along)
        text += f", {prefix} of {len(along)}"
    score.per_text[case.label] = text
    score.sizes[case.label] = (len(case.kept), n)


def nll(scores: Any, targets: list[int]) -> NDArray[np.float64]:
    """Negative log-likelihood of each target under the logits before it."""
    rows = scores.astype(np.float64)
    top = rows.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(rows - top).sum(axis=1)) + top[:, 0]
    result: NDArray[np.float64] = log_z - rows[np.arange(len(targets)), targets]
    return result


def time_encodings(
    model: KvModel, encodings: Sequence[Encoding], passages: list[str], tokens: int
) -> dict[Encoding, Timing]:
    """Encode and restore time of one slot of `tokens` positions (the passages read again
    and again), per 1,000 tokens, the encodings taking turns (a busy CPU slows them alike);
    the restore goes into a slot whose pages were given back, as the cache's does."""
    tokens = min(tokens, model.pool.length)
    text = [t for passage in passages for t in model.encode_ids(passage)]
    if tokens <= 0 or not text:
        return {}
    source, target = 0, model.pool.slots - 1
    model.fill(source, (text * -(-tokens // len(text)))[:tokens])
    encode_s: dict[Encoding, list[float]] = {encoding: [] for encoding in encodings}
    restore_s: dict[Encoding, list[float]] = {encoding: [] for encoding in encodings}
    for _ in range(TIMING_REPEATS):
        for encoding in encodings:
            began = time.perf_counter()
            kv = kv_compact.encode(model.pool, source, 0, tokens, encoding)
            encode_s[encoding].append(time.perf_counter() - began)
            model.pool.free(target)
            began = time.perf_counter()
            kv_compact.restore(kv, model.pool, target)
            restore_s[encoding].append(time.perf_counter() - began)
    per = 1000 / tokens * 1000  # seconds per call -> ms per 1,000 tokens
    return {
        encoding: Timing(
            statistics.median(encode_s[encoding]) * per,
            statistics.median(restore_s[encoding]) * per,
        )
        for encoding in encodings
    }


def perplexity(values: list[float]) -> float:
    return float(np.exp(np.mean(values))) if values else float("nan")


def table(
    model: KvModel,
    scores: dict[Encoding, dict[str, Score]],
    timings: dict[Encoding, Timing],
    timing_tokens: int,
) -> list[str]:
    fp32_bytes = kv_compact.bytes_per_token(model.pool, "fp32")
    lines = [
        f"model `{model.name}`: a conversation restored from each encoding against the same "
        "conversation kept in fp32",
        "",
        "| encoding | bytes a token | tokens a GiB (x fp32) | top-1 agreement, passages "
        "| top-1 agreement, chats | perplexity, passages: fp32 / encoded | perplexity, chats: "
        "fp32 / encoded | max \\|logit difference\\| | chats: same greedy tokens before the "
        "first difference | identical replies |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for encoding, kinds in scores.items():
        size = kv_compact.bytes_per_token(model.pool, encoding)
        passage, chat = kinds["passage"], kinds["chat"]
        lines.append(
            f"| {encoding} | {size:,} | {GIB // size:,} ({fp32_bytes / size:.2f}) "
            f"| {share(passage.agree, passage.positions)} | {share(chat.agree, chat.positions)} "
            f"| {ppl_pair(passage)} | {ppl_pair(chat)} "
            f"| {max(passage.max_diff, chat.max_diff):.4g} "
            f"| {share(chat.prefix, chat.reply_tokens)} ({chat.prefix} of {chat.reply_tokens}) "
            f"| {chat.identical} of {chat.replies} |"
        )
    if timings:
        lines += [
            "",
            f"Time per 1,000 tokens (one slot of {min(timing_tokens, model.pool.length):,} "
            f"positions, median of {TIMING_REPEATS}, {kv_compact.THREADS} threads; "
            "indicative on a shared CPU):",
            "",
            "| encoding | encode ms | restore ms |",
            "|---|---:|---:|",
        ]
        for encoding, timing in timings.items():
            lines.append(f"| {encoding} | {timing.encode_ms:.2f} | {timing.restore_ms:.2f} |")
    first = next(iter(scores.values()))
    sizes = {**first["passage"].sizes, **first["chat"].sizes}
    lines += [
        "",
        "Per text: positions kept (read in fp32, then encoded) and compared; top-1 agreement "
        "(chats: and greedy tokens equal before the first difference)",
        "",
        "| text | kept | compared | " + " | ".join(scores) + " |",
        "|---|---:|---:|" + "---:|" * len(scores),
    ]
    for label, (kept, compared) in sizes.items():
        cells = [{**k["passage"].per_text, **k["chat"].per_text}[label] for k in scores.values()]
        lines.append(f"| {label} | {kept} | {compared} | " + " | ".join(cells) + " |")
    return lines


def exact_failure(scores: dict[Encoding, dict[str, Score]]) -> str | None:
    """Why the fp32 round trip was not lossless, or None."""
    kinds = scores["fp32"]
    for kind, score in kinds.items():
        if score.agree != score.positions or score.max_diff != 0.0:
            return (
                f"fp32 restore is not lossless on the {kind}s: agreement "
                f"{share(score.agree, score.positions)}, max |logit difference| {score.max_diff:g}"
            )
        if score.identical != score.replies:
            return f"fp32 restore changed {score.replies - score.identical} greedy replies"
    return None


def share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "n/a"


def ppl_pair(score: Score) -> str:
    a, b = perplexity(score.nll_fp32), perplexity(score.nll_encoded)
    return f"{a:.3f} / {b:.3f} ({(b - a) / a:+.2%})"
