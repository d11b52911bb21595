"""Building and bounding prompts: the chat template without forged role markers, fitted to the
context (builder.py), the pieces of recent prompts kept encoded (memo.py), the cheap bound on
a prompt's tokens (token_bound.py), all of it run off the step loop (process.py)."""
