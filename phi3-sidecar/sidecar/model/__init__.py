"""The model worker process: onnxruntime-genai, the tokenizer and the prompt builder, started by
the web process (ipc.WORKER_ENTRY) and driven by ipc messages; it never imports web code."""
