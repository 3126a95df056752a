"""The CPU GEMM kernels (backends/cpu_gemm.py): the exponent scan against Python's own float facts."""

from __future__ import annotations

import importlib
import math
import os
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rnstensor as rt
from rnstensor import gemm
from rnstensor.backends.cpu import gemm as cpu_gemm

encode = importlib.import_module("rnstensor.encode")  # the module, not rnstensor.encode the function

NONE, HUGE = encode._NONE, encode._HUGE


def test_sentinels_agree_with_encode():
    assert (cpu_gemm._NONE, cpu_gemm._HUGE) == (encode._NONE, encode._HUGE)


def _lsb(v: float) -> int:
    num, den = abs(v).as_integer_ratio()
    return -(den.bit_length() - 1) if den > 1 else (num & -num).bit_length() - 1


def _oracle(x: np.ndarray, axis: int):
    """Per group, from Python floats: math.frexp and the exact integer ratio of every part."""
    groups = x if axis == 1 else x.T
    parts = (lambda z: (z.real, z.imag)) if x.dtype.kind == "c" else (lambda z: (z,))
    out = []
    for g in groups:
        vals = [[float(p) for p in parts(z)] for z in g]
        fin = all(math.isfinite(p) for v in vals for p in v)
        mags = [max(abs(p) for p in v) for v in vals if all(math.isfinite(p) for p in v)]
        nz = [abs(p) for v in vals for p in v if math.isfinite(p) and p != 0]
        amax = max(mags, default=0.0)
        Emax = math.frexp(amax)[1] if amax > 0 else NONE
        Emin = math.frexp(min(nz))[1] if nz else NONE
        lsb = min((_lsb(p) for p in nz), default=HUGE)
        out.append((fin, Emax, lsb, Emin))
    return [np.array(c) for c in zip(*out)]


def _assert_same(got, want):
    for g, w, name in zip(got, want, ("finite", "Emax", "lsb_min", "Emin")):
        assert g is not None, name
        np.testing.assert_array_equal(np.asarray(g, np.int64), np.asarray(w, np.int64), err_msg=name)


_SPECIAL = [0.0, -0.0, 5e-324, -5e-324, 2.0**-1022, np.nextafter(2.0**-1022, 0), 1.0, -0.75, 3.0, 2.0**1023,
            np.finfo(np.float64).max, np.inf, -np.inf, np.nan, 1 + 2.0**-52, 6.0 * 2.0**-1060]


@pytest.mark.parametrize("cplx", [False, True])
@pytest.mark.parametrize("order", ["C", "F", "strided"])
def test_scan_matches_python_floats(cplx, order):
    rng = np.random.default_rng(3)
    m, n = 37, 150  # more columns than one column task, rows of odd length
    x = rng.choice(_SPECIAL, (m, n)) * rng.choice([1.0, 0.5, 2.0**-40], (m, n))
    x[:5] = rng.uniform(-1, 1, (5, n))  # rows (and with them columns) free of specials
    x[:, :3] = rng.uniform(-1, 1, (m, 3))
    x[7] = 0.0
    x[:, 9] = 0.0
    if cplx:
        y = rng.choice(_SPECIAL, (m, n))
        y[:5] = 0.0
        z = x.astype(np.complex128)
        z.imag = y  # not x + 1j * y: 1j * inf has a NaN real part
        x = z
    if order == "F":
        x = np.asfortranarray(x)
    elif order == "strided":
        x = np.repeat(x, 2, axis=1)[:, ::2]
    for axis in (0, 1):
        want = _oracle(x, axis)
        _assert_same(cpu_gemm.group_stats(x, axis, True), want)
        fin, Emax, lsb, Emin = gemm.group_stats(x, axis, False)
        assert lsb is None
        _assert_same((fin, Emax, want[2], Emin), want)
        np.testing.assert_array_equal(gemm.group_lsb(x, axis), want[2])


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, max_side=70)), st.sampled_from([0, 1]),
       st.booleans())
