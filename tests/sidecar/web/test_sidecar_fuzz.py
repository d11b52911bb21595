"""A property-based fuzz of the sidecar's own OpenAPI document (schemathesis): hundreds of
generated and mutated requests against the real sidecar on the tiny model, with every check
but positive_data_acceptance (see schemathesis.toml): no 5xx, no answer its document does not
describe, invalid input always refused. Bounded: a fixed seed, a fixed number of examples per
operation, replies of at most a few hundred tokens (MAX_LENGTH)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.run import services

CONFIG = Path(__file__).with_name("schemathesis.toml")
# Every check that applies to one request at a time (the stateful and access-control ones need
# links and credentials this API does not have); positive_data_acceptance: schemathesis.toml.
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
        "missing_required_header",
        "unsupported_method",
        "allow_header_conformance",
    ]
)


def failures(output: str) -> str:
    """schemathesis's FAILURES section, with its generated runs of one character shortened."""
    start, end = output.find("FAILURES"), output.find("SUMMARY")
    section = output[start:end] if start >= 0 else ""
    return re.sub(r"(.)\1{100,}", lambda m: m.group(1) * 5 + "...", section)[:8000]


def test_fuzz_finds_no_server_error_and_no_schema_violation(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    schemathesis = Path(sys.executable).with_name("schemathesis")
    if not schemathesis.exists():
        pytest.fail("schemathesis is not installed: pip install -r requirements-dev.txt")
    settings = {"MAX_LENGTH": "256", "QUEUE_SIZE": "64"}
    with services.sidecar(tiny_model_dir, tmp_path / "sidecar.log", env=settings) as sidecar:
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
                # with an encoder, in its own test: test_sidecar_embeddings_fuzz.py
                "--exclude-path",
                "/v1/embeddings",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,  # its cache (.schemathesis/) stays out of the work tree
        )
        log = sidecar.log()
    assert result.returncode == 0, failures(result.stdout) or result.stdout[-4000:] + result.stderr
    assert "Traceback" not in log
