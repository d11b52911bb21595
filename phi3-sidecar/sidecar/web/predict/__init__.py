"""POST /predict, the original sample's contract: its body, and the reply as plain text or NDJSON
events (api.py)."""
