"""GPU tests: skipped unless CuPy imports and sees a CUDA device; their kernels are built side by side first.

``RNSTENSOR_CUPY_STANDIN=1 python -m pytest tests/gpu`` is a dry run on a
machine without a GPU: CuPy is replaced by tests/cupy_standin.py, whose
launches run host builds of the kernels. It checks the tests and the
backend's calls before a GPU session spends device time on them; the
device code itself runs only on a GPU.
"""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rnstensor.kernels import cache_dir

STANDIN = os.environ.get("RNSTENSOR_CUPY_STANDIN") == "1"
if STANDIN:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import cupy_standin

    cupy_standin.install(Path(tempfile.mkdtemp(prefix="rnstensor-standin-")), cache_dir(), device_arrays_are_cupy=True,
                         simt_max_macs=1 << 24)

from rnstensor.backends.cuda import cuda_available  # noqa: E402  (after the stand-in, if any)

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


def _warm_cpu_backend() -> None:
    """JIT-compile the CPU backend's numba kernels that the references use (tens of seconds when cold)."""
    import numpy as np

    import rnstensor as rt
    from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

    rng = np.random.default_rng(0)
    plan = rt.plan_chain([rng.uniform(-1, 1, (4, 4)) for _ in range(3)], [0, 1, 2])
    for decode in ("fp64", "exact"):
        plan.run(rng.uniform(-1, 1, (2, 4, 4, 4)), decode, backend="cpu")
    a, b = rng.standard_normal((5, 7)), rng.standard_normal((7, 3))
    rt.dgemm(a, b, backend="cpu")
    rt.zgemm(a + 1j * a, b - 1j * b, backend="cpu")
    basis = TensorBasis(2)
    mesh = box_mesh(basis, shape=(1, 1, 1), curved=0.1)
    u = rng.standard_normal((mesh.nelem, 2, 2, 2))
    MassOperator(basis, mesh.qdata, backend="cpu").apply(u)
    PoissonOperator(basis, mesh.G, backend="cpu").apply(u)


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
    import threading

    from rnstensor.backends import get_backend

    modules = dict.fromkeys(item.module for item in request.session.items if _in_gpu_dir(item))
    programs = [p for m in modules if hasattr(m, "spec_programs") for p in m.spec_programs()]
    backend = get_backend("cuda")
    result: dict = {}

    def build() -> None:
        try:
            result["builds"] = backend.prebuild(programs)
        except Exception as exc:  # noqa: BLE001 - reported below; each test that needs the build fails on its own
            result["error"] = f"{type(exc).__name__}: {exc}"

    t0 = time.perf_counter()
    # pytest-xdist workers (device_check.sh runs one per test module): the first to take the lock builds,
    # the others then find every build in the disk cache
    build_dir = cache_dir()
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "prebuild.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        worker = threading.Thread(target=build)
        worker.start()
        _warm_cpu_backend()
        t_cpu = time.perf_counter() - t0
        worker.join()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:  # past the capture: device_check.sh's log shows the time
        what = (f"{result['builds']} kernel builds" if "builds" in result
                else f"kernel prebuild FAILED ({result['error']})")
        took = f"{time.perf_counter() - t0:.1f} s (CPU backend warm in {t_cpu:.1f} s)"
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"[tests/gpu] {what}; {took}")
