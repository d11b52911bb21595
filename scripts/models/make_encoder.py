"""Write a tiny encoder folder the sidecar serves on /v1/embeddings, offline and without torch:

    python -m scripts.models.make_encoder --out DIR [--pooling mean|cls] [--max-tokens 32]

The layout of a sentence-transformers repository with its ONNX export (sidecar/embeddings/
folder.py): a BERT-style WordPiece tokenizer.json ([CLS] ... [SEP], lower case) over a small
English vocabulary, and a one-layer encoder graph (token, position and type embeddings, layer
norm, one attention head that reads the attention mask, layer norm) with fixed random weights:
same arguments, same bytes. Its vectors mean nothing, but padding, batching, pooling and
normalisation change them exactly as they would a real encoder's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

WIDTH = 32
POSITIONS = 64
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there one all we can has their been if more when "
    "will would who so no out up into do than its time only new some could these two may first "
    "then any like my now over such our man me even most made after also did many before must "
    "through years where much your way well down should because each just those people how too "
    "little state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come since "
    "go against came right used take three cat dog sat mat paris france capital city document "
    "search query passage model embedding vector text chat hello"
).split()
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()-")


def vocabulary() -> list[str]:
    return SPECIALS + WORDS + CHARS + ["##" + c for c in CHARS if c.isalnum()]


def write_tokenizer(out: Path, vocab: list[str], max_tokens: int) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers.processors import TemplateProcessing

    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    data = json.loads(tok.to_str())
    (out / "tokenizer.json").write_text(json.dumps(data, indent=2) + "\n")
    dump(out / "tokenizer_config.json", {"do_lower_case": True, "model_max_length": max_tokens})


def write_graph(path: Path, vocab_size: int, seed: int) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def weight(name: str, *shape: int, scale: float = 0.3) -> Any:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype("f4"), name)

    init = [
        weight("word", vocab_size, WIDTH, scale=1.0),
        weight("position", POSITIONS, WIDTH),
        weight("type", 2, WIDTH),
        numpy_helper.from_array(np.ones(WIDTH, "f4"), "gamma"),
        numpy_helper.from_array(np.zeros(WIDTH, "f4"), "beta"),
        *(weight(n, WIDTH, WIDTH, scale=WIDTH**-0.5) for n in ("wq", "wk", "wv", "wo")),
        numpy_helper.from_array(np.array(0, "i8"), "zero"),
        numpy_helper.from_array(np.array(1, "i8"), "one"),
        numpy_helper.from_array(np.array([1], "i8"), "axis1"),
        numpy_helper.from_array(np.array(1.0, "f4"), "onef"),
        numpy_helper.from_array(np.array(-10000.0, "f4"), "neg"),
        numpy_helper.from_array(np.array(WIDTH**-0.5, "f4"), "scale"),
    ]
    n = helper.make_node
    nodes = [
        n("Gather", ["word", "input_ids"], ["we"]),
        n("Gather", ["type", "token_type_ids"], ["te"]),
        n("Shape", ["input_ids"], ["shape"]),
        n("Gather", ["shape", "one"], ["seq"]),
        n("Range", ["zero", "seq", "one"], ["pos"]),
        n("Gather", ["position", "pos"], ["pe"]),
        n("Add", ["we", "te"], ["e1"]),
        n("Add", ["e1", "pe"], ["e"]),
        n("LayerNormalization", ["e", "gamma", "beta"], ["x"], axis=-1, epsilon=1e-12),
        n("MatMul", ["x", "wq"], ["q"]),
        n("MatMul", ["x", "wk"], ["k"]),
        n("MatMul", ["x", "wv"], ["v"]),
        n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["s0"]),
        n("Mul", ["s0", "scale"], ["s1"]),
        n("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        n("Unsqueeze", ["m", "axis1"], ["m3"]),
        n("Sub", ["onef", "m3"], ["hole"]),
        n("Mul", ["hole", "neg"], ["bias"]),
        n("Add", ["s1", "bias"], ["s2"]),
        n("Softmax", ["s2"], ["a"], axis=-1),
        n("MatMul", ["a", "v"], ["ctx"]),
        n("MatMul", ["ctx", "wo"], ["o"]),
        n("Add", ["x", "o"], ["r"]),
        n("LayerNormalization", ["r", "gamma", "beta"], ["last_hidden_state"], axis=-1),
    ]
    ids = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "tokens"])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    out = helper.make_tensor_value_info(
        "last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", WIDTH]
    )
    graph = helper.make_graph(nodes, "tiny-encoder", ids, [out], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def dump(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def make_encoder(out: Path, pooling: str = "mean", max_tokens: int = 32, seed: int = 0) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary()
    write_tokenizer(out, vocab, max_tokens)
    write_graph(out / "onnx" / "model.onnx", len(vocab), seed)
    dump(
        out / "config.json",
        {
            "model_type": "bert",
            "hidden_size": WIDTH,
            "max_position_embeddings": POSITIONS,
            "vocab_size": len(vocab),
        },
    )
    dump(out / "sentence_bert_config.json", {"max_seq_length": max_tokens, "do_lower_case": False})
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
        {
            "idx": 2,
            "name": "2",
            "path": "2_Normalize",
            "type": "sentence_transformers.models.Normalize",
        },
    ]
    dump(out / "modules.json", modules)
    dump(
        out / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": WIDTH,
            "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--pooling", choices=("mean", "cls"), default="mean")
    p.add_argument("--max-tokens", type=int, default=32, help="the tokens an input may have")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    make_encoder(args.out, args.pooling, args.max_tokens, args.seed)
    print(f"EMBED_MODEL_PATH={args.out.resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
