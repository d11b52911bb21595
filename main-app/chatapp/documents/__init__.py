"""Documents: a person's library of files, read into passages the chat can cite.

One package per part of the way: `reading/` (a file's bytes to passages, in a reader process),
`index/` (the passages' vectors and keywords, per engine behind one interface), `search/`
(searching a library, grounding a chat in it, checking its citations) and `indexer/` (the
claims, the indexer's loop, the process gunicorn's master keeps running). Beside them: the
tables (`models.py`), the library's operations, each by owner (`library.py`), its routes
(`routes.py`, whose library: `owner.py`), a document's shown name (`names.py`), the encoder's
client (`embedder.py`), what the app keeps (`service.py`) and the indexer process's entry
(`__main__.py`: `python -m chatapp.documents`).

Reading a file is three steps, none of which touches the network or the database:

- `reading.formats.read(data, name, mime, limits)` picks the parser by the file's name, type
  and first bytes and returns its `Block`s (headings, text, tables, with page numbers where the
  format has pages); a file it cannot read raises `Refused(code, message)`, one per-file reason
  (`REFUSALS`), never an empty result;
- `reading.chunker.chunk(blocks, tokens, max_tokens)` cuts the blocks into passages of at most
  `max_tokens` tokens of the encoder, counted with its own tokenizer (`reading/tokens.py`),
  each carrying its heading path and page;
- `search.citations.check(reply, passages)` reads a reply's `[n]` marks against the passages
  the turn was given.
"""
