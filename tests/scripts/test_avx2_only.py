"""scripts/run/avx2_only: the suite's exactness tests as on an AVX2-only CPU, on every machine
that offers CPUID faulting. This machine's CPU decides which form of each property its own run
checks (tests/support/kernels.py); here the other form is checked too, so that a change that
breaks it is seen before a CI machine without AVX-512 sees it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scripts.run import avx2_only
from tests.support.kernels import REPO_ROOT


@pytest.fixture(scope="module")
def avx2_env() -> dict[str, str]:
    try:
        return avx2_only.env()
    except avx2_only.Unavailable as why:
        pytest.skip(f"cannot hide AVX-512 here: {why}")


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900
    )


def test_the_kernel_probe_sees_an_avx2_only_cpu(avx2_env: dict[str, str]) -> None:
    probe = "from tests.support.kernels import rows_exact_in_batches as r; print(r())"
    answer = run(avx2_env, "-c", probe)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() == "False"  # the one-row kernel's own order of sums


def test_the_batch_and_cache_exactness_tests_pass_on_avx2(avx2_env: dict[str, str]) -> None:
    tests = [
        "tests/sidecar/model/batch/test_sidecar_batch.py",
        # a draft: several positions a call
        "tests/sidecar/model/batch/test_sidecar_batch_drafts.py",
        "tests/sidecar/model/kv/test_sidecar_prompt_cache.py::test_a_continued_conversation_reads_only_what_is_new",
        "tests/sidecar/model/kv/test_sidecar_prompt_cache.py::test_two_interleaved_conversations_keep_their_own_caches",
    ]
    answer = run(avx2_env, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *tests)
    assert answer.returncode == 0, answer.stdout[-4000:] + answer.stderr[-2000:]
    assert " passed" in answer.stdout.splitlines()[-1]
