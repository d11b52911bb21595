"""POST /v1/embeddings, OpenAI's Embeddings API, on the encoder of sidecar/embeddings/ (api.py)."""
