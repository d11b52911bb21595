"""Request guards: what a request must pass before a route reads it, and what one process may
hold at once.

The Host names the app answers (host.py), a deadline on reading a body (body_deadline.py), a
bound on the large bodies (chats with images) one process holds (uploads.py), and the
open-files limit, raised in gunicorn's master at start (open_files.py: nothing here may import
more than the standard library at import, for the master's sake).
"""
