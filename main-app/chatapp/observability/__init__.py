"""What the app tells about itself: JSON log lines and each chat's record (logs.py), /metrics
(metrics.py; gunicorn_metrics.py, the master's hooks for the folder every worker writes its
numbers into) and traces where a destination is set (telemetry.py).

gunicorn's master imports gunicorn_metrics.py before its workers patch the standard library:
this package's `__init__` imports nothing.
"""
