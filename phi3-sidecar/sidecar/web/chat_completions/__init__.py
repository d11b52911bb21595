"""POST /v1/chat/completions (and GET /v1/models), OpenAI's Chat Completions API: the route and
its reply formats (api.py), the body (schemas.py), its structured-output fields (tools.py), the
text protocol for tool calls (tool_protocol.py), llama.cpp's server fields (llamacpp_fields.py),
and log probabilities as OpenAI's APIs write them (logprobs.py, /v1/completions' too)."""
