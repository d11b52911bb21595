"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API. The route, its
reply and its stream of events (api.py), the body and the Chat Completions request it means
(schemas.py), the stored responses (store.py)."""
