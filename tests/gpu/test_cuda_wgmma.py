"""Every product engine of CudaBackend (wgmma, mma.sync, cuBLAS INT8, auto) against the CPU backend, bit for bit.

Held-out shapes: none of them is a shape of the CPU emulation tests
(tests/test_kernels_wgmma.py). The wgmma cases run on sm_90a devices only.
"""

from __future__ import annotations

import numpy as np
import pytest

from rnstensor import arith
from rnstensor.backends.cpu import CpuBackend
from rnstensor.basis import Basis, int8_pool
from residues import random_planes

from cuda_support import cupy_or_skip  # noqa: E402

cp = cupy_or_skip()

CPU = CpuBackend()
POOL = int8_pool()
ENGINES = ["wgmma", "mma", "cublas", "auto"]


@pytest.fixture(scope="module", params=ENGINES)
def engine(request):
    from rnstensor.backends.cuda import CudaBackend, device_info

    if request.param == "wgmma" and device_info().get("arch") != "sm_90a":
        pytest.skip("wgmma needs a Hopper (sm_90a) device")
    return CudaBackend(product_engine=request.param)


def check(be, A, X, moduli, axis):
    ref = CPU.product(A, X, moduli, axis)
    got = be.product(cp.asarray(A), cp.asarray(X), moduli, axis)
    assert isinstance(got, cp.ndarray)
    assert np.array_equal(cp.asnumpy(got), ref)
    assert np.array_equal(be.product(A, X, moduli, axis), ref)  # numpy in, numpy out


@pytest.mark.parametrize(
    "pre, n_in, n_out",
    [(129, 16, 1), (333, 48, 63), (1000, 112, 65), (2048, 256, 128), (517, 1040, 200), (96, 4096, 257)],
)
def test_last_axis(engine, pre, n_in, n_out):
    moduli = Basis.int8(15).moduli
    rng = np.random.default_rng(pre + n_in + n_out)
    X = random_planes(rng, moduli, (pre, n_in))
    A = random_planes(rng, moduli, (n_out, n_in))
    check(engine, A, X, moduli, 1)


@pytest.mark.parametrize("shape, axis, n_out", [((6, 40, 16), 2, 70), ((48, 7, 9), 0, 33), ((5, 64, 64), 1, 64)])
def test_other_layouts_fall_back(engine, shape, axis, n_out):
    # middle/first axes and n_in % 16 != 0: the wgmma engine hands these to mma.sync, same bits
    moduli = (256, 255, 253, 7)
    rng = np.random.default_rng(sum(shape) + axis)
    X = random_planes(rng, moduli, shape)
    A = random_planes(rng, moduli, (n_out, shape[axis]))
    check(engine, A, X, moduli, axis)


@pytest.mark.parametrize("edge", ["min", "max"])
def test_range_edges(engine, edge):
    moduli = (256, 255, 253, 251)
    X = random_planes(None, moduli, (300, 512), edge)
    A = random_planes(None, moduli, (96, 512), edge)
    check(engine, A, X, moduli, 1)


def test_fold_past_int32(engine):
    # K = 2 * 131008 + 80 terms at the range edge: |sum| reaches 2^32, so the device folds twice (every 2047
    # k-tiles of 64 in wgmma, every 4095 steps of 32 in mma.sync); the exact answer is K (p//2)^2 mod p
    moduli = (256, 255)
    K = 2 * 131008 + 80
    X = random_planes(None, moduli, (130, K), "min")
    A = random_planes(None, moduli, (64, K), "min")
    got = cp.asnumpy(engine.product(cp.asarray(A), cp.asarray(X), moduli, 1))
    for l, p in enumerate(moduli):
        assert np.all(got[l] == int(arith.centered_mod(np.int64(K * (p // 2) ** 2), p)))


def test_wgmma_runs_where_it_should():
    from rnstensor.backends.cuda import CudaBackend, device_info

    if device_info().get("arch") != "sm_90a":
        pytest.skip("wgmma needs a Hopper (sm_90a) device")
    be = CudaBackend(product_engine="wgmma")
    assert be.product_engine_for(4096, 1024, 1, 1024, 15) == "wgmma"
    assert "product_wgmma" in be.built_kernels()
    auto = CudaBackend(product_engine="auto")
    assert auto.product_engine_for(16384, 16384, 1, 16384, 15) == "wgmma"
    # a misaligned view goes to mma.sync with the same bits
    moduli = (256, 251)
    rng = np.random.default_rng(1)
    X = random_planes(rng, moduli, (200, 64))
    A = random_planes(rng, moduli, (64, 64))
    buf = cp.zeros(X.size + 1, cp.int8)
    Xv = buf[1:].reshape(X.shape)
    Xv[...] = cp.asarray(X)
    assert np.array_equal(cp.asnumpy(be.product(cp.asarray(A), Xv, moduli, 1)), CPU.product(A, X, moduli, 1))
