"""The Phi-3 sidecar: onnxruntime-genai behind a small, streaming FastAPI service."""
