"""/v1/embeddings fuzzed from the sidecar's own OpenAPI document (schemathesis, as
test_sidecar_fuzz.py does for the other routes), with the tiny encoder loaded so that valid
inputs reach it: no 5xx, no answer the document does not describe, invalid input refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scripts.run import services
from tests.sidecar.web.test_sidecar_fuzz import CHECKS, CONFIG, failures


def test_fuzz_the_embeddings_route(
    tiny_model_dir: Path, tiny_encoder_dir: Path, tmp_path: Path
) -> None:
    schemathesis = Path(sys.executable).with_name("schemathesis")
    settings = {"EMBED_MODEL_PATH": str(tiny_encoder_dir)}
    with services.sidecar(tiny_model_dir, tmp_path / "sidecar.log", env=settings) as sidecar:
        services.wait_for_embeddings(sidecar)
        result = subprocess.run(
            [
                str(schemathesis),
                "--config-file",
                str(CONFIG),
                "run",
                sidecar.url + "/openapi.json",
                "--checks",
                CHECKS,
                "--max-examples",
                "300",
                "--phases",
                "examples,coverage,fuzzing",
                "--include-path",
                "/v1/embeddings",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        log = sidecar.log()
    assert result.returncode == 0, failures(result.stdout) or result.stdout[-4000:] + result.stderr
    assert "passed" in result.stdout and "Traceback" not in log
