"""The pieces of scripts/models/make_model.py (the command line and the public names), by concern.

    vocab      the token list: byte tokens, BPE merges learnt from a small corpus, specials
    config     Shape and its presets, genai_config.json, the prompts with known replies
    tokenizer  tokenizer.json and its companion files, with Phi-3's chat template
    weights    the external data file, random int4 matrices, the LM head's token scales
    graph      the ONNX graph of the official Phi-3 int4 CPU model, at any shape
    vision     a tiny phi3v folder: that decoder reading embeddings, embedding and vision graphs

Each imports only from the ones listed above it.
"""
