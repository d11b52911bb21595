"""POST /v1/completions, OpenAI's (legacy) Completions API: a plain prompt, no chat template
(api.py)."""
