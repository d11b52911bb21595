"""The indexer, outside any request: the claims on documents, owners in turn, under a lease
(claims.py); one indexer's loop, claim, read, embed, write (worker.py); and, under gunicorn,
the master's thread that keeps the indexer process (`python -m chatapp.documents`) running
(supervisor.py).

gunicorn's master imports supervisor.py before its workers patch anything: this package's
`__init__` imports nothing.
"""
