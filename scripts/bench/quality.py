"""How close a model folder stays to a reference folder on a fixed text set: for every later
speed or memory variant of a model (another precision, a smaller KV cache, ...).

    python -m scripts.bench quality --model models/smollm2-int4 --reference models/smollm2-fp32
    python -m scripts.bench quality --model models/smollm2-fp32 --kv-restore int8,fp16 [--exact]

Two measures, both on scripts/bench/quality_texts.json (committed, so figures compare over time):
- passages: perplexity of each model on short English passages, and top-1 agreement: how
  often the model's most likely next token is the reference's, position by position;
- chats: the reference's greedy reply to each prompt (with the model's chat template), then the
  model's top-1 agreement along that same reply (teacher-forced: one early difference does not
  count twice), and how many tokens of the model's own greedy reply equal the reference's
  before the first difference.

Both folders must share a tokenizer (the same model in two variants). Prints a Markdown table.

--kv-restore ENCODINGS (no --reference): on one folder, a conversation restored from the
compact encodings the conversation cache keeps (KV_COMPACT) against the same conversation
kept in fp32, through the sidecar's own batched path (scripts/bench/quality_kv.py says how).
--exact adds fp32 and fails unless its round trip is lossless (100% agreement, no logit
difference, every greedy reply identical).

Exit status: 0 done, 1 failed (one line on stderr), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from scripts.bench.common import BadArguments, Failed

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

TEXTS = Path(__file__).with_name("quality_texts.json")
REPLY_TOKENS = 48


@dataclass
class Loaded:
    name: str
    model: Any
    tokenizer: Any
    eos: frozenset[int]


def load(folder: Path) -> Loaded:
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    eos = frozenset(int(i) for i in tokenizer.eos_token_ids)
    return Loaded(folder.name, model, tokenizer, eos)


def logits(loaded: Loaded, ids: list[int]) -> NDArray[np.float32]:
    """The model's next-token logits after each of `ids` (one forward pass)."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(loaded.model)
    params.set_search_options(max_length=len(ids) + 1)
    generator = og.Generator(loaded.model, params)
    generator.append_tokens(ids)
    out: NDArray[np.float32] = np.asarray(generator.get_output("logits"))[0]
    if out.shape[0] != len(ids):
        raise RuntimeError(f"{loaded.name}: logits for {out.shape[0]} of {len(ids)} positions")
    return out


def greedy(loaded: Loaded, ids: list[int], n: int) -> list[int]:
    import onnxruntime_genai as og

    params = og.GeneratorParams(loaded.model)
    params.set_search_options(max_length=len(ids) + n, do_sample=False)
    generator = og.Generator(loaded.model, params)
    generator.append_tokens(ids)
    reply: list[int] = []
    while len(reply) < n and not generator.is_done():
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        if token in loaded.eos:
            break
        reply.append(token)
    return reply


def nll(scores: NDArray[np.float32], targets: list[int]) -> NDArray[np.float64]:
    """Negative log-likelihood of each target under the logits of the position before it."""
    rows = scores.astype(np.float64)
    top = rows.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(rows - top).sum(axis=1)) + top[:, 0]
    return log_z - rows[np.arange(len(targets)), targets]


def chat_ids(loaded: Loaded, prompt: str) -> list[int]:
    rendered = loaded.tokenizer.apply_chat_template(
        json.dumps([{"role": "user", "content": prompt}]), add_generation_prompt=True
    )
    return [int(i) for i in loaded.tokenizer.encode(rendered)]


def share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "n/a"


