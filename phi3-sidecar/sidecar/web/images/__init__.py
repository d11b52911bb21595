"""Images in requests: data URLs checked, decoded and re-encoded as PNG (decoding.py), within
the web process's bound on the memory they take (memory.py)."""
