"""GPU tests: skipped unless CuPy imports and sees a CUDA device; their kernels are built side by side first."""

from __future__ import annotations

import time

import pytest

from rnstensor.backends.cuda import cuda_available

HAVE_GPU = cuda_available()


def _in_gpu_dir(item) -> bool:
    return "tests/gpu/" in str(item.fspath).replace("\\", "/")


def pytest_collection_modifyitems(config, items):
    if HAVE_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA device: CuPy and a GPU are needed (pip install 'rnstensor[gpu]')")
    for item in items:
        if _in_gpu_dir(item):
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _kernels_built_side_by_side(request):
    """Compile every module and every fused program the selected tests load, in parallel, before the first test.

    One after the other, the 20-odd per-program builds of the fused kernel
    take minutes of NVRTC; a test module lists its programs in a
    ``spec_programs()`` function.
    """
    if not HAVE_GPU:
        return
    from rnstensor.backends import get_backend

    modules = dict.fromkeys(item.module for item in request.session.items if _in_gpu_dir(item))
    programs = [p for m in modules if hasattr(m, "spec_programs") for p in m.spec_programs()]
    t0 = time.perf_counter()
    n = get_backend("cuda").prebuild(programs)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:  # shown in -q runs too (device_check.sh reads the time)
        reporter.write_line(f"[tests/gpu] {n} kernel builds ready in {time.perf_counter() - t0:.1f} s")
