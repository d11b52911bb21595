"""Speech over HTTP: POST /v1/audio/transcriptions (api.py, its body upload.py, its replies
formats.py) and the `input_audio` parts of chat requests (parts.py), on sidecar/speech/."""
