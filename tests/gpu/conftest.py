"""GPU tests: they run where CuPy sees a CUDA device; their kernels are built side by side first.

``RNSTENSOR_CUPY_STANDIN=1 python -m pytest tests/gpu`` is a dry run on a
machine without a GPU (CI runs it): CuPy is replaced by the strict
tests/cupy_standin.py (CuPy's rules: no implicit host conversion), whose
launches run host builds of the kernels. It checks the tests and the
backend's calls before a GPU session spends device time on them; the
device code itself runs only on a GPU.

Without CuPy or a device the tests are skipped, except on a machine that
has an NVIDIA GPU (``/proc/driver/nvidia/gpus`` lists one) or where
``RNSTENSOR_REQUIRE_GPU=1`` (device_check.sh sets it): there a CuPy that
does not import or sees no device fails every test with its message.
``RNSTENSOR_REQUIRE_GPU=0`` lets such a machine skip them.

``-m "not slow"`` leaves out the large-batch tests (thousands of tensors
per launch), which the dry run in CI does not need.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

import pytest

from rnstensor.kernels import cache_dir

STANDIN = os.environ.get("RNSTENSOR_CUPY_STANDIN") == "1"
if STANDIN:  # (already there if tests/standin/sitecustomize.py installed it in this process)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import cupy_standin

    cupy_standin.install_for_process()

from cuda_support import gpu_required  # noqa: E402
from rnstensor.backends.cuda import cuda_unavailable_reason  # noqa: E402  (after the stand-in, if any)

WHY_NOT = cuda_unavailable_reason()
HAVE_GPU = WHY_NOT is None


REQUIRED = not HAVE_GPU and gpu_required()


def _in_gpu_dir(item) -> bool:
    return "tests/gpu/" in str(item.fspath).replace("\\", "/")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: large batches (thousands of tensors a launch); the CI dry run leaves them out")


def pytest_collection_modifyitems(config, items):
    if HAVE_GPU or REQUIRED:  # REQUIRED: each test fails in its set-up (pytest_runtest_setup)
        return
    skip = pytest.mark.skip(reason=f"no CUDA device ({WHY_NOT}): CuPy and a GPU are needed (pip install 'rnstensor[gpu]')")
    for item in items:
        if _in_gpu_dir(item):
            item.add_marker(skip)


def pytest_runtest_setup(item):
    if REQUIRED and _in_gpu_dir(item):
        pytest.fail(f"this machine has a GPU (or RNSTENSOR_REQUIRE_GPU=1) but CUDA is unusable: {WHY_NOT}", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _kernels_built_side_by_side(request):
    """Compile every module and every fused program the selected tests load, in parallel, before the first test.

    One after the other, the 20-odd per-program builds of the fused kernel
    take minutes of NVRTC; a test module lists its programs in a
    ``spec_programs()`` function. Meanwhile this process JIT-compiles the
    CPU backend the references run on. A failed build is reported here and
    left to the tests that load it.
    """
    if not HAVE_GPU:
        return
    from prebuild import build_side_by_side, module_programs

    items = [item for item in request.session.items if _in_gpu_dir(item)]
    modules = dict.fromkeys(item.module for item in items)
    slow = {item.module for item in items if item.get_closest_marker("slow")}
    # pytest-xdist workers or one process per module (device_check.sh): the first to take the lock builds,
    # the others then find every build in the disk cache
    build_dir = cache_dir()
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "prebuild.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result, took, t_cpu = build_side_by_side(module_programs(modules, slow))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:  # past the capture: device_check.sh's log shows the time
        what = (f"{result['builds']} kernel builds" if "builds" in result
                else f"kernel prebuild FAILED ({result['error']})")
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"[tests/gpu] {what}; {took:.1f} s (CPU backend warm in {t_cpu:.1f} s)")
