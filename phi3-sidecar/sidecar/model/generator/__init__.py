"""onnxruntime-genai's Generator path: its Model and a Generator per reply (path.py), one
reply stepped on it (generation.py), its KV reserved against the bound (memory.py) and its
prompt-lookup drafts (drafts.py)."""
