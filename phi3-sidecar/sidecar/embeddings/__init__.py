"""Embeddings (POST /v1/embeddings): a small ONNX encoder run in the web process, beside the
chat model's worker (ARCHITECTURE.md, "Embeddings"). Nothing here imports sidecar.web, nor
onnxruntime, tokenizers or numpy at import time: they load with the encoder, when one is set."""
