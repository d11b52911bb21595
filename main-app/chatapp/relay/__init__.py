"""The relay: `POST /chat` (chat.py) forwards a conversation to the model service and streams
the reply back to the browser (stream.py: the response body, its lines, heartbeats and limits).

The browser's side: its wire format (wire.py: the request, the NDJSON lines, control
characters) and the images a chat carries (images.py). The model service's side: one interface
(upstream.py: the connection and the events every reply becomes), spoken as our sidecar's
`POST /predict` (upstream_predict.py) or any OpenAI-compatible server's
`POST /v1/chat/completions` (upstream_openai.py), picked by UPSTREAM_API; and a reply the model
service keeps queued, read as a stream with heartbeats (pending.py). The chat models it lists,
read from either API's `GET /v1/models` (upstream_models.py), are the page's to pick from at
`GET /api/models` (model_list.py); a chat names one as `model`.
"""
