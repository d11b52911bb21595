"""Write a tiny random Hugging Face model of one family, offline: what scripts/models/export_model.py
converts in the tests, since no real model can be downloaded here.

The folder is laid out like the family's published instruct model (config.json,
generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json with the
published chat template, special_tokens_map.json), at 2 layers and hidden size 64, with random
weights from a fixed seed. Needs requirements-export.txt (torch, transformers).

    python -m scripts.models.make_hf_model --family llama --out DIR
    python -m scripts.models.make_hf_model --list
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from scripts.models.hfgen.families import FAMILIES


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--family", choices=sorted(FAMILIES))
    p.add_argument("--out", type=Path, help="folder to write (created)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--list", action="store_true", help="list the families and what they copy")
    args = p.parse_args(argv)
    if args.list:
        for family in FAMILIES.values():
            print(f"{family.name:8} {family.model_type:8} modelled on {family.modelled_on}")
        return 0
    if args.family is None or args.out is None:
        p.error("--family and --out are required (or --list)")
    from scripts.models.hfgen.model import make_hf_model

    began = time.perf_counter()
    make_hf_model(FAMILIES[args.family], args.out, args.seed)
    took = time.perf_counter() - began
    print(f"wrote {args.out} ({args.family}, seed {args.seed}) in {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
