"""CudaBackend against CpuBackend: every contract call equal bit for bit, on CuPy and on NumPy arrays."""

from __future__ import annotations


import numpy as np
import pytest

from rnstensor.backends.cpu import CpuBackend
from rnstensor.basis import Basis, int8_pool
from residues import random_planes

from cuda_support import cupy_or_skip  # noqa: E402

cp = cupy_or_skip()

CPU = CpuBackend()
POOL = int8_pool()
BASES = [Basis.int8(15), Basis.int8(49), Basis((7, 5, 3, 2)), Basis((255, 256, 7)), Basis((256,))]


@pytest.fixture(scope="module", params=["mma", "cublas"])
def gpu(request):
    from rnstensor.backends.cuda import CudaBackend

    return CudaBackend(product_engine=request.param)


@pytest.fixture(scope="module")
def mma():
    from rnstensor.backends.cuda import CudaBackend

    return CudaBackend()


def same(a, b):
    a = cp.asnumpy(a) if isinstance(a, cp.ndarray) else a
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype == np.float64:
        ua, ub = a.view(np.uint64), b.view(np.uint64)
        bad = np.flatnonzero(ua.reshape(-1) != ub.reshape(-1))
        assert bad.size == 0, f"entry {bad[0]}: {a.reshape(-1)[bad[0]]!r} vs {b.reshape(-1)[bad[0]]!r}"
    else:
        assert np.array_equal(a, b)


# ----- encode ---------------------------------------------------------------------------------


@pytest.mark.parametrize("basis", BASES, ids=str)
def test_encode(mma, basis):
    rng = np.random.default_rng(len(basis))
    x = rng.standard_normal((64, 33)) * np.exp2(rng.integers(-40, 40, (64, 33)))
    x.reshape(-1)[:12] = [0.0, -0.0, 5e-324, -5e-324, 2.5, -2.5, 0.5, 1.5, 1.7976931348623157e308, 2.0**53, 3.5, -0.5]
    for e in (np.int64(20), rng.integers(-1100, 1100, (64, 1)), rng.integers(-60, 60, (64, 33))):
        for bits in (53, 120):
            ref = CPU.encode(x, e, basis.moduli, bits)
            same(mma.encode(cp.asarray(x), e, basis.moduli, bits), ref)
            same(mma.encode(x, e, basis.moduli, bits), ref)  # numpy in, numpy out


# ----- products -------------------------------------------------------------------------------


@pytest.mark.parametrize("n_in, n_out", [(1, 1), (2, 3), (8, 8), (7, 16), (16, 9), (32, 32), (33, 64), (64, 65), (100, 7)])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_product_every_axis(gpu, n_in, n_out, axis):
    basis = Basis.int8(15)
    rng = np.random.default_rng(n_in * 100 + n_out + axis)
    shape = [5, 6, 7]
    shape[axis] = n_in
    X = random_planes(rng, basis.moduli, tuple(shape))
    A = random_planes(rng, basis.moduli, (n_out, n_in))
    ref = CPU.product(A, X, basis.moduli, axis)
    same(gpu.product(cp.asarray(A), cp.asarray(X), basis.moduli, axis), ref)


@pytest.mark.parametrize("edge", ["min", "max"])
@pytest.mark.parametrize("n_in", [255, 256, 1000, 4100])
def test_product_range_edges(gpu, edge, n_in):
    # all residues at the end of their range: the largest accumulators; 255 is the last one-reduction length
    basis = Basis.int8(15)
    X = random_planes(None, basis.moduli, (3, n_in), edge)
    A = random_planes(None, basis.moduli, (12, n_in), edge)
    ref = CPU.product(A, X, basis.moduli, 1)
    same(gpu.product(cp.asarray(A), cp.asarray(X), basis.moduli, 1), ref)


def test_product_accumulator_fold(mma):
    # 2**31 / 2**14 = 131072 terms would overflow int32: the kernel folds every 131040
    basis = Basis((256, 255))
    n_in = 140000
    X = random_planes(None, basis.moduli, (2, n_in), "min")
    A = random_planes(None, basis.moduli, (3, n_in), "min")
    ref = CPU.product(A, X, basis.moduli, 1)
    same(mma.product(cp.asarray(A), cp.asarray(X), basis.moduli, 1), ref)


def test_product_numpy_in_numpy_out(mma):
    basis = Basis.int8(15)
    rng = np.random.default_rng(5)
    X = random_planes(rng, basis.moduli, (4, 8, 8, 8))
    A = random_planes(rng, basis.moduli, (8, 8))
    out = mma.product(A, X, basis.moduli, 2)
    assert isinstance(out, np.ndarray)
    same(out, CPU.product(A, X, basis.moduli, 2))


# ----- elementwise ----------------------------------------------------------------------------


