"""Speech to text (POST /v1/audio/transcriptions, `input_audio` parts): a Whisper model in
CTranslate2's form run by faster-whisper in a thread of the web process at a lower CPU priority,
beside the chat model's worker (ARCHITECTURE.md, "Speech"). CTranslate2 releases the GIL while it
computes, so the event loop goes on meanwhile. Nothing here imports sidecar.web, nor
faster-whisper, CTranslate2 or PyAV at import time: they load with the model, when one is set."""
