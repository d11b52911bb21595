"""Reading a file into passages: no database, no network.

`formats.read` picks the parser by the file's name, type and first bytes (parse_text.py,
parse_html.py, parse_rst.py, parse_pdf.py, parse_docx.py), each returning `Block`s or raising
`Refused` (blocks.py); `chunker.chunk` cuts them into passages of at most so many encoder
tokens (tokens.py). The indexer does both in a reader process of its own (reader.py starts
read_child.py), within a time and a memory budget.
"""
