"""What an operator sees of each request: its record (record.py), its one log line
(request_log.py), /metrics (metrics.py, with what it reads when scraped: gauges.py) and traces
(telemetry.py)."""
