"""llama-server, built by `make peers`: a test that needs it fails on CI (CI=true, where .ci/run
builds it) and is skipped elsewhere when it is missing."""

from __future__ import annotations

import os

import pytest

from scripts.bench.peers import llamacpp


@pytest.fixture(scope="module")
def llama_server_built() -> None:
    if llamacpp.server_binary().exists():
        return
    message = f"{llamacpp.server_binary()} is not built: run `make peers`"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " (CI=true: .ci/run builds it)", pytrace=False)
    pytest.skip(message)
