"""Write an offline Phi-3-style model folder that onnxruntime-genai loads like the real one.

No weights can be downloaded here, so tests and benchmarks use generated models: the same
graph the official builder emits for Phi-3 int4 CPU (Gather embedding, SimplifiedLayerNorm /
SkipSimplifiedLayerNorm, int4 MatMulNBits with block 32 and accuracy level 4, GroupQueryAttention
with rotary caches, SiLU MLP, int4 LM head), random packed int4 weights streamed straight into
`<name>.onnx.data`, a phi3 `genai_config.json`, and a byte-level BPE tokenizer with Phi-3's
special tokens and chat template. Same arguments, byte-identical files.

    python scripts/make_model.py --preset tiny --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper

FILENAME = "phi3-mini-4k-instruct-cpu-int4-rtn-block-32-acc-level-4.onnx"
BLOCK = 32  # int4 block size of the official model
EPS = 1e-5
ROPE_THETA = 10000.0

# Prompts (user messages, rendered with the chat template, no system message, greedy search)
# whose replies on the `tiny` preset with the default seed are known; tests/models checks them.
EOS_PROMPT = "How."  # " sc谢 tj hd" (4 tokens, one CJK), then <|end|>
LONG_PROMPT = "Hello"  # no <|end|> within 256 tokens; Arabic, CJK, Hangul, accents

# Phi-3's special tokens in id order from 32000; placed at the end of smaller vocabularies.
SPECIALS = [
    "<|endoftext|>",
    "<|assistant|>",
    "<|placeholder1|>",
    "<|placeholder2|>",
    "<|placeholder3|>",
    "<|placeholder4|>",
    "<|system|>",
    "<|end|>",
    "<|placeholder5|>",
    "<|placeholder6|>",
    "<|user|>",
]
PHI3_VOCAB = 32064  # 32011 real tokens padded to a multiple of 64; specials start at 32000
MIN_VOCAB = 3 + 256 + len(SPECIALS)
EOS_BOOST = 1.2  # multiplies the LM head scales of <|end|>: higher ends replies sooner

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    context: int

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads


PRESETS = {
    "tiny": Shape(64, 2, 4, 4, 128, 1024, 4096),
    "small": Shape(512, 8, 8, 8, 1536, 8192, 4096),
    "phi3-mini": Shape(3072, 32, 32, 32, 8192, PHI3_VOCAB, 4096),
}


def special_ids(vocab: int) -> dict[str, int]:
    start = 32000 if vocab == PHI3_VOCAB else vocab - len(SPECIALS)
    return {tok: start + i for i, tok in enumerate(SPECIALS)}


# ---------------------------------------------------------------- tokenizer


def byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte, as byte-level BPE vocabularies spell them."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


# A small multilingual corpus: merges learnt from it give whole-word and whole-character
# tokens (accents, CJK, Arabic, Hebrew, emoji), so generated replies contain multi-byte text.
CORPUS = """
The quick brown fox jumps over the lazy dog. Hello, how are you today? I am fine, thank you.
Tell me a story about the sea, the sun and the stars. What is the weather like in the city?
Azure App Service runs the chat app and the model sidecar in one container group on a CPU.
Café, naïve, résumé, über, señor, ação, façade, crème brûlée, déjà vu, coöperate, Ærø.
你好，世界。今天天气很好。我们一起学习中文。谢谢你的帮助。
こんにちは、世界。ありがとうございます。日本語を勉強しています。
안녕하세요. 감사합니다. 만나서 반갑습니다.
مرحبا بالعالم. شكرا جزيلا. كيف حالك اليوم؟
שלום עולם. תודה רבה. מה שלומך היום?
Привет, мир! Спасибо большое. Как дела сегодня?
Emoji: 😀 🎉 👍 ❤️ 🚀 🌍 ✨ — “quotes” and ‘apostrophes’ … € £ ¥ © ° ± × ÷
"""


def learn_merges(n_merges: int) -> list[tuple[str, str]]:
    """Deterministic BPE: corpus merges first, then letter-by-letter words to fill the vocab."""
    from tokenizers import pre_tokenizers

    bc = byte_chars()
    split = pre_tokenizers.ByteLevel(add_prefix_space=False)  # the same split as encoding
    words: dict[tuple[str, ...], int] = {}
    for line in CORPUS.strip().splitlines():
        for piece, _ in split.pre_tokenize_str(line):
            words[tuple(piece)] = words.get(tuple(piece), 0) + 1
    merges: list[tuple[str, str]] = []
    known = set(bc)
    while len(merges) < n_merges:
        counts: dict[tuple[str, str], int] = {}
        for word, n in words.items():
            for pair in itertools.pairwise(word):
                counts[pair] = counts.get(pair, 0) + n
        if not counts:
            break
        # Most frequent pair; ties broken by the pair itself so every run agrees.
        best = min(counts, key=lambda p: (-counts[p], p))
        if best[0] + best[1] not in known:  # another pair may already spell the same token
            merges.append(best)
            known.add(best[0] + best[1])
        words = {merge_word(w, best): n for w, n in words.items()}
    # The corpus is used up long before 32k tokens: grow words letter by letter, breadth first.
    letters = [bc[b] for b in b"etaoinshrdlcumwfgypbvkjxqz"]
    queue = [bc[32] + c for c in letters] + letters
    i = 0
    while len(merges) < n_merges:
        piece = queue[i // 26]
        if piece not in known:  # a space-prefixed letter the corpus never merged
            merges.append((piece[0], piece[1:]))
            known.add(piece)
        new = piece + letters[i % 26]
        if new not in known:
            merges.append((piece, letters[i % 26]))
            known.add(new)
            queue.append(new)
        i += 1
    return merges[:n_merges]


def merge_word(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def build_vocab(vocab_size: int) -> tuple[list[str], list[tuple[str, str]]]:
    """Tokens in id order: <unk> <s> </s>, 256 bytes, merges, Phi-3 specials, padding."""
    specials = special_ids(vocab_size)
    start = min(specials.values())
    n_merges = start - 3 - 256
    merges = learn_merges(n_merges)
    tokens = ["<unk>", "<s>", "</s>", *byte_chars(), *(a + b for a, b in merges), *SPECIALS]
    pad = [f"<|dummy_{i}|>" for i in range(vocab_size - len(tokens))]
    return tokens + pad, merges


def write_tokenizer(out: Path, vocab_size: int) -> list[str]:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens, merges = build_vocab(vocab_size)
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    start = min(special_ids(vocab_size).values())
    specials = tokens[:3] + tokens[start:]  # <unk> <s> </s>, Phi-3's specials, padding
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    # Written through json so that key order and indentation never depend on the library.
    data = json.loads(tok.to_str())
    (out / "tokenizer.json").write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(tokens)
        if t in set(specials)
    }
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "bos_token": "<s>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": "<unk>",
    }
    dump_json(out / "tokenizer_config.json", config)
    dump_json(
        out / "special_tokens_map.json",
        {
            "bos_token": "<s>",
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "unk_token": "<unk>",
        },
    )
    dump_json(out / "added_tokens.json", {t: i for i, t in enumerate(tokens) if t in SPECIALS})
    return tokens


def dump_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=4, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------- weights


class DataFile:
    """Streams initializers into one external data file; with `path=None` it only counts bytes."""

    def __init__(self, path: Path | None, location: str, seed: int) -> None:
        self.file: BinaryIO | None = path.open("wb") if path else None
        self.location = location
        self.seed = seed
        self.offset = 0
        self.count = 0

    def rng(self) -> np.random.Generator:
        # One stream per tensor, so a tensor's values never depend on how it is chunked.
        self.count += 1
        return np.random.default_rng([self.seed, self.count])

    def tensor(self, name: str, dims: list[int], dtype: int, chunks: Any) -> TensorProto:
        """Write what `chunks()` yields (arrays, in order) as one tensor; skipped if counting."""
        item = 4 if dtype == TensorProto.FLOAT else 1  # float32 or uint8
        length = int(np.prod(dims)) * item
        if self.file is not None:
            written = 0
            for chunk in chunks():
                self.file.write(chunk.tobytes())
                written += chunk.nbytes
            assert written == length, (name, written, length)
        t = TensorProto(name=name, data_type=dtype, dims=dims)
        t.data_location = TensorProto.EXTERNAL
        where = {"location": self.location, "offset": str(self.offset), "length": str(length)}
        for key, value in where.items():
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        self.offset += length
        return t

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


ROWS_PER_CHUNK = 1024  # rows of a weight matrix generated at once: memory stays bounded


def int4_matrix(
    data: DataFile, name: str, k: int, n: int, row_scale: np.ndarray | None = None
) -> list[TensorProto]:
    """MatMulNBits weights [N, K/32, 16] of random nibbles (zero point 8) and fp32 scales.

    Scales are chosen so an input of RMS 1 gives outputs of RMS about 1. `row_scale`
    multiplies each output row's scales (the LM head uses it to boost or mute tokens); such a
    matrix draws symmetric nibbles (1..15) so that no row gets a bias from the nibbles' mean.
    """
    blocks = k // BLOCK
    scale = 1.0 / (4.61 * np.sqrt(k))
    rng = data.rng()

    def packed() -> Any:
        for start in range(0, n, ROWS_PER_CHUNK):
            rows = min(ROWS_PER_CHUNK, n - start)
            if row_scale is None:
                yield np.frombuffer(rng.bytes(rows * blocks * 16), np.uint8)
            else:
                nib = rng.integers(1, 16, size=(rows * blocks * 16, 2), dtype=np.uint8)
                yield nib[:, 0] | (nib[:, 1] << 4)

    def scales() -> Any:
        for start in range(0, n, ROWS_PER_CHUNK):
            rows = min(ROWS_PER_CHUNK, n - start)
            col = np.full((rows, 1), scale, np.float32)
            if row_scale is not None:
                col = col * row_scale[start : start + rows, None].astype(np.float32)
            yield np.repeat(col, blocks, axis=1)

    return [
        data.tensor(f"{name}.weight_Q4", [n, blocks, 16], TensorProto.UINT8, packed),
        data.tensor(f"{name}.weight_scales", [n, blocks], TensorProto.FLOAT, scales),
    ]


def fp32(data: DataFile, name: str, dims: list[int], values: Any) -> TensorProto:
    return data.tensor(name, dims, TensorProto.FLOAT, values)


def lm_head_row_scales(tokens: list[str], eos: int) -> np.ndarray:
    """Mute (scale 0) the tokens a chat model should not print; keep <|end|> so replies end.

    Muted: <unk>, <s>, </s>, every special but <|end|>, control bytes other than newline and
    tab, and tokens that are not whole UTF-8 (lone or partial multi-byte sequences), so greedy
    replies are valid text without U+FFFD. A muted row's logit is 0 while the best live row's
    is well above 0, so greedy search never picks one. EOS_BOOST tunes how often <|end|> wins:
    at 1.2 about 40% of tiny's replies to short prompts end within 64 tokens (1.0: 10%,
    1.35: 70%).
    """
    decode = {c: b for b, c in enumerate(byte_chars())}
    rows = np.ones(len(tokens), np.float32)
    for i, tok in enumerate(tokens):
        if i < 3 or i >= min(special_ids(len(tokens)).values()):
            rows[i] = 0.0
            continue
        raw = bytes(decode[c] for c in tok)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            rows[i] = 0.0
            continue
        if any((ord(ch) < 32 and ch not in "\n\t") or ch == "\x7f" for ch in text):
            rows[i] = 0.0
    rows[eos] = EOS_BOOST
    return rows


# ---------------------------------------------------------------- graph


def rotary_caches(shape: Shape) -> tuple[np.ndarray, np.ndarray]:
    half = shape.head_size // 2
    inv_freq = 1.0 / ROPE_THETA ** (np.arange(half, dtype=np.float64) * 2 / shape.head_size)
    freqs = np.outer(np.arange(shape.context, dtype=np.float64), inv_freq)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


def build_graph(shape: Shape, data: DataFile, tokens: list[str]) -> onnx.ModelProto:
    h, kv, hd = shape.hidden, shape.kv_heads, shape.head_size
    nodes: list[onnx.NodeProto] = []
    weights: list[TensorProto] = []

    def node(op: str, inputs: list[str], name: str, n_out: int = 1, **attrs: Any) -> list[str]:
        outs = [f"{name}/output_{i}" for i in range(n_out)]
        if name == "/lm_head/MatMul":
            outs = ["logits"]  # the graph output itself, as in the official model
        domain = "com.microsoft" if op in MS_OPS else ""
        nodes.append(helper.make_node(op, inputs, outs, name=name, domain=domain, **attrs))
        return outs

    def matmul(x: str, name: str, k: int, n: int, rows: np.ndarray | None = None) -> str:
        q, s = int4_matrix(data, name.replace("/", ".").lstrip("."), k, n, rows)
        weights.extend([q, s])
        attrs = {"K": k, "N": n, "bits": 4, "block_size": BLOCK, "accuracy_level": 4}
        return node("MatMulNBits", [x, q.name, s.name], name, **attrs)[0]

    def norm_weight(name: str) -> str:
        # Random signs: the int4 nibbles have mean -0.5, so every projection adds the same
        # offset to all its outputs; with all-ones norm weights that offset grows layer after
        # layer until a deep model (phi3-mini) repeats one token forever. Signs scramble it.
        signs = np.where(data.rng().random(h) < 0.5, -1.0, 1.0).astype(np.float32)
        weights.append(fp32(data, name, [h], lambda: [signs]))
        return name

    rng = data.rng()

    def embedding() -> Any:
        for start in range(0, shape.vocab, ROWS_PER_CHUNK):
            rows = min(ROWS_PER_CHUNK, shape.vocab - start)
            yield rng.standard_normal((rows, h), dtype=np.float32)

    weights.append(fp32(data, "model.embed_tokens.weight", [shape.vocab, h], embedding))
    cos, sin = rotary_caches(shape)
    weights.append(fp32(data, "cos_cache", list(cos.shape), lambda: [cos]))
    weights.append(fp32(data, "sin_cache", list(sin.shape), lambda: [sin]))

    # seqlens_k = sum(attention_mask) - 1 and total_sequence_length, as int32 for GQA.
    mask = "/model/attn_mask_reformat/attn_mask_subgraph"
    summed = node("ReduceSum", ["attention_mask", "one_1d"], f"{mask}/ReduceSum", keepdims=0)
    sub = node("Sub", [summed[0], "one_1d"], f"{mask}/Sub")
    seqlens = node("Cast", sub, f"{mask}/Sub/Cast", to=TensorProto.INT32)[0]
    mshape = node("Shape", ["attention_mask"], f"{mask}/Shape")
    total = node("Gather", [mshape[0], "one"], f"{mask}/Gather", axis=0)
    total_len = node("Cast", total, f"{mask}/Gather/Cast", to=TensorProto.INT32)[0]

    x = node("Gather", ["model.embed_tokens.weight", "input_ids"], "/model/embed_tokens/Gather")[0]
    residual, pending = x, ""  # pending: the previous layer's MLP output, not yet added
    for i in range(shape.layers):
        base = f"/model/layers.{i}"
        ln = norm_weight(f"model.layers.{i}.input_layernorm.weight")
        if pending:
            out = node(
                "SkipSimplifiedLayerNormalization",
                [pending, residual, ln],
                f"{base}/input_layernorm/SkipLayerNorm",
                n_out=4,
                epsilon=EPS,
            )
            x, residual = out[0], out[3]
        else:
            x = node(
                "SimplifiedLayerNormalization",
                [residual, ln],
                f"{base}/input_layernorm/LayerNorm",
                axis=-1,
                epsilon=EPS,
                stash_type=1,
            )[0]
        qkv = matmul(x, f"{base}/attn/qkv_proj/MatMul", h, h + 2 * kv * hd)
        attn = f"{base}/attn/GroupQueryAttention"
        gqa_inputs = [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        gqa_inputs += [seqlens, total_len, "cos_cache", "sin_cache"]
        nodes.append(
            helper.make_node(
                "GroupQueryAttention",
                gqa_inputs,
                [f"{attn}/output_0", f"present.{i}.key", f"present.{i}.value"],
                name=attn,
                domain="com.microsoft",
                num_heads=shape.heads,
                kv_num_heads=kv,
                scale=float(1 / np.sqrt(hd)),
                local_window_size=-1,
                softcap=0.0,
                do_rotary=1,
                rotary_interleaved=0,
            )
        )
        o = matmul(f"{attn}/output_0", f"{base}/attn/o_proj/MatMul", h, h)
        ln2 = norm_weight(f"model.layers.{i}.post_attention_layernorm.weight")
        out = node(
            "SkipSimplifiedLayerNormalization",
            [o, residual, ln2],
            f"{base}/post_attention_layernorm/SkipLayerNorm",
            n_out=4,
            epsilon=EPS,
        )
        x, residual = out[0], out[3]
        gate = matmul(x, f"{base}/mlp/gate_proj/MatMul", h, shape.intermediate)
        up = matmul(x, f"{base}/mlp/up_proj/MatMul", h, shape.intermediate)
        sig = node("Sigmoid", [gate], f"{base}/mlp/act_fn/Sigmoid")[0]
        act = node("Mul", [gate, sig], f"{base}/mlp/act_fn/Mul")[0]
        prod = node("Mul", [act, up], f"{base}/mlp/Mul")[0]
        pending = matmul(prod, f"{base}/mlp/down_proj/MatMul", shape.intermediate, h)

    final = norm_weight(f"model.layers.{shape.layers}.final_norm_layernorm.weight")
    out = node(
        "SkipSimplifiedLayerNormalization",
        [pending, residual, final],
        f"/model/layers.{shape.layers}/final_norm_layernorm/SkipLayerNorm",
        n_out=4,
        epsilon=EPS,
    )
    eos = special_ids(shape.vocab)["<|end|>"]
    matmul(out[0], "/lm_head/MatMul", h, shape.vocab, lm_head_row_scales(tokens, eos))

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    past: list[str | int] = ["batch_size", kv, "past_sequence_length", hd]
    present: list[str | int] = ["batch_size", kv, "total_sequence_length", hd]
    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info(
            "attention_mask", i64, ["batch_size", "total_sequence_length"]
        ),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", f32, ["batch_size", "sequence_length", shape.vocab])
    ]
    for i in range(shape.layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", f32, past))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", f32, present))
    constants = [
        helper.make_tensor("one_1d", i64, [1], [1]),
        helper.make_tensor("one", i64, [], [1]),
    ]
    graph = helper.make_graph(nodes, "main_graph", inputs, outputs, weights + constants)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="phi3-chat make_model")
    model.ir_version = 10
    return model


MS_OPS = {"SkipSimplifiedLayerNormalization", "MatMulNBits", "GroupQueryAttention"}


# ---------------------------------------------------------------- config and main


def genai_config(shape: Shape) -> dict[str, Any]:
    ids = special_ids(shape.vocab)
    return {
        "model": {
            "bos_token_id": 1,
            "context_length": shape.context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": FILENAME,
                "head_size": shape.head_size,
                "hidden_size": shape.hidden,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": shape.heads,
                "num_hidden_layers": shape.layers,
                "num_key_value_heads": shape.kv_heads,
            },
            "eos_token_id": [ids["<|endoftext|>"], ids["<|assistant|>"], ids["<|end|>"]],
            "pad_token_id": ids["<|endoftext|>"],
            "type": "phi3",
            "vocab_size": shape.vocab,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": shape.context,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": True,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }


def make_model(shape: Shape, out: Path, seed: int = 0, graph_only: bool = False) -> int:
    """Write the model folder; returns the size of the weights file (written or not)."""
    out.mkdir(parents=True, exist_ok=True)
    tokens = write_tokenizer(out, shape.vocab)
    dump_json(out / "genai_config.json", genai_config(shape))
    data_path = out / f"{FILENAME}.data"
    if graph_only:
        data_path.unlink(missing_ok=True)
    # Written under a temporary name: an interrupted run never leaves a plausible weights file.
    partial = data_path.with_name(data_path.name + ".partial")
    data = DataFile(None if graph_only else partial, data_path.name, seed)
    try:
        model = build_graph(shape, data, tokens)
    finally:
        data.close()
    onnx.save_model(model, out / FILENAME)
    if not graph_only:
        partial.replace(data_path)
    return data.offset


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Shape]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--out", type=Path, required=True, help="folder to write (created)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--graph-only", action="store_true", help="skip the weights file")
    for flag, field in FLAGS.items():
        p.add_argument(flag, type=int, dest=field, help=f"override the preset's {field}")
    args = p.parse_args(argv)
    shape = replace(
        PRESETS[args.preset],
        **{f: getattr(args, f) for f in FLAGS.values() if getattr(args, f) is not None},
    )
    if shape.hidden % shape.heads or shape.heads % shape.kv_heads or shape.head_size % 2:
        p.error("heads must divide hidden size, kv-heads must divide heads, head size even")
    if shape.vocab < MIN_VOCAB:
        p.error(f"--vocab-size must be at least {MIN_VOCAB} (3 + 256 bytes + Phi-3's specials)")
    if shape.hidden % BLOCK or shape.intermediate % BLOCK:
        p.error(f"hidden and intermediate sizes must be multiples of {BLOCK}")
    return args, shape


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
    args, shape = parse_args(argv)
    began = time.perf_counter()
    size = make_model(shape, args.out, args.seed, args.graph_only)
    took = time.perf_counter() - began
    what = "graph only, weights file would be" if args.graph_only else "weights file"
    print(f"wrote {args.out} ({args.preset}: {shape}; {what} {size:,} bytes) in {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
