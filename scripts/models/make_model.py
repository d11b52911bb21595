"""Write an offline Phi-3-style model folder that onnxruntime-genai loads like the real one.

No weights can be downloaded here, so tests and benchmarks use generated models: the same
graph the official builder emits for Phi-3 int4 CPU (Gather embedding, SimplifiedLayerNorm /
SkipSimplifiedLayerNorm, int4 MatMulNBits with block 32 and accuracy level 4, GroupQueryAttention
with rotary caches, SiLU MLP, int4 LM head), random packed int4 weights streamed straight into
`<name>.onnx.data`, a phi3 `genai_config.json`, and a byte-level BPE tokenizer with Phi-3's
special tokens and chat template. Same arguments, byte-identical files.

    python -m scripts.models.make_model --preset tiny --out DIR
    python -m scripts.models.make_model --preset phi3-mini --out DIR --block-size 128 --int4-embedding
    python -m scripts.models.make_model --preset tiny-vision --out DIR   # a phi3v folder: images

`tiny-vision` writes a Phi-3.5-vision-style folder (scripts/models/modelgen/vision.py): the tiny
decoder reading embeddings, an embedding graph and a vision graph; it takes no variant option.

The variant options make what the official builder's options of the same names make (see
docs/benchmarks/variants.md): --block-size (block_size), --int4-embedding (Gather in
op_types_to_quantize), --prune-lm-head (prune_lm_head), --kv-cache (kv_cache_quant_scheme).
The weights are the same numbers at every block size (scales are equal across a row's blocks),
so block sizes compare like for like; the int4 embedding is the fp32 one, quantized.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import onnx

from scripts.models.modelgen.config import (
    BLOCK_SIZES,
    EOS_PROMPT,
    FILENAME,
    KV_CACHE_TYPES,
    LONG_PROMPT,
    PRESETS,
    Shape,
    Variant,
    dump_json,
    genai_config,
)
from scripts.models.modelgen.graph import build_graph
from scripts.models.modelgen.tokenizer import CHAT_TEMPLATE, write_tokenizer
from scripts.models.modelgen.vision import VISION_PRESETS, make_vision_model
from scripts.models.modelgen.vocab import MIN_VOCAB, PHI3_VOCAB, SPECIALS, special_ids
from scripts.models.modelgen.weights import BLOCK, EOS_BOOST, DataFile

# The names tests and other scripts import from here; the rest lives in scripts/models/modelgen.
__all__ = [
    "BLOCK",
    "CHAT_TEMPLATE",
    "EOS_BOOST",
    "EOS_PROMPT",
    "FILENAME",
    "FLAGS",
    "LONG_PROMPT",
    "MIN_VOCAB",
    "PHI3_VOCAB",
    "PRESETS",
    "SPECIALS",
    "Shape",
    "Variant",
    "build_graph",
    "genai_config",
    "main",
    "make_model",
    "parse_args",
    "special_ids",
    "write_tokenizer",
]


def make_model(
    shape: Shape,
    out: Path,
    seed: int = 0,
    graph_only: bool = False,
    variant: Variant | None = None,
) -> int:
    """Write the model folder; returns the size of the weights file (written or not)."""
    out.mkdir(parents=True, exist_ok=True)
    tokens = write_tokenizer(out, shape.vocab)
    dump_json(out / "genai_config.json", genai_config(shape, variant))
    data_path = out / f"{FILENAME}.data"
    if graph_only:
        data_path.unlink(missing_ok=True)
    # Written under a temporary name: an interrupted run never leaves a plausible weights file.
    partial = data_path.with_name(data_path.name + ".partial")
    data = DataFile(None if graph_only else partial, data_path.name, seed)
    try:
        model = build_graph(shape, data, tokens, variant)
    finally:
        data.close()
    onnx.save_model(model, out / FILENAME)
    if not graph_only:
        partial.replace(data_path)
    return data.offset


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Shape, Variant]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS | VISION_PRESETS), default="tiny")
    p.add_argument("--out", type=Path, required=True, help="folder to write (created)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--graph-only", action="store_true", help="skip the weights file")
    p.add_argument(
        "--prune-lm-head",
        action="store_true",
        help="logits for the last position only (the official builder's prune_lm_head; "
        "the published Phi-3 model computes them for every prompt token)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        choices=BLOCK_SIZES,
        default=32,
        help="int4 block size of every MatMulNBits (the builder's block_size; published: 32)",
    )
    p.add_argument(
        "--int4-embedding",
        action="store_true",
        help="int4 embedding table (GatherBlockQuantized) instead of fp32 Gather",
    )
    p.add_argument(
        "--kv-cache",
        choices=KV_CACHE_TYPES,
        default="fp32",
        help="KV cache type (the builder's kv_cache_quant_scheme; int8 scales are fixed, "
        "not calibrated: the generated weights have no data to calibrate on)",
    )
    for flag, field in FLAGS.items():
        p.add_argument(flag, type=int, dest=field, help=f"override the preset's {field}")
    args = p.parse_args(argv)
    shape = replace(
        {**PRESETS, **VISION_PRESETS}[args.preset],
        **{f: getattr(args, f) for f in FLAGS.values() if getattr(args, f) is not None},
    )
    if shape.hidden % shape.heads or shape.heads % shape.kv_heads or shape.head_size % 2:
        p.error("heads must divide hidden size, kv-heads must divide heads, head size even")
    if shape.vocab < MIN_VOCAB:
        p.error(f"--vocab-size must be at least {MIN_VOCAB} (3 + 256 bytes + Phi-3's specials)")
    block = args.block_size
    if shape.hidden % block or shape.intermediate % block:
        p.error(f"hidden and intermediate sizes must be multiples of the block size {block}")
    variant = Variant(block, args.int4_embedding, args.prune_lm_head, args.kv_cache)
    if args.preset in VISION_PRESETS and (variant != Variant() or args.graph_only):
        p.error(f"--preset {args.preset} takes no variant option and no --graph-only")
    return args, shape, variant


FLAGS = {
    "--hidden-size": "hidden",
    "--layers": "layers",
    "--heads": "heads",
    "--kv-heads": "kv_heads",
    "--intermediate-size": "intermediate",
    "--vocab-size": "vocab",
    "--context-length": "context",
}


def main(argv: list[str] | None = None) -> int:
    args, shape, variant = parse_args(argv)
    began = time.perf_counter()
    if args.preset in VISION_PRESETS:
        size = make_vision_model(shape, args.out, args.seed)
    else:
        size = make_model(shape, args.out, args.seed, args.graph_only, variant)
    took = time.perf_counter() - began
    what = "graph only, weights file would be" if args.graph_only else "weights file"
    print(
        f"wrote {args.out} ({args.preset}: {shape}; {variant}; {what} {size:,} bytes) "
        f"in {took:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