def test_scan_matches_array_path(x, axis, cplx):
    if cplx:
        z = x.astype(np.complex128)
        z.imag = x[::-1]
        x = z
    got = cpu_gemm.group_stats(x, axis, True)
    want = gemm._group_stats_array(x, axis, True, np)
    _assert_same(got, want)


def test_empty_groups_and_errors():
    for shape, axis, size in (((0, 4), 0, 4), ((3, 0), 1, 3), ((0, 0), 1, 0)):
        fin, Emax, lsb, Emin = cpu_gemm.group_stats(np.zeros(shape), axis, True)
        assert fin.shape == (size,) and fin.all()
        assert (Emax == NONE).all() and (lsb == HUGE).all() and (Emin == NONE).all()
    with pytest.raises(TypeError, match="float64 or complex128"):
        cpu_gemm.group_stats(np.zeros((2, 2), np.float32), 0, True)
    with pytest.raises(ValueError, match="axis must be 0"):
        cpu_gemm.group_stats(np.zeros((2, 2)), 2, True)


# ----- the wide-modulus exact product ------------------------------------------------------------------


@pytest.mark.parametrize("k, t", [(1, 1), (7, 20), (1024, 53), (4096, 56), (5000, 164), (1 << 16, 80)])
def test_wide_plan_holds_the_bound_exactly(k, t):
    bound = k * 4**t
    mods, chunk = cpu_gemm.wide_plan(k, bound)
    assert math.prod(mods) > 2 * bound
    assert len(set(mods)) == len(mods) and all(p % 2 and p < 2**24 for p in mods)
    assert all(math.gcd(p, q) == 1 for i, p in enumerate(mods) for q in mods[i + 1:])
    R = max(mods) // 2
    assert chunk * R * R + 2**24 <= 2**53  # every partial sum of a chunk, plus the accumulator, is exact
    assert 1 <= chunk <= k


def test_wide_plan_refuses_what_31_moduli_cannot_hold():
    with pytest.raises(ValueError, match="INT8 product"):
        cpu_gemm.wide_plan(4096, 4096 * 4**400)
    assert not cpu_gemm.prefers_wide(512, 512, 4096, 49, 4096 * 4**400)


