"""Tiny random Hugging Face models of the families onnxruntime-genai serves, made offline.

    families   each family's facts: its transformers config, special tokens, end-of-turn ids,
               BOS handling and its published chat template (templates/*.jinja)
    tokenizer  tokenizer.json made with the `tokenizers` package: byte-level BPE (Llama 3,
               Qwen2) or SentencePiece-style BPE with byte fallback (Phi-3, Mistral, Gemma)
    model      the Hugging Face folder: config, random weights from a seed, tokenizer files

scripts/models/make_hf_model.py is the command; scripts/models/export_model.py turns such a
folder (or any real one) into an onnxruntime-genai folder with the official builder.
"""