@pytest.mark.parametrize("shapes", [((3, 4, 5), (3, 5, 2)), ((1, 7, 1100), (2, 1100, 3)), ((6, 0), (0, 2))])
def test_matmul(mma, shapes):
    rng = np.random.default_rng(11)
    mods = Basis.int8(15).moduli
    a, b = random_planes(rng, mods, shapes[0]), random_planes(rng, mods, shapes[1])
    same(mma.matmul(cp.asarray(a), cp.asarray(b), mods), CPU.matmul(a, b, mods))
    same(mma.matmul(a, b, mods), CPU.matmul(a, b, mods))


@pytest.mark.parametrize("basis", BASES, ids=str)
def test_hadamard_add_sub(mma, basis):
    rng = np.random.default_rng(len(basis) + 1)
    a = random_planes(rng, basis.moduli, (6, 5, 4))
    b = random_planes(rng, basis.moduli, (6, 5, 4))
    f = random_planes(rng, basis.moduli, (5, 4))
    same(mma.hadamard(cp.asarray(a), cp.asarray(f), basis.moduli), CPU.hadamard(a, f, basis.moduli))
    same(mma.hadamard(cp.asarray(a), cp.asarray(b), basis.moduli), CPU.hadamard(a, b, basis.moduli))
    same(mma.add(cp.asarray(a), cp.asarray(b), basis.moduli), CPU.add(a, b, basis.moduli))
    same(mma.add(cp.asarray(a), cp.asarray(b), basis.moduli, subtract=True), CPU.add(a, b, basis.moduli, subtract=True))
    for edge in ("min", "max"):
        e = random_planes(None, basis.moduli, (5, 4), edge)
        same(mma.hadamard(cp.asarray(e), cp.asarray(e), basis.moduli), CPU.hadamard(e, e, basis.moduli))


# ----- drop and extension ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "basis, drops, extend",
    [
        (Basis.int8(15), 1, True),
        (Basis.int8(15), 3, True),
        (Basis.int8(15), 3, False),
        (Basis.int8(15), (256, 253), True),
        (Basis.int8(15), 0, True),
        (Basis.int8(49), 7, True),
        (Basis((7, 5, 3, 2)), 1, True),
        (Basis((255, 256, 7, 11)), 2, False),
    ],
)
def test_drop_extend(mma, basis, drops, extend):
    rng = np.random.default_rng(len(basis) * 3 + (drops if isinstance(drops, int) else 9))
    active = tuple(rng.permutation(basis.moduli).tolist())
    for edge in (None, "min", "max"):
        X = random_planes(rng, active, (33, 65), edge)
        ref, ref_act = CPU.drop_extend(X, active, basis, drops, extend)
        got, act = mma.drop_extend(cp.asarray(X), active, basis, drops, extend)
        assert tuple(act) == tuple(ref_act)
        same(got, ref)


# ----- decode ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fp64", "exact"])
@pytest.mark.parametrize("active", [POOL[:15], POOL[:49], (7, 5, 3, 2), (255, 256, 7)])
def test_decode(mma, mode, active):
    rng = np.random.default_rng(len(active))
    X = random_planes(rng, active, (40, 50))
    ev = rng.integers(-300, 300, (40, 1))
    ev[:3] = [[-1500], [1200], [-1080]]
    for factor in (1, -3, 253 * 251, (1 << 90) + 7):
        with np.errstate(over="ignore"):
            ref = CPU.decode(X, active, ev, factor, mode)
        same(mma.decode(cp.asarray(X), active, ev, factor, mode), ref)


# ----- fused 3M complex product ---------------------------------------------------------------


@pytest.mark.parametrize("n_in, n_out", [(8, 8), (33, 5), (300, 40)])
@pytest.mark.parametrize("axis", [0, 1])
def test_product_3m(mma, n_in, n_out, axis):
    basis = Basis.int8(15)
    rng = np.random.default_rng(n_in + n_out + axis)
    shape = [6, 7]
    shape[axis] = n_in
    re, im = random_planes(rng, basis.moduli, tuple(shape)), random_planes(rng, basis.moduli, tuple(shape))
    ore, oim = random_planes(rng, basis.moduli, (n_out, n_in)), random_planes(rng, basis.moduli, (n_out, n_in))
    m = basis.moduli
    P0, P1 = CPU.product(ore, re, m, axis), CPU.product(oim, im, m, axis)
    P2 = CPU.product(CPU.add(ore, oim, m), CPU.add(re, im, m), m, axis)
    got_re, got_im = mma.product_3m(*(cp.asarray(a) for a in (ore, oim, re, im)), m, axis)
    same(got_re, CPU.add(P0, P1, m, subtract=True))
    same(got_im, CPU.add(CPU.add(P2, P0, m, subtract=True), P1, m, subtract=True))
