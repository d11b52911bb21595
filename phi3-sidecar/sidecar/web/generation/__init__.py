"""The request path every generation route shares: the rules of their bodies (messages.py), the
pipeline (pipeline.py: the body, readiness, a FIFO slot from admission.py, the worker's start),
the web process's side of the model worker (model_client.py), the reply written as it comes
(reply.py) and a stream started before its reply (early_start.py)."""
