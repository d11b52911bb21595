"""The web process: FastAPI on uvicorn. It validates requests, queues them, and relays the
model worker's pieces of text to the clients; it never imports model code (see ipc.py)."""