def same_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def compare(model: Loaded, reference: Loaded, texts: dict[str, Any]) -> list[str]:
    lines = [
        f"model `{model.name}` against reference `{reference.name}`",
        "",
        "| passage | tokens | perplexity (reference) | perplexity (model) | top-1 agreement |",
        "|---|---:|---:|---:|---:|",
    ]
    all_ref, all_model, agree, total = [], [], 0, 0
    for i, passage in enumerate(texts["passages"], 1):
        ids = [int(t) for t in reference.tokenizer.encode(passage)]
        if [int(t) for t in model.tokenizer.encode(passage)] != ids:
            raise RuntimeError("the two folders tokenize differently: not variants of one model")
        ref_logits, model_logits = logits(reference, ids)[:-1], logits(model, ids)[:-1]
        ref_nll, model_nll = nll(ref_logits, ids[1:]), nll(model_logits, ids[1:])
        same = int((ref_logits.argmax(1) == model_logits.argmax(1)).sum())
        all_ref += ref_nll.tolist()
        all_model += model_nll.tolist()
        agree, total = agree + same, total + len(ids) - 1
        lines.append(
            f"| {i} | {len(ids)} | {np.exp(ref_nll.mean()):.2f} | {np.exp(model_nll.mean()):.2f}"
            f" | {share(same, len(ids) - 1)} |"
        )
    lines.append(
        f"| all | {total} | {np.exp(np.mean(all_ref)):.2f} | {np.exp(np.mean(all_model)):.2f}"
        f" | {share(agree, total)} |"
    )
    lines += [
        "",
        "| chat prompt | reference reply tokens | top-1 agreement on it | same greedy tokens "
        "before the first difference |",
        "|---|---:|---:|---:|",
    ]
    agree, total, whole = 0, 0, 0
    for prompt in texts["chats"]:
        ids = chat_ids(reference, prompt)
        ref_reply = greedy(reference, ids, REPLY_TOKENS)
        scores = logits(model, ids + ref_reply)[len(ids) - 1 : -1]
        same = int((scores.argmax(1) == np.array(ref_reply)).sum())
        prefix = same_prefix(greedy(model, ids, REPLY_TOKENS), ref_reply)
        agree, total = agree + same, total + len(ref_reply)
        whole += prefix == len(ref_reply)
        lines.append(f"| {prompt} | {len(ref_reply)} | {share(same, len(ref_reply))} | {prefix} |")
    lines.append(
        f"| all {len(texts['chats'])} | {total} | {share(agree, total)} | "
        f"{whole} of {len(texts['chats'])} replies identical |"
    )
    return lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, required=True, help="the model folder to judge")
    p.add_argument("--reference", type=Path, help="the folder it is judged against")
    p.add_argument("--texts", type=Path, default=TEXTS, help="the text set (default: committed)")
    p.add_argument(
        "--kv-restore",
        metavar="ENCODINGS",
        help="compact KV encodings to judge on --model alone, e.g. int8,fp16 (of int8, fp16, fp32)",
    )
    p.add_argument(
        "--exact", action="store_true", help="with the KV encodings: fp32's must be lossless"
    )
    p.add_argument(
        "--timing-tokens",
        type=int,
        default=1024,
        help="KV encodings: positions of the slot timed for encode and restore (0: no timing)",
    )


def main(args: argparse.Namespace) -> dict[str, Any]:
    kv_mode = bool(args.kv_restore or args.exact)
    # Imported here: it loads onnxruntime, after ORT_DISABLE_TELEMETRY is set.
    from scripts.bench.quality_kv import exact_failure, measure, parse_encodings, table

    encodings: list[Any] = []
    if kv_mode:
        if args.reference is not None:
            raise BadArguments("--kv-restore and --exact judge one folder: leave out --reference")
        try:
            encodings = parse_encodings(args.kv_restore or "fp32")
        except ValueError as error:
            raise BadArguments(str(error)) from None
        if args.exact:
            encodings = parse_encodings(",".join([*encodings, "fp32"]))
        if args.timing_tokens < 0:
            raise BadArguments("--timing-tokens must be 0 or more")
    elif args.reference is None:
        raise BadArguments("--reference is required (or --kv-restore to judge KV encodings)")
    for folder in (args.model, args.reference):
        if folder is not None and not (folder / "genai_config.json").is_file():
            raise BadArguments(f"{folder} has no genai_config.json: not a model folder")
    try:
        texts = json.loads(args.texts.read_text(encoding="utf-8"))
        failure = None
        if kv_mode:
            scores, timings, model = measure(
                args.model, encodings, texts, timing_tokens=args.timing_tokens
            )
            lines = table(model, scores, timings, args.timing_tokens)
            failure = exact_failure(scores) if args.exact else None
        else:
            assert args.reference is not None
            lines = compare(load(args.model), load(args.reference), texts)
    except Exception as error:  # onnxruntime-genai's own errors: one line, not a trace
        raise Failed(str(error).strip().splitlines()[0] if str(error) else repr(error)) from None
    print("\n".join(lines))
    # The tables are the result, each row's figures as printed.
    result: dict[str, Any] = {
        "model": str(args.model),
        "reference": str(args.reference or ""),
        "table": lines,
    }
    if kv_mode:
        result["kv_restore"] = list(encodings)
    if failure is not None:
        raise Failed(failure, result)
    return result
