"""The container tests' own rules, checked without podman: a machine without podman fails the
container tests on CI and skips them elsewhere; image builds use the public index."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.containers import podman


def test_missing_podman_fails_on_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(podman.shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"podman is not installed.*CI=true"):
        podman.require_podman()
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match=r"scripts/run/setup_podman\.sh"):
        podman.require_podman()


def test_builds_use_the_public_index_and_the_hosts_ca_bundle(tmp_path: Path) -> None:
    text = podman.pip_config(tmp_path).read_text()
    assert "index-url = https://pypi.org/simple" in text
    assert "cert = /etc/ssl/certs/ca-certificates.crt" in text
    assert "find-links" not in text and "extra-index-url" not in text
