"""The passages' vectors and keywords, behind one interface (search_index.py) over each
engine's: SQLite's sqlite-vec and FTS5 (sqlite.py), PostgreSQL's pgvector and tsvector
(postgres.py); the encoder's width the vectors were made with (vector_space.py); the keyword
query a question becomes and the fusion of rankings (ranking.py).
"""
