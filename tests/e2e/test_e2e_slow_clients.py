"""Slow and idle clients cannot take the chat app offline (gunicorn's gevent worker): with 200
connections that stall mid-headers or send a byte a second, /healthz and a chat are answered
within 2 s, and the slow connections are closed after a bounded time (the headers deadline)."""

from __future__ import annotations

from scripts import measure_slow_clients, services


def test_two_hundred_slow_clients(live_app: services.Service) -> None:
    result = measure_slow_clients.measure(live_app.url, idle=150, drip=50, seconds=10)
    assert result.health_failures == 0 and result.health_ms
    assert max(result.health_ms) < 2000
    assert result.chat_s is not None and result.chat_s < 2
    assert result.still_open == 0  # every slow connection was closed by the server
    assert len(result.held_s) == 200 and max(result.held_s) < 15
