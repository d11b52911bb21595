"""Chats kept on the server, per user (issue 43).

- `api`: the HTTP contract, `GET/POST /api/chats`, `GET/PATCH/DELETE /api/chats/<id>` and
  `GET /api/me` (who is signed in, and whether the server keeps chats: the page asks).
- `convert`: a stored message as JSON, and a message from a client (an import) checked.
- `turns`: `POST /chat` with a `chat_id`: the prompt built from the stored turns, the reply
  stored when it ends.

Every route asks `chatapp.accounts.current_user()` first and queries through
`chatapp.store.chats`, which filters by owner: another user's chat id is a 404 everywhere.
"""
