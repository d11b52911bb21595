"""The token list in id order: <unk> <s> </s>, 256 byte tokens, BPE merges, Phi-3's specials.

Merges are learnt from a small built-in corpus, deterministically, so the same vocabulary size
always gives the same tokens.
"""

from __future__ import annotations

import itertools

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


def special_ids(vocab: int) -> dict[str, int]:
    start = 32000 if vocab == PHI3_VOCAB else vocab - len(SPECIALS)
    return {tok: start + i for i, tok in enumerate(SPECIALS)}


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
