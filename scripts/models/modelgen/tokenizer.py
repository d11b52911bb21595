"""The tokenizer files: tokenizer.json, tokenizer_config.json (with Phi-3's chat template),
special_tokens_map.json and added_tokens.json, for the vocabulary from `vocab`."""

from __future__ import annotations

import json
from pathlib import Path

from scripts.models.modelgen.config import dump_json
from scripts.models.modelgen.vocab import SPECIALS, build_vocab, special_ids

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)


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
