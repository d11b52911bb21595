"""Connections and open files in the app (issue 38, finding 3): gunicorn raises the soft
open-files limit to the hard one at start, for itself and the workers it forks, and says whether
GUNICORN_CONNECTIONS fits (limits are set on the child process; the fake sidecar stands behind
it, nothing there needs a model); and a chat refused by the real sidecar's connection cap
reaches the page as `busy`, with a retry."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from scripts.run import services
from tests.chatapp.fake_sidecar import FakeSidecar
from tests.sidecar.support import metrics


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeSidecar]:
    with FakeSidecar() as fake:
        yield fake


def soft_limits(service: services.Service) -> list[int]:
    """The soft open-files limit of gunicorn's master and of each worker."""
    master = psutil.Process(service.process.pid)
    processes = [master, *master.children()]
    return [int(p.rlimit(psutil.RLIMIT_NOFILE)[0]) for p in processes]


def start_line(service: services.Service) -> dict[str, Any]:
    lines = [json.loads(line) for line in service.log_lines() if line.startswith("{")]
    return next(line for line in lines if line["msg"].startswith("open files"))


def test_gunicorn_raises_the_soft_limit_for_its_workers_too(
    fake: FakeSidecar, tmp_path: Path
) -> None:
    with services.chatapp(
        fake.url, tmp_path / "app.log", nofile=(256, 4096), WEB_CONCURRENCY="2"
    ) as app:
        limits = soft_limits(app)
        line = start_line(app)

    # The master, its two workers and the documents' indexer process (chatapp/documents/).
    assert limits == [4096, 4096, 4096, 4096]
    assert line["level"] == "info" and line["msg"] == "open files"
    assert (line["nofile_soft_at_start"], line["nofile_soft"], line["nofile_hard"]) == (
        256,
        4096,
        4096,
    )
    # Each of GUNICORN_CONNECTIONS' 1000 may stream a chat: its socket and the model service's.
    assert line["worker_connections"] == 1000 and line["needed"] == 2064


def test_a_limit_too_low_for_gunicorn_connections_is_a_warning(
    fake: FakeSidecar, tmp_path: Path
) -> None:
    with services.chatapp(
        fake.url, tmp_path / "app.log", nofile=(256, 256), WEB_CONCURRENCY="1"
    ) as app:
        limits = soft_limits(app)
        line = start_line(app)

    assert limits == [256, 256, 256]  # the master, its worker, the documents indexer
    assert line["level"] == "warning" and "fewer than GUNICORN_CONNECTIONS needs" in line["msg"]
    assert line["nofile_soft"] == 256 and line["fits_connections"] == 96


@pytest.mark.parametrize("upstream_api", ["predict", "openai"])
def test_a_chat_refused_by_the_sidecars_connection_cap_is_busy_with_a_retry(
    tiny_model_dir: Path, tmp_path: Path, upstream_api: str
) -> None:
    with services.sidecar(
        tiny_model_dir,
        tmp_path / "sidecar.log",
        env={"REQUEST_HEADERS_TIMEOUT_S": "60"},  # the held connection stays while the test runs
        MAX_CONNECTIONS="1",
    ) as sidecar:
        port = int(sidecar.url.rsplit(":", 1)[1])
        # The sidecar's one connection, taken before the app starts and then mid-request, so
        # that every connection of the app's is over the cap with nothing idle to close for it.
        # (Taken after, it raced a gunicorn worker's first request still on its way.)
        with (
            socket.create_connection(("127.0.0.1", port)) as held,
            services.chatapp(sidecar.url, tmp_path / "app.log", UPSTREAM_API=upstream_api) as app,
        ):
            held.sendall(b"POST /predict HTTP/1.1\r\n")
            # Admitted: /metrics, itself over the cap, counts two connections open.
            assert metrics(sidecar.url)["sidecar_open_connections"] == 2
            chat = {"messages": [{"role": "user", "content": "Hi"}]}
            response = httpx.post(app.url + "/chat", json=chat, timeout=30)

    assert response.status_code == 503, response.text
    assert response.json()["error"]["type"] == "busy"
    assert int(response.headers["retry-after"]) == 2
