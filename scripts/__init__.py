"""phi3-chat's command-line scripts and the library code they share (installed editable by
`make venv` as part of the phi3-chat-dev package, so `from scripts import services` works
from anywhere)."""
