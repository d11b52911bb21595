"""No chat runs into App Service's 230 s front-end cut unnoticed: the real pair, with the
sidecar's engine slowed to 50 ms a token (tests/support/engines.py `paced()`) and one-second
limits instead of the defaults (RELAY_TIME_LIMIT 220 s in the app, REPLY_TIME_LIMIT_S 210 s in
the sidecar). Counted, not timed: the 1000 tokens asked for would take 50 s."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.models.make_model import LONG_PROMPT
from scripts.run import services
from tests.e2e.conftest import AppFactory
from tests.e2e.live import chat, chat_logs, request_logs, text_of, wait_until
from tests.support.engines import paced

MESSAGES = [{"role": "user", "content": LONG_PROMPT}]


@pytest.fixture(scope="module")
def slow_sidecar(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """No time limit of its own: the relay's limit is the one that ends the chat."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-slow.log"
    with services.sidecar(tiny_model_dir, log, REPLY_TIME_LIMIT_S="0", env=paced(0.05)) as sidecar:
        yield sidecar


def test_the_relay_ends_a_chat_at_its_limit_with_an_error_line(
    slow_sidecar: services.Service, start_app: AppFactory
) -> None:
    with start_app(slow_sidecar.url, RELAY_TIME_LIMIT="1") as app:
        objs = chat(app.url, MESSAGES, max_new_tokens=1000)
        assert text_of(objs)  # the part written before the limit reached the page
        last = objs[-1]
        assert last["error"]["type"] == "reply_time_limit"
        assert "longer than" in last["error"]["message"]
        assert not any("done" in obj for obj in objs)
        wait_until(lambda: chat_logs(app), 10, "the app's log line")
        (record,) = chat_logs(app)
        assert record["outcome"] == "reply_time_limit"
    # The relay hung up, so the sidecar stopped generating for nobody.
    wait_until(lambda: request_logs(slow_sidecar), 10, "the sidecar's log line")
    (line,) = request_logs(slow_sidecar)
    assert line["request_id"] == record["request_id"]
    assert line["outcome"] == "cancelled" and line["generated_tokens"] < 1000


def test_the_sidecars_own_limit_ends_the_reply_first_as_a_normal_end(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, start_app: AppFactory
) -> None:
    """The defaults' order (sidecar before relay): the page gets a complete, shortened reply."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-limited.log"
    with (
        services.sidecar(tiny_model_dir, log, REPLY_TIME_LIMIT_S="1", env=paced(0.05)) as sidecar,
        start_app(sidecar.url, RELAY_TIME_LIMIT="30") as app,
    ):
        objs = chat(app.url, MESSAGES, max_new_tokens=1000)
        done = objs[-1]
        assert done["done"] is True and done["finish_reason"] == "length"
        assert 0 < done["tokens"] < 1000
        wait_until(lambda: request_logs(sidecar), 10, "the sidecar's log line")
        (line,) = request_logs(sidecar)
        assert line["outcome"] == "time_limit"
