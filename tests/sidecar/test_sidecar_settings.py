"""Settings: read once from the environment into one typed object; bad values fail clearly.
Also the two process-level promises: telemetry off before onnxruntime-genai is imported, and
the web process never imports it at all."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from sidecar.settings import Settings
from sidecar.web.app import create_app

REPO = Path(__file__).resolve().parents[2]
NAMES = [name.upper() for name in Settings.model_fields]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_defaults(clean_env: pytest.MonkeyPatch) -> None:
    settings = Settings()
    assert (settings.host, settings.port) == ("0.0.0.0", 8000)
    assert settings.max_length is None  # the model's context length
    assert (settings.max_concurrency, settings.queue_size) == (4, 8)
    assert settings.prefill_chunk == 64
    assert settings.max_new_tokens == 1024
    assert settings.max_body_bytes == 64 * 1024
    assert (settings.log_level, settings.log_prompts) == ("info", False)
    assert settings.model_download is False
    assert settings.model_repo_id == "microsoft/Phi-3-mini-4k-instruct-onnx"
    assert settings.model_subfolder == "cpu_and_mobile/cpu-int4-rtn-block-32-acc-level-4"


def test_every_setting_comes_from_its_environment_variable(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    values = {
        "MODEL_PATH": str(tmp_path),
        "HOST": "127.0.0.1",
        "PORT": "9000",
        "MAX_LENGTH": "2048",
        "MAX_NEW_TOKENS": "64",
        "NUM_THREADS": "2",
        "MAX_CONCURRENCY": "3",
        "QUEUE_SIZE": "0",
        "PREFILL_CHUNK": "16",
        "MAX_BODY_BYTES": "4096",
        "LOG_LEVEL": "DEBUG",
        "LOG_PROMPTS": "1",
        "MODEL_DOWNLOAD": "true",
        "MODEL_REPO_ID": "me/model",
        "MODEL_SUBFOLDER": "cpu",
    }
    for name, value in values.items():
        clean_env.setenv(name, value)
    settings = Settings()
    assert settings.model_path == tmp_path
    assert (settings.host, settings.port, settings.max_length) == ("127.0.0.1", 9000, 2048)
    assert (settings.max_new_tokens, settings.num_threads) == (64, 2)
    assert (settings.max_concurrency, settings.queue_size, settings.max_body_bytes) == (3, 0, 4096)
    assert settings.prefill_chunk == 16
    assert (settings.log_level, settings.log_prompts) == ("debug", True)
    assert (settings.model_download, settings.model_repo_id, settings.model_subfolder) == (
        True,
        "me/model",
        "cpu",
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PORT", "0"),
        ("PORT", "http"),
        ("MAX_LENGTH", "4"),
        ("MAX_CONCURRENCY", "0"),
        ("QUEUE_SIZE", "-1"),
        ("PREFILL_CHUNK", "0"),
        ("PREFILL_CHUNK", "15"),
        ("PREFILL_CHUNK", "131073"),
        ("PREFILL_CHUNK", "all"),
        ("MAX_BODY_BYTES", "10"),
        ("LOG_LEVEL", "verbose"),
        ("LOG_PROMPTS", "maybe"),
        ("ENGINE_FACTORY", "no colon"),
    ],
)
def test_bad_values_are_refused(clean_env: pytest.MonkeyPatch, name: str, value: str) -> None:
    clean_env.setenv(name, value)
    with pytest.raises(ValidationError):
        Settings()


@pytest.mark.parametrize("value", ["16", "131072"])
def test_prefill_chunk_bounds_are_inclusive(clean_env: pytest.MonkeyPatch, value: str) -> None:
    clean_env.setenv("PREFILL_CHUNK", value)
    assert Settings().prefill_chunk == int(value)


def test_settings_are_frozen(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError):
        Settings().port = 1


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO / "phi3-sidecar",
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_bad_setting_stops_the_service_with_a_clear_line() -> None:
    result = run_python("from sidecar.__main__ import main; main()", PORT="http")
    assert result.returncode == 2
    (line,) = [json.loads(x) for x in result.stderr.splitlines()]
    assert (line["msg"], line["setting"]) == ("invalid setting", "PORT")


@pytest.mark.parametrize("value", ["", "  ", " , ", ",,"])
def test_an_api_key_that_holds_no_key_stops_the_service(value: str) -> None:
    # It once turned authentication off without a word (issue 25).
    result = run_python("from sidecar.__main__ import main; main()", API_KEY=value)
    assert result.returncode == 2
    (line,) = [json.loads(x) for x in result.stderr.splitlines()]
    assert (line["msg"], line["setting"]) == ("invalid setting", "API_KEY")
    assert "holds no key" in line["error"] and "unset it" in line["error"]


def test_the_start_says_whether_authentication_is_on(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.web.access")
    for env, expected in (({}, "off"), ({"API_KEY": "k1, k2"}, "on")):
        for name, value in env.items():
            clean_env.setenv(name, value)
        app = create_app(Settings(model_path=tmp_path))
        with TestClient(app):  # the lifespan runs (the worker fails to load: no model here)
            pass
        (record,) = [r for r in caplog.records if r.getMessage() == "access"]
        caplog.clear()
        fields = record.fields  # type: ignore[attr-defined]
        assert fields["authentication"] == expected
        assert fields["api_keys"] == (2 if expected == "on" else 0)
        assert "k1" not in json.dumps(fields)


def test_telemetry_is_off_before_onnxruntime_genai_is_imported() -> None:
    result = run_python(
        """
        import builtins, os
        seen = {}
        real_import = builtins.__import__
        def spy(name, *args, **kwargs):
            if name == "onnxruntime_genai" and "at_import" not in seen:
                seen["at_import"] = os.environ.get("ORT_DISABLE_TELEMETRY")
            return real_import(name, *args, **kwargs)
        builtins.__import__ = spy
        import sidecar.model.engine
        print(seen["at_import"])
        """
    )
    assert result.stdout.strip() == "1", result.stderr


def test_the_web_process_never_imports_onnxruntime_genai(tiny_model_dir: Path) -> None:
    result = run_python(
        f"""
        import sys, time
        from fastapi.testclient import TestClient
        from sidecar.web.app import create_app
        from sidecar.settings import Settings

        app = create_app(Settings(model_path={str(tiny_model_dir)!r}))
        with TestClient(app, base_url="http://localhost") as client:
            while client.get("/readyz").status_code != 200:
                time.sleep(0.05)
            assert client.post("/predict", json={{"input_text": "Hi"}}).status_code == 200
        print("onnxruntime_genai" in sys.modules)
        """
    )
    assert result.stdout.strip() == "False", result.stderr


def test_max_length_and_max_new_tokens_bound_every_reply(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(model_path=tiny_model_dir, max_length=64, max_new_tokens=3)
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        deadline = time.monotonic() + 60
        while (ready := client.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert ready.json()["max_length"] == 64
        with caplog.at_level(logging.INFO, logger="sidecar.request"):
            reply = client.post("/predict", json={"input_text": "Write a long poem."})
        assert reply.status_code == 200
        (record,) = [r for r in caplog.records if r.name == "sidecar.request"]
        assert record.fields["generated_tokens"] <= 3  # type: ignore[attr-defined]
        too_long = client.post("/predict", json={"input_text": "more " * 100})
        assert too_long.status_code == 413
        assert too_long.json()["error"]["limit_tokens"] == 64


@pytest.mark.parametrize(
    ("path", "env", "name"),
    [
        ("/m/tiny", {}, "tiny"),
        # a catalog download: MODEL_PATH is its root, or the folder inside it
        ("/home/models/phi3-mini-4k-instruct-int4", {}, "phi3-mini-4k-instruct-int4"),
        (
            "/home/models/phi3-mini-4k-instruct-int4/cpu_and_mobile/"
            "cpu-int4-rtn-block-32-acc-level-4",
            {},
            "phi3-mini-4k-instruct-int4",
        ),
        ("/m/x/cpu/int4", {"model_subfolder": "cpu/int4"}, "x"),
        ("/m/tiny", {"model_name": "my-model"}, "my-model"),
    ],
)
def test_the_served_model_name(
    clean_env: pytest.MonkeyPatch, path: str, env: dict[str, str], name: str
) -> None:
    settings = Settings(model_path=Path(path), **env)  # type: ignore[arg-type]
    assert settings.served_model_name == name
