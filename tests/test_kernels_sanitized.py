"""The SIMT host harnesses built with AddressSanitizer and UBSan: the kernels' own sources, checked for memory and UB errors.

Every kernel source that runs on CPU threads (entry.cu, product.cu,
product_wgmma.cu, chain.cu, the generic and a specialized build) runs a
selection of its bitwise tests in a child process whose fixtures build the
harnesses with ``-fsanitize=address,undefined -fno-sanitize-recover=all``
(``RNSTENSOR_SANITIZE=1``, tests/sanitize.py) and which preloads the
sanitizers' runtimes. An out-of-bounds read of a tile, a shared-memory
overrun, a signed overflow or a misaligned access aborts that child with the
sanitizer's report; the test fails with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rnstensor.kernels import build

TESTS = Path(__file__).resolve().parent

# a few cases of each harness: every kernel, both decodes, the edge paths; about 30 s in all, most of it the
# sanitized builds
SELECTION = [
    "test_kernels_entry_simt.py",
    "test_kernels_simt.py::test_product_kernel_matches_reference",
    "test_kernels_simt.py::test_product3m_kernel_matches_reference",
    "test_kernels_simt.py::test_reduce_i32_kernel",
    "test_kernels_wgmma.py::test_kernel_matches_reference",
    "test_kernels_wgmma.py::test_kernel_folds_long_contractions",
    "test_kernels_chain.py::test_fused_kernel_ignores_stale_shared_memory",
    "test_kernels_chain.py::test_fused_kernel_flags_non_finite_input",
    "test_kernels_chain.py::test_fused_poisson_operator_matches_cpu",
    "test_kernels_chain.py::test_specialized_kernel_matches_plan[0]",
]


def test_simt_harnesses_under_asan_and_ubsan(tmp_path):
    try:
        preload = build.sanitizer_preload()
    except build.KernelBuildError as exc:  # pragma: no cover - Debian's g++ ships both runtimes
        pytest.skip(f"no sanitizer runtimes: {exc}")
    env = dict(os.environ, RNSTENSOR_SANITIZE="1", LD_PRELOAD=preload,
               # Python's own allocations are not ours to judge; the first report ends the run
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1", UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
               RNSTENSOR_KERNEL_CACHE=str(tmp_path / "kernels"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
           *[str(TESTS / s) for s in SELECTION]]
    res = subprocess.run(cmd, cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    assert "passed" in out and " skipped" not in out.split("\n")[-2], out[-2000:]


def test_sanitized_build_reports_a_shared_memory_overrun(tmp_path):
    # the control: a drop/extend launch given too little dynamic shared memory writes past the launch's buffer,
    # which the plain build would not notice and the sanitized one must abort on
    try:
        preload = build.sanitizer_preload()
    except build.KernelBuildError as exc:  # pragma: no cover
        pytest.skip(f"no sanitizer runtimes: {exc}")
    script = f"""
import ctypes, numpy as np
from rnstensor.kernels import build, tables
lib = ctypes.CDLL(str(build.entry_simt_library(cache={str(tmp_path)!r}, sanitize=True)))
active = (256, 255, 253, 251, 247)
X = np.zeros((5, 64), np.int8)
ib, fb, out_active, nd, nr = tables.drop_tables(active, active, 2, True)
out = np.zeros((len(out_active), 64), np.int8)
p = lambda a: a.ctypes.data_as(ctypes.c_void_p)
assert lib.emu_set_drop_tables(p(ib), ctypes.c_int64(ib.size), p(fb), ctypes.c_int64(fb.size)) == 0
lib.emu_drop_extend(ctypes.c_uint(1), ctypes.c_uint(64), ctypes.c_int64(4), 0, p(X), ctypes.c_int64(64), p(out))
print("no report")
"""
    # a 2 KiB redzone after every heap block: the overrun's first access lands in its own block's redzone, so the
    # report names the overflow (with the default 16 bytes it may land in a freed neighbour: "use-after-free")
    env = dict(os.environ, LD_PRELOAD=preload, ASAN_OPTIONS="detect_leaks=0:redzone=2048:max_redzone=2048")
    res = subprocess.run([sys.executable, "-c", script], cwd=TESTS.parent, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode != 0 and "no report" not in res.stdout, res.stdout + res.stderr[-2000:]
    assert "AddressSanitizer" in res.stderr and "heap-buffer-overflow" in res.stderr, res.stderr[-2000:]