def test_reduce_into_is_exact_at_the_ends_of_its_range():
    p = 11863279
    R = p // 2
    t = np.array([[2.0**53 - 2**25, -(2.0**53 - 2**25), 0.0, -1.0, R, -R, R + 1, 3.0 * p]])
    acc = np.array([[R, -R, 0, 0, 0, 0, 0, 1]], np.float32)
    for first in (True, False):
        got = acc.copy()
        cpu_gemm._reduce_into(t, got, float(p), 1.0 / p, float((p + 1) // 2), first, 0, 1)
        for g, x, a in zip(got[0], t[0], acc[0]):
            v = int(x) + (0 if first else int(a))
            want = (v + p // 2) % p - p // 2  # centered in [h - p, h - 1], h = (p + 1) / 2
            assert int(g) == want


def _same_bits(*args, **kw):
    """dgemm (zgemm for complex operands) on the INT8 engine and the wide one, its products on the calling thread
    and one single-threaded GEMM per thread: the same bits; the wide result."""
    gemm = rt.zgemm if args[0].dtype.kind == "c" else rt.dgemm
    old = cpu_gemm.ENGINE, cpu_gemm._PARALLEL_MIN, cpu_gemm._foreign_threads_running
    try:
        cpu_gemm.ENGINE = "int8"
        x = gemm(*args, **kw)
        cpu_gemm.ENGINE, cpu_gemm._PARALLEL_MIN = "wide", 1 << 62
        y = gemm(*args, **kw)
        cpu_gemm._PARALLEL_MIN, cpu_gemm._foreign_threads_running = 0, lambda: False  # (the INT8 run's BLAS spins)
        z = gemm(*args, **kw)
    finally:
        cpu_gemm.ENGINE, cpu_gemm._PARALLEL_MIN, cpu_gemm._foreign_threads_running = old
    np.testing.assert_array_equal(x.view(np.int64), y.view(np.int64), err_msg=str(kw))
    np.testing.assert_array_equal(x.view(np.int64), z.view(np.int64), err_msg=f"threaded products, {kw}")
    return y


def _data(rng, kind, shape):
    x = rng.uniform(-1, 1, shape)
    if kind == "wide":
        x = np.ldexp(x, rng.integers(-60, 60, shape).astype(np.int32))
    elif kind == "sparse":
        x[rng.random(shape) < 0.7] = 0.0
    elif kind == "ints":
        x = rng.integers(-2**20, 2**20, shape).astype(np.float64)
    elif kind == "tiny":
        x = x * 2.0**-1000
    elif kind == "huge":
        x = x * 2.0**900
    return x


@pytest.mark.parametrize("kind", ["uniform", "wide", "sparse", "ints", "tiny", "huge"])
@pytest.mark.parametrize("moduli", [None, "fast", "auto", 9])
def test_wide_engine_gives_the_int8_bits(kind, moduli):
    rng = np.random.default_rng(11)
    for m, k, n in ((1, 1, 1), (5, 300, 7), (33, 1100, 20)):
        a, b = _data(rng, kind, (m, k)), _data(rng, "uniform" if kind in ("tiny", "huge") else kind, (k, n))
        for alpha in (1.0, -1.0, 0.375, -3.1):
            _same_bits(a, b, moduli=moduli, alpha=alpha, min_bits=0)


def test_wide_engine_rounds_the_exact_product_correctly():
    rng = np.random.default_rng(5)
    a = np.ldexp(rng.uniform(-1, 1, (6, 40)), rng.integers(-30, 30, (6, 40)).astype(np.int32))
    b = rng.uniform(-1, 1, (40, 5))
    a[0, :2] = [2.0**-1070, 2.0**-1074]  # results near and below the subnormal range
    b[:2, 0] = [1.0, 2.0**-3]
    c = _same_bits(a, b, moduli="auto", alpha=1.0)
    for i in range(6):
        for j in range(5):
            exact = sum(Fraction(float(a[i, p])) * Fraction(float(b[p, j])) for p in range(40))
            assert c[i, j] == float(exact)  # Fraction -> float rounds to nearest-even


def test_wide_engine_inf_nan_rows_beta_and_trans():
    rng = np.random.default_rng(8)
    a, b, c = rng.uniform(-1, 1, (30, 700)), rng.uniform(-1, 1, (30, 700)), rng.uniform(-1, 1, (30, 30))
    a[3, 5] = np.nan
    b[7, 2] = np.inf
    _same_bits(a, b, c, trans_b="T", beta=0.5, moduli="auto")
    _same_bits(b.T.copy(), a.T.copy(), trans_a="T", moduli=None)


def test_backend_picks_the_engine_by_shape(monkeypatch):
    be = rt.get_backend("cpu")
    calls = []
    real = cpu_gemm.exact_gemm
    monkeypatch.setattr(cpu_gemm, "exact_gemm", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    rng = np.random.default_rng(1)
    big = rng.uniform(-1, 1, (128, 128))
    rt.dgemm(big, big, moduli="auto", backend="cpu")
    rt.dgemm(big[:4, :4], big[:4, :4], moduli="auto", backend="cpu")  # too small: the INT8 path
    rt.dgemm(big, big, moduli="auto", backend="cpu", workspace_bytes=1 << 20)  # planes too large: INT8 tiles
    assert calls == [(128, 128)]
    assert be.exact_gemm is not None


@pytest.mark.parametrize("kind", ["uniform", "wide", "sparse", "tiny"])
@pytest.mark.parametrize("moduli", [None, "auto", 10])
def test_wide_engine_gives_the_int8_bits_for_zgemm(kind, moduli):
    rng = np.random.default_rng(12)
    for m, k, n in ((1, 1, 1), (6, 400, 5)):
        a = _data(rng, kind, (m, k)) + 1j * _data(rng, kind, (m, k))
        b = _data(rng, "uniform", (k, n)) - 1j * _data(rng, "uniform", (k, n))
        for alpha in (1.0, -1.0, 1j, 0.5 - 2.25j, -3.0):
            _same_bits(a, b, moduli=moduli, alpha=alpha, min_bits=0)
    _same_bits(a, b.T.copy(), trans_b="C", moduli=moduli, min_bits=0)


def test_wide_zgemm_is_the_exact_product_rounded():
    rng = np.random.default_rng(4)
    a = rng.uniform(-1, 1, (3, 30)) + 1j * np.ldexp(rng.uniform(-1, 1, (3, 30)), -20)
    b = rng.uniform(-1, 1, (30, 4)) + 1j * rng.uniform(-1, 1, (30, 4))
    c = _same_bits(a, b, moduli="auto")
    for i in range(3):
        for j in range(4):
            terms = [(Fraction(float(a[i, p].real)), Fraction(float(a[i, p].imag)),
                      Fraction(float(b[p, j].real)), Fraction(float(b[p, j].imag))) for p in range(30)]
            re = sum(ar * br - ai * bi for ar, ai, br, bi in terms)
            im = sum(ar * bi + ai * br for ar, ai, br, bi in terms)
            assert c[i, j].real == float(re) and c[i, j].imag == float(im)


def test_wide_engine_on_the_split_product_of_wide_rows():
    # moduli=None on a row and a column spanning 500 binades: every slice pair is one product of the program
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((40, 300)), rng.standard_normal((300, 30))
    a[0] = np.ldexp(a[0], rng.integers(-250, 250, 300).astype(np.int32))
    b[:, 0] = np.ldexp(b[:, 0], rng.integers(-250, 250, 300).astype(np.int32))
    _same_bits(a, b)
    _same_bits(a + 0.5j * a, b - 2j * b)


def test_one_blas_thread_is_restored_after_overlapping_callers():
    import threading

    libs = cpu_gemm._openblas_threads()
    if not libs:
        pytest.skip("numpy's BLAS is not a pthreads OpenBLAS")
    counts = lambda: [get() for get, _ in libs]  # noqa: E731
    before = counts()
    inside, go, done = [], threading.Barrier(3), threading.Event()

    def caller():
        with cpu_gemm._one_blas_thread():
            go.wait()
            inside.append(counts())
            done.wait()

    for attempt in range(2):  # the first caller from a worker thread, then again: the count is process-wide
        threads = [threading.Thread(target=caller) for _ in range(2)]
        for t in threads:
            t.start()
        go.wait()  # both inside
        done.set()
        for t in threads:
            t.join()
        done.clear()
        assert inside == [[1] * len(before)] * 2
        assert counts() == before
        inside.clear()


def test_kept_workspace_is_reused_and_never_returned(monkeypatch):
    rng = np.random.default_rng(2)
    a, b = rng.uniform(-1, 1, (64, 300)), rng.uniform(-1, 1, (300, 48))
    monkeypatch.setattr(cpu_gemm, "ENGINE", "wide")
    cpu_gemm.release_workspace()
    c1 = rt.dgemm(a, b, moduli="auto")
    kept = cpu_gemm._KEPT[0]
    assert kept is not None and kept.nbytes >= cpu_gemm.wide_bytes(64, 48, 300, 5)
    c1_bits = c1.copy()
    c2 = rt.dgemm(2 * a, b, moduli="auto")
    assert cpu_gemm._KEPT[0] is kept, "a product of the same size reuses the kept buffer"
    assert not np.shares_memory(c2, kept) and not np.shares_memory(c1, kept)
    np.testing.assert_array_equal(c1.view(np.int64), c1_bits.view(np.int64))  # the first result is untouched
    np.testing.assert_array_equal(c2, 2 * c1)
    cpu_gemm.release_workspace()
    assert cpu_gemm._KEPT[0] is None
    monkeypatch.setattr(cpu_gemm, "KEEP_BYTES", 0)
    np.testing.assert_array_equal(rt.dgemm(a, b, moduli="auto"), c1)
    assert cpu_gemm._KEPT[0] is None, "KEEP_BYTES = 0 keeps nothing"
    with cpu_gemm._KEPT_LOCK:  # another caller holds the buffer: this one takes fresh memory, keeps nothing
        np.testing.assert_array_equal(rt.dgemm(a, b, moduli="auto"), c1)
    assert cpu_gemm._KEPT[0] is None


def test_threaded_matmul_is_a_float_product(monkeypatch):
    # row blocks on one BLAS thread each: within float32 / float64 rounding of the exact product, every row
    monkeypatch.setattr(cpu_gemm, "_PARALLEL_MIN", 0)
    rng = np.random.default_rng(3)
    for dt in (np.float32, np.float64):
        a, b = rng.random((101, 70)).astype(dt), rng.random((70, 33)).astype(dt)
        got = cpu_gemm.threaded_matmul(a, b)
        exact = a.astype(np.float64) @ b.astype(np.float64)
        assert got.dtype == dt and got.shape == (101, 33)
        assert np.all(np.abs(got - exact) <= 72 * np.finfo(dt).eps * (np.abs(a) @ np.abs(b)))
    assert cpu_gemm.threaded_matmul(a[:1], b).shape == (1, 33)  # fewer rows than threads: one call


def test_a_forked_child_gets_its_blas_count_back(monkeypatch):
    libs = cpu_gemm._openblas_threads()
    if not libs:
        pytest.skip("numpy's BLAS is not a pthreads OpenBLAS")
    before = [get() for get, _ in libs]
    for _, put in libs:
        put(1)  # as if a thread of the parent was inside _one_blas_thread when it forked
    monkeypatch.setattr(cpu_gemm, "_ONE", [1, tuple(before)])
    cpu_gemm._after_fork()
    assert [get() for get, _ in libs] == before and cpu_gemm._ONE[0] == 0
    assert not cpu_gemm._ONE_LOCK.locked() and cpu_gemm._KEPT[0] is None


def test_spinning_blas_threads_are_seen():
    # OpenBLAS's worker spins for ~2**28 cycles after a multi-threaded call (the engine then keeps OpenBLAS's own
    # threads) and sleeps after; Python's own threads never count
    import threading
    import time

    libs = cpu_gemm._openblas_threads()
    if not libs or max(get() for get, _ in libs) < 2 or not os.path.isdir("/proc/self/task"):
        pytest.skip("needs a multi-threaded pthreads OpenBLAS on Linux")
    a = np.random.default_rng(0).random((400, 400))
    busy = threading.Event()
    worker = threading.Thread(target=lambda: busy.wait(5))  # a Python thread, waiting: never a foreign one
    worker.start()
    try:
        a @ a
        assert cpu_gemm._foreign_threads_running()
        time.sleep(1.5)
        assert not cpu_gemm._foreign_threads_running()
    finally:
        busy.set()
        worker.join()


# ----- the engine's product as INT8 residues (einsum's GEMM-shaped steps) ------------------------------------------


@pytest.mark.parametrize("plan", ["primes", "grouped"])
@pytest.mark.parametrize("t, s", [(53, 15), (56, 16), (160, 48)])
def test_wide_engine_residues_are_the_exact_products(t, s, plan):
    # the engine's integers as residues on INT8 moduli, against Python integers: round_half_even(x 2**e) per entry,
    # the exact sums of their products, reduced and centered; on wide primes (the mixed-radix digits) or on wide
    # moduli grouped from the INT8 ones (gemm.onto_plan: one reduction each)
    rng = np.random.default_rng(t)
    m, k, n = 4, 300, 5
    a, b = _data(rng, "wide", (m, k)), rng.uniform(-1, 1, (k, n))
    b[0, 0], b[1, 1] = 0.0, 2.0**-700
    ea = t - np.frexp(np.abs(a).max(axis=1))[1]
    eb = t - np.frexp(np.abs(b).max(axis=0))[1]
    mods = rt.Basis.int8(s).moduli
    bound = k * 4**t
    wide, chunk = cpu_gemm.wide_plan(k, bound) if plan == "primes" else cpu_gemm.onto_plan(k, bound, mods)
    got = cpu_gemm.exact_gemm(a, b, ea, eb, bound, 1.0, wide, chunk, onto=tuple(mods))
    A = [[round(Fraction(float(v)) * Fraction(2) ** int(ea[i])) for v in row] for i, row in enumerate(a)]
    B = [[round(Fraction(float(b[p, j])) * Fraction(2) ** int(eb[j])) for j in range(n)] for p in range(k)]
    for i in range(m):
        for j in range(n):
            c = sum(A[i][p] * B[p][j] for p in range(k))
            want = [(c % q) - q if c % q >= (q + 1) // 2 else c % q for q in mods]  # (int8: -128 for 2**7 mod 2**8)
            assert got[:, i, j].tolist() == want, (i, j)


@pytest.mark.parametrize("k, s", [(1, 1), (60, 15), (300, 15), (4096, 20), (70000, 49), (1 << 22, 49)])
def test_onto_plan_groups_the_int8_moduli_into_wide_ones_that_hold_the_sums(k, s):
    mods = rt.Basis.int8(s).moduli
    bound = math.prod(mods) // 2 - 1  # (the widest the INT8 moduli hold)
    wide, chunk = cpu_gemm.onto_plan(k, bound, mods)
    assert math.prod(wide) == math.prod(mods)  # every INT8 modulus in one group, once
    assert all(sum(w % q == 0 for w in wide) == 1 for q in mods)
    assert 1 <= chunk <= max(k, 1) and len(wide) <= cpu_gemm._L_MAX
    # a chunk's sums of products of centered residues stay exact in float64, every modulus below 2**24
    assert all(w <= cpu_gemm._P_MAX and chunk * (w // 2) ** 2 <= cpu_gemm._SUM_MAX for w in wide)
    # (never fewer than moduli below 2**24 need)
    assert len(wide) >= math.ceil(math.log(math.prod(mods)) / math.log(cpu_gemm._P_MAX))
    with pytest.raises(ValueError, match="do not hold the bound"):
        cpu_gemm.onto_plan(k, math.prod(mods) // 2, mods)


def test_mode_products_take_the_engine_on_moduli_grouped_from_the_int8_ones(monkeypatch):
    # a GEMM-shaped mode product (a tensor by a matrix, the new axis last) decoded in float64 takes the engine's
    # residues, made on wide moduli that are products of the plan's INT8 moduli; the bits of the INT8 product
    from rnstensor.backends.cpu.backend import ExactProduct

    rng = np.random.default_rng(8)
    x, m = rng.uniform(-1, 1, (30, 20, 60)), rng.uniform(-1, 1, (60, 40))
    monkeypatch.setattr(cpu_gemm, "ENGINE", "int8")
    want = rt.einsum("bij,jk->bik", x, m, moduli="fast")
    monkeypatch.setattr(cpu_gemm, "ENGINE", "wide")
    asked, planned = [], []
    real = ExactProduct.residues
    monkeypatch.setattr(ExactProduct, "residues", lambda self: asked.append(self.moduli) or real(self))
    real_gemm = cpu_gemm.exact_gemm
    monkeypatch.setattr(cpu_gemm, "exact_gemm", lambda *a, **kw: planned.append(a[6]) or real_gemm(*a, **kw))
    got = rt.einsum("bij,jk->bik", x, m, moduli="fast")
    np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))
    assert asked == [rt.Basis.int8(15).moduli]
    assert math.prod(planned[0]) == math.prod(asked[0])  # (the grouped moduli, not primes)


def test_the_exact_epilogue_takes_the_engine_residues(monkeypatch):
    # dgemm 'auto' with alpha, beta and c (rounded once: the exact epilogue reads the product's residues) takes them
    # from the engine, on moduli grouped from the INT8 ones; the INT8 product's bits, every entry against Fractions
    from rnstensor.backends.cpu.backend import ExactProduct

    rng = np.random.default_rng(21)
    a, b = rng.standard_normal((40, 70)), rng.standard_normal((70, 30))
    a[:, ::3] *= 2.0**-40  # (a wide row: more moduli than 'fast')
    c = rng.standard_normal((40, 30))
    c[1, 2] = 2.0**600  # (one far-out entry: the per-entry path)
    kw = dict(alpha=1.5, beta=-0.3, moduli="auto")
    monkeypatch.setattr(cpu_gemm, "ENGINE", "int8")
    want = rt.dgemm(a.T.copy(), b, c, trans_a="T", **kw)
    monkeypatch.setattr(cpu_gemm, "ENGINE", "wide")
    asked = []
    real = ExactProduct.residues
    monkeypatch.setattr(ExactProduct, "residues", lambda self: asked.append(len(self.moduli)) or real(self))
    got = rt.dgemm(a.T.copy(), b, c, trans_a="T", **kw)
    assert len(asked) == 1
    np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))
    for i, j in [(0, 0), (1, 2), (7, 11), (39, 29)]:
        exact = Fraction(1.5) * sum(Fraction(float(a[i, p])) * Fraction(float(b[p, j])) for p in range(70))
        exact += Fraction(-0.3) * Fraction(float(c[i, j]))
        assert got[i, j] == float(exact), (i, j)  # Fraction -> float rounds to nearest-even


@pytest.mark.parametrize("subscripts, shapes", [("ijab,abcd->ijcd", [(4, 4, 12, 12), (12, 12, 12, 12)]),
                                                ("ik,jk->ji", [(40, 700), (30, 700)]),
                                                ("kai,bk->aib", [(600, 4, 9), (20, 600)]),
                                                # mode products: the new axis last, first, or inside (no GEMM)
                                                ("bij,jk->bik", [(30, 20, 60), (60, 40)]),
                                                ("jk,bij->kbi", [(60, 40), (30, 20, 60)]),
                                                ("bij,ik->bkj", [(30, 20, 60), (20, 40)])])
@pytest.mark.parametrize("kind", ["uniform", "wide", "ints", "tiny"])
def test_einsum_products_on_the_wide_engine_give_the_int8_bits(subscripts, shapes, kind):
    # einsum's GEMM-shaped steps go through the same engine choice as dgemm (program.execute._engine_product)
    rng = np.random.default_rng(31)
    ops = [_data(rng, kind if i == 0 else "uniform", s) for i, s in enumerate(shapes)]
    old = cpu_gemm.ENGINE
    try:
        exact = [{"moduli": 40, "decode": "exact"}] if kind in ("uniform", "ints") else []  # (wide data: 'auto')
        for kw in [{}, {"moduli": "fast"}, {"moduli": 19}, {"moduli": "auto"}] + exact:
            got = []
            for engine in ("int8", "wide"):
                cpu_gemm.ENGINE = engine
                expr = rt.contract_expression(subscripts, shapes[0], ops[1], constants=[1], **kw)  # a constant too
                got.append((rt.einsum(subscripts, *ops, **kw), expr(ops[0])))
            for x, y in zip(*got):
                np.testing.assert_array_equal(x.view(np.int64), y.view(np.int64), err_msg=str(kw))
    finally:
        cpu_gemm.ENGINE = old


def test_an_exact_decode_takes_the_engine_values_without_planes(monkeypatch):
    # a GEMM-shaped einsum decoded exactly ('auto', decode='exact') asks the engine for its values (its decode), not
    # for residues decoded again; a chain whose product feeds another step asks for residues
    import rnstensor.contract.auto as auto
    from rnstensor.backends.cpu.backend import ExactProduct

    monkeypatch.setattr(cpu_gemm, "ENGINE", "wide")
    # (einsum's own exact plan: one GEMM's 'auto' is otherwise dgemm's 'auto', which runs the engine directly)
    monkeypatch.setattr(auto, "gemm_labels", lambda e: None)
    asked = []
    for name in ("residues", "decoded"):
        real = getattr(ExactProduct, name)
        monkeypatch.setattr(ExactProduct, name, lambda self, real=real, name=name: asked.append(name) or real(self))
    rng = np.random.default_rng(5)
    # (products of two tensors, not a tensor by a matrix: those are mode products, fused or not)
    a, b, c = (rng.standard_normal(s) for s in ((3, 2, 4, 5), (4, 5, 3, 2), (3, 2, 2, 2)))
    rt.einsum("ijab,abcd->ijcd", a, b, moduli="auto")
    rt.einsum("ijab,abcd->dcji", a, b, moduli=40, decode="exact")
    assert asked == ["decoded", "decoded"]
    asked.clear()
    y = rt.einsum("ijab,abcd->ijcd", a, b, moduli=40, decode=None)  # an RNSTensor: the planes
    assert asked == ["residues"] and isinstance(y, rt.RNSTensor)
    asked.clear()
    rt.einsum("ijab,abcd,cdkl->ijkl", a, b, c, moduli="auto", optimize=[(0, 1), (0, 1)])
    assert asked[:1] == ["residues"]  # the first product feeds the second


def _exact_product_oracle(A, B, ea, eb):
    """``round(2**(-ea_i - eb_j) * sum_k [a_ik 2**ea_i] [b_kj 2**eb_j])`` correctly rounded, in Python integers
    (``[.]`` rounds half to even, as the encode does)."""
    ia = [[round(Fraction(float(v)) * Fraction(2) ** int(e)) for v in row] for row, e in zip(A, ea)]
    ib = [[round(Fraction(float(B[r, j])) * Fraction(2) ** int(eb[j])) for j in range(B.shape[1])]
          for r in range(B.shape[0])]
    return np.array([[float(Fraction(sum(ia[i][r] * ib[r][j] for r in range(B.shape[0])))
                            / Fraction(2) ** int(ea[i] + eb[j])) for j in range(B.shape[1])]
                     for i in range(A.shape[0])])


@pytest.mark.parametrize("widths", [(70, 75, 83), (60, 61, 200), (83, 83, 90)])
def test_products_sharing_an_operand_are_each_products_own(widths):
    # exact_gemm_shared: one product on the narrowest width's integers of the shared operand, each wider width's
    # lifted from it (2**d times it, plus the entries rounded there): each the correctly rounded exact product, as
    # exact_gemm gives it alone; zeros, subnormals, an all-zero column, integers exact at every width, and shifts
    # of 0, 1, 5, 8 and 139 bits
    rng = np.random.default_rng(sum(widths))
    k, n = 40, 13
    A = [rng.standard_normal((m, k)) * np.exp(4 * rng.standard_normal((m, k))) for m in (3, 4, 2)]
    B = rng.standard_normal((k, n)) * np.exp(4 * rng.standard_normal((k, n)))
    B[:, 4] = 0.0
    B[3, :4] = (0.0, -0.0, 5e-324, -2.2e-308)
    B[::5, 9] = np.round(B[::5, 9] * 2**20)
    top = np.abs(B).max(axis=0)
    Eb = np.where(top > 0, np.frexp(top)[1], 0)
    eas = [(t - np.frexp(np.abs(a).max(axis=1))[1]).astype(np.int64) for a, t in zip(A, widths)]
    ebs = [np.where(top > 0, t - Eb, 0).astype(np.int64) for t in widths]
    bounds = [k * 4**t for t in widths]
    plans = [cpu_gemm.wide_plan(k, bd) for bd in bounds]
    got = cpu_gemm.exact_gemm_shared(A, B, eas, ebs, [t - widths[0] for t in widths], bounds, *plans[-1])
    for g, (mods, chunk) in enumerate(plans):
        assert np.array_equal(got[g], cpu_gemm.exact_gemm(A[g], B, eas[g], ebs[g], bounds[g], 1.0, mods, chunk))
        assert np.array_equal(got[g], _exact_product_oracle(A[g], B, eas[g], ebs[g]))
