"""Documents: a person's library of files, read into passages the chat can cite.

Reading a file is three steps, each its own module, none of which touches the network or the
database:

- `formats.read(data, name, mime, limits)` picks the parser by the file's name, type and first
  bytes and returns its `Block`s (headings, text, tables, with page numbers where the format
  has pages); a file it cannot read raises `Refused(code, message)`, one per-file reason
  (`REFUSALS`), never an empty result;
- `chunker.chunk(blocks, tokens, max_tokens)` cuts the blocks into passages of at most
  `max_tokens` tokens of the encoder, counted with its own tokenizer (`tokens.py`), each
  carrying its heading path and page;
- `citations.check(reply, passages)` reads a reply's `[n]` marks against the passages the turn
  was given.
"""
