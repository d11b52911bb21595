"""Speech: the page's microphone (static/microphone.js) sends a recording to `POST
/api/transcribe` (routes.py), which relays it to the model service's transcription route
(relay/upstream_speech.py) and answers its text. Nothing of the audio or its text is logged
or stored: the recording is held in memory for the request only (docs/speech.md)."""
