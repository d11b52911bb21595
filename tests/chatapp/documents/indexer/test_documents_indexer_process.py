"""The indexer process under gunicorn, supervised (issue 58): killed as the OOM killer kills
(SIGKILL), a new one runs within seconds, says so in a log line and a metric, and takes the
document the dead one was reading over at once; before, nothing started it again until a web
worker happened to exit (85 s and more with uploads queued)."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatapp.documents.indexer import supervisor as indexer_process
from chatapp.documents.models import Document
from chatapp.store import Store
from scripts.run import services
from tests.chatapp.documents import make_files
from tests.sidecar.support import metrics

ALICE = {"X-MS-CLIENT-PRINCIPAL-ID": "alice-oid", "X-MS-CLIENT-PRINCIPAL-NAME": "Alice"}


def lines(app: services.Service, message: str) -> list[dict[str, Any]]:
    found = []
    for line in app.log_lines():
        if line.startswith("{"):
            data = json.loads(line)
            if data.get("msg") == message:
                found.append(data)
    return found


def wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise TimeoutError(what)


def test_a_killed_indexer_is_started_again_and_resumes_its_document(
    encoder_sidecar: services.Service, tiny_encoder_dir: Path, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    with services.chatapp(
        encoder_sidecar.url,
        tmp_path / "chatapp.log",
        DATA_DIR=str(data_dir),
        AUTH_MODE="appservice",
        EMBED_MODEL="tiny",
        EMBED_TOKENIZER=str(tiny_encoder_dir),
        EMBED_MAX_TOKENS="32",
    ) as app:
        first = wait_for(lambda: lines(app, "indexer started"), 30, "no indexer")[0]
        upload = httpx.post(
            app.url + "/api/documents",
            files={"file": ("slow.docx", make_files.slow_note_docx())},
            headers=ALICE,
            timeout=30,
        )
        assert upload.status_code == 202, upload.text
        document_id = upload.json()["documents"][0]["id"]

        def status() -> str:
            response = httpx.get(f"{app.url}/api/documents/{document_id}", headers=ALICE)
            return str(response.json()["status"])

        wait_for(lambda: status() == "reading", 30, "never read")
        time.sleep(0.5)  # into the reading (about 5 s of it)
        os.kill(first["pid"], signal.SIGKILL)
        killed = time.monotonic()
        second = wait_for(lambda: lines(app, "indexer started")[1:], 10, "not started again")[0]
        assert time.monotonic() - killed < 10
        assert second["pid"] != first["pid"] and second["taken_over"] == 1
        (exited,) = lines(app, "indexer exited")
        assert (exited["cause"], exited["pid"]) == ("killed", first["pid"])
        # Named when the watcher read the status before gunicorn's master reaped the process.
        assert exited["signal"] in ("SIGKILL", "unknown")
        assert metrics(app.url)['chatapp_indexer_restarts_total{cause="killed"}'] == 1
        wait_for(lambda: status() == "ready", 60, "not resumed")
    store = Store.open(f"sqlite:///{data_dir / 'chatapp.db'}")
    with store.session() as session:
        document = session.get(Document, document_id)
        assert document is not None and document.attempts == 2  # the killed claim, and this
    store.close()


def test_the_supervisor_names_how_its_indexer_ended_and_starts_another(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Outside gunicorn (no other reaper): a SIGKILL is named; a process that fails to start
    says its exit code, and the next start waits longer (back-off)."""
    caplog.set_level(logging.INFO, logger="chatapp.start")
    environ = {
        **os.environ,
        "DOCUMENT_INDEXER": "process",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'chatapp.db'}",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }
    supervisor = indexer_process.Supervisor(environ)
    supervisor.start()
    try:
        first = supervisor.process
        assert first is not None
        time.sleep(0.5)
        first.send_signal(signal.SIGKILL)
        wait_for(lambda: supervisor.process is not first, 10, "not started again")
        exited = [r for r in caplog.records if r.getMessage() == "indexer exited"]
        fields = exited[0].fields  # type: ignore[attr-defined]
        assert (fields["cause"], fields["signal"]) == ("killed", "SIGKILL")
        assert fields["pid"] == first.pid
    finally:
        supervisor.stop()
    assert supervisor.process is not None and supervisor.process.poll() is not None
    broken = indexer_process.Supervisor({**environ, "DOCUMENT_READ_MEMORY_MB": "1"})  # refused
    broken.start()
    try:
        wait_for(
            lambda: [r for r in caplog.records if r.getMessage() == "indexer exited"][1:],
            30,
            "a broken start not seen",
        )
    finally:
        broken.stop()
    ended = [r for r in caplog.records if r.getMessage() == "indexer exited"][1]
    fields = ended.fields  # type: ignore[attr-defined]
    assert (fields["cause"], fields["exit_code"]) == ("exited", 1)
    assert fields["restart_in_s"] >= 1
