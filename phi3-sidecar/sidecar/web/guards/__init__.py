"""What bounds the clients before any route: who may talk to the sidecar (access.py), the
connection cap and the HTTP protocol that keeps it (connections.py), deadlines for reading a
request (deadlines.py), the listening socket and the open-files limit (listener.py)."""
