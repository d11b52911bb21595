"""The tests' PostgreSQL: scripts/run/postgres.py (the benchmarks start it the same way)."""

from scripts.run.postgres import fresh_database, start

__all__ = ["fresh_database", "start"]
