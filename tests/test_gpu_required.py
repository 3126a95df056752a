"""On a machine that must run the GPU tests, a CuPy that does not import fails them with its reason; elsewhere it skips.

A child pytest runs one GPU test with ``RNSTENSOR_REQUIRE_GPU`` set either way
(device_check.sh sets 1; a machine with an NVIDIA GPU counts as 1 unless 0).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _run_gpu_test(required: str):
    env = {k: v for k, v in os.environ.items() if k != "RNSTENSOR_CUPY_STANDIN"}
    env.update(RNSTENSOR_REQUIRE_GPU=required, PYTHONPATH=str(TESTS / "no-cupy"))  # (a folder that holds nothing)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-k", "test_einsum",
           str(TESTS / "gpu" / "test_cuda_features.py")]
    return subprocess.run(cmd, cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def no_cupy():
    try:
        import cupy  # noqa: F401
    except ImportError:
        return
    pytest.skip("CuPy is installed here: the missing-CuPy cases need a machine without it")


def test_required_gpu_without_cupy_fails_with_the_reason(no_cupy):
    res = _run_gpu_test("1")
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    assert "1 error" in out and "CUDA is unusable: CuPy does not import" in out, out[-3000:]


def test_without_a_gpu_the_tests_skip(no_cupy):
    res = _run_gpu_test("0")
    out = res.stdout + res.stderr
    # (5: pytest found nothing left to run in the skipped module alone; in the whole suite that is a pass)
    assert res.returncode in (0, 5) and "1 skipped" in out and "CuPy does not import" in out, out[-3000:]
