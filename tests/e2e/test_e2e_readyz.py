"""The app's GET /readyz (App Service's health check path) in front of the real sidecar on the
tiny model: 503 while the model loads and while a dead worker is replaced, 200 once a chat can
be served. The sidecar's loads are held by a gate (tests/support/engines.py, `gated`), so each
state lasts as long as the test looks at it."""

from __future__ import annotations

from pathlib import Path

import httpx

from scripts.run import services
from tests.e2e import live
from tests.e2e.conftest import AppFactory
from tests.support.engines import EXIT, gated, open_gate


def readyz(app: services.Service) -> httpx.Response:
    return httpx.get(app.url + "/readyz", timeout=10)


def not_ready_type(app: services.Service) -> str:
    response = readyz(app)
    assert response.status_code == 503, response.text
    assert int(response.headers["Retry-After"]) >= 1
    error = response.json()["error"]
    assert set(error) == {"message", "type"}
    return str(error["type"])


def test_readyz_is_503_while_the_model_loads_or_restarts_and_200_when_it_serves(
    tiny_model_dir: Path, tmp_path: Path, start_app: AppFactory
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    hello = [{"role": "user", "content": "Hello"}]
    with (
        services.sidecar(tiny_model_dir, tmp_path / "sc.log", wait=False, env=gated(gate)) as sc,
        start_app(sc.url) as app,
    ):
        services.wait_for(sc.url + "/healthz", sc.process, sc.log_path, 60)
        # First start: the worker is held before its model loads.
        assert not_ready_type(app) == "loading"
        health = httpx.get(app.url + "/healthz", timeout=10)
        assert health.status_code == 200 and health.json()["sidecar"]["ready"] is False
        open_gate(gate, 1)
        services.wait_for(app.url + "/readyz", app.process, app.log_path, 60)
        assert readyz(app).json() == {"status": "ready", "model": sc_model(sc)}
        assert live.chat(app.url, hello)[-1]["done"] is True

        # The worker dies mid-reply; its replacement is held before it loads.
        broken = live.chat(app.url, [{"role": "user", "content": f"{EXIT} go"}])
        assert broken[-1]["error"]["type"] == "upstream_disconnected"
        live.wait_until(lambda: readyz(app).status_code == 503, 60, "readyz to turn 503")
        assert not_ready_type(app) in ("restarting", "loading")
        open_gate(gate, 2)
        services.wait_for(app.url + "/readyz", app.process, app.log_path, 60)
        assert live.chat(app.url, hello)[-1]["done"] is True


def sc_model(sidecar: services.Service) -> str | None:
    """The model name the sidecar's own /readyz gives (what the app's /readyz passes on)."""
    name = httpx.get(sidecar.url + "/readyz", timeout=10).json().get("model")
    return name.strip()[:100] if isinstance(name, str) and name.strip() else None
