"""rnstensor.reference: the exact chain against Fractions, the [2610.05059] datasets, the error metrics."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from oracle import to_float
from rnstensor.reference import (
    DATASETS,
    chain_operators,
    cycling_axes,
    dataset,
    error_metrics,
    exact_ints,
    exact_mode_chain,
    round_exact,
)

# ----- an independent exact chain: one Fraction per entry, explicit loops ----------------------


def fraction_chain(x, operators, axes, ndim):
    """``A_d x_{m_d} ( ... (A_1 x_{m_1} x))`` with ``fractions.Fraction`` (object array)."""
    v = np.empty(np.shape(x), dtype=object)
    for idx in np.ndindex(v.shape):
        v[idx] = Fraction(float(x[idx]))
    batch = v.ndim - ndim
    for A, ax in zip(operators, axes):
        a = batch + ax
        vm = np.moveaxis(v, a, -1)
        n_out, n_in = A.shape
        out = np.empty(vm.shape[:-1] + (n_out,), dtype=object)
        for idx in np.ndindex(vm.shape[:-1]):
            for j in range(n_out):
                out[idx + (j,)] = sum((Fraction(float(A[j, k])) * vm[idx + (k,)] for k in range(n_in)), Fraction(0))
        v = np.moveaxis(out, -1, a)
    return v


def as_fractions(ints, k):
    out = np.empty(ints.shape, dtype=object)
    for idx in np.ndindex(ints.shape):
        out[idx] = Fraction(int(ints[idx])) * Fraction(2) ** k
    return out


def wide_floats(rng, shape, lo=-60, hi=60):
    """Signed floats with random exponents, some zeros and a negative zero."""
    x = rng.uniform(-1, 1, shape) * np.exp2(rng.integers(lo, hi, shape))
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size)] = 0.0
    flat[rng.integers(0, flat.size)] = -0.0
    return x


CHAINS = [
    # (input shape, operator shapes, axes, ndim): batch axes lead; rectangular operators; revisited modes
    ((3, 4), [(2, 4)], [1], 2),
    ((2, 3, 2, 4), [(2, 3), (3, 4), (5, 2), (3, 2)], [0, 2, 0, 1], 3),
    ((2, 2, 2), [(2, 2)] * 5, [0, 1, 2, 0, 1], 3),
    ((1, 3, 3), [(3, 3), (2, 3), (4, 2)], [1, 0, 0], 2),
]


@pytest.mark.parametrize("case", range(len(CHAINS)))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_mode_chain_matches_fractions(case, seed):
    xshape, opshapes, axes, ndim = CHAINS[case]
    rng = np.random.default_rng(100 * case + seed)
    x = wide_floats(rng, xshape)
    ops = [wide_floats(rng, s, -20, 20) for s in opshapes]
    ints, k = exact_mode_chain(x, ops, axes, ndim=ndim)
    want = fraction_chain(x, ops, axes, ndim)
    assert ints.shape == want.shape
    got = as_fractions(ints, k)
    bad = [idx for idx in np.ndindex(want.shape) if got[idx] != want[idx]]
    assert not bad, f"{len(bad)} entries differ, first at {bad[0]}: {got[bad[0]]} != {want[bad[0]]}"
    # rounded once, correctly: the oracle's integer-only rounding of the same rationals
    r = round_exact(ints, k)
    expect = np.array([to_float(want[idx]) for idx in np.ndindex(want.shape)]).reshape(want.shape)
    assert np.array_equal(r, expect)


def test_exact_mode_chain_default_ndim_and_batch():
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, (2, 2, 2))
    A = rng.uniform(-1, 1, (2, 2))
    ints_a, k_a = exact_mode_chain(x, [A], [0], ndim=3)  # no batch: axis 0 is the leading axis
    ints_b, k_b = exact_mode_chain(x, [A], [0], ndim=2)  # axis 0 of the trailing two: the middle one
    fa = fraction_chain(x, [A], [0], 3)
    assert ints_a.shape == (2, 2, 2) and all(as_fractions(ints_a, k_a)[i] == fa[i] for i in np.ndindex(fa.shape))
    fb = fraction_chain(x, [A], [0], 2)
    assert all(as_fractions(ints_b, k_b)[i] == fb[i] for i in np.ndindex(fb.shape))
    # without ndim: max(axes) + 1 tensor axes, the rest a batch
    ints_c, k_c = exact_mode_chain(x, [A], [1])
    fc = fraction_chain(x, [A], [1], 2)
    assert all(as_fractions(ints_c, k_c)[i] == fc[i] for i in np.ndindex(fc.shape))


def test_round_exact_extremes():
    # overflow to inf, subnormal results, ties to even
    x = np.array([[1e300, -1e300]])
    ints, k = exact_mode_chain(x, [np.array([[1e300, 1e300], [1e300, 0.0]])], [1])
    r = round_exact(ints, k)
    assert r[0, 0] == 0.0 and r[0, 1] == math.inf
    ints, k = exact_mode_chain(np.array([[2.0**-1000, 0.0]]), [np.array([[2.0**-70, 0.0]])], [1])
    assert round_exact(ints, k)[0, 0] == 2.0**-1070  # subnormal, exact
    ints = np.array([2**53 + 1, 2**53 + 3, -(2**53) - 1], dtype=object)
    assert round_exact(ints, 0).tolist() == [2.0**53, 2.0**53 + 4, -(2.0**53)]


def test_exact_ints_is_normalized_and_exact():
    x = np.array([8.0, 0.75, -0.0, 2.0**-1074, -3.0 * 2.0**600])
    ints, k = exact_ints(x)
    assert [Fraction(int(v)) * Fraction(2) ** k for v in ints] == [Fraction(float(v)) for v in x]
    assert k == -1074
    ints, k = exact_ints(np.array([8.0, 24.0]))
    assert ints.tolist() == [1, 3] and k == 3
    ints, k = exact_ints(np.zeros(3))
    assert ints.tolist() == [0, 0, 0] and k == 0


def test_exact_mode_chain_bad_input():
    x = np.zeros((2, 3, 3))
    A = np.zeros((3, 3))
    with pytest.raises(ValueError, match="operators is empty"):
        exact_mode_chain(x, [], [])
    with pytest.raises(ValueError, match="axes"):
        exact_mode_chain(x, [A, A], [0])
    with pytest.raises(ValueError, match="out of range"):
        exact_mode_chain(x, [A], [3], ndim=3)
    with pytest.raises(ValueError, match=r"operators\[0\] must be a 2-D"):
        exact_mode_chain(x, [np.zeros(3)], [0])
    with pytest.raises(ValueError, match=r"operators\[1\] has 3 columns but tensor axis 0 has length 2"):
        exact_mode_chain(x, [np.zeros((2, 3)), A], [0, 0], ndim=2)
    with pytest.raises(ValueError, match="at least ndim=4"):
        exact_mode_chain(x, [A], [0], ndim=4)
    with pytest.raises(ValueError, match="finite"):
        exact_mode_chain(np.full((3, 3), np.nan), [A], [0])


# ----- datasets --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DATASETS)
def test_dataset_shape_dtype_and_seeding(name):
    X = dataset(name, count=5, n=4, rng=3)
    assert X.shape == (5, 4, 4, 4) and X.dtype == np.float64
    assert np.isfinite(X).all()
    assert np.array_equal(X, dataset(name, 5, 4, np.random.default_rng(3)))
    assert not np.array_equal(X, dataset(name, 5, 4, rng=4))
    assert dataset(name).shape == (32, 8, 8, 8)


def test_uniform_range():
    X = dataset("uniform", rng=0)
    assert X.min() >= -1.0 and X.max() < 1.0
    assert X.min() < -0.99 and X.max() > 0.99
    assert abs(float(np.mean(X))) < 0.05  # 16384 draws: sd of the mean ~0.005


def test_wide160_exponents_mantissas_signs():
    X = dataset("wide160", rng=0)
    a = np.abs(X)
    mant, ex = np.frexp(a)  # a = (2 mant) * 2**(ex - 1), 2 mant in [1, 2)
    m, k = 2 * mant, ex - 1
    assert m.min() >= 1.0 and m.max() < 2.0
    assert m.min() < 1.01 and m.max() > 1.99
    assert k.min() == -80 and k.max() == 80
    assert set(np.unique(k).tolist()) == set(range(-80, 81)), "every exponent of the inclusive span appears"
    neg = float(np.mean(X < 0))
    assert 0.45 < neg < 0.55
    # exactly a mantissa times a power of two: no rounding in the scaling
    assert np.array_equal(np.ldexp(m, k), a)


def test_smooth_is_eq29_with_documented_draws():
    count, n = 6, 5
    X = dataset("smooth", count, n, rng=11)
    g = np.random.default_rng(11)
    a = g.uniform(0.5, 2.0, count)
    phi = g.uniform(0.0, 2 * math.pi, (count, 2))
    c = g.uniform(0.5, 1.5, count)
    assert ((0.5 <= a) & (a < 2)).all() and ((0 <= phi) & (phi < 2 * math.pi)).all() and ((0.5 <= c) & (c < 1.5)).all()
    for t in range(count):
        for i in range(n):
            for j in range(n):
                for kk in range(n):
                    x, y, z = i / (n - 1), j / (n - 1), kk / (n - 1)
                    want = a[t] * math.sin(3 * x + phi[t, 0]) * math.cos(5 * y + phi[t, 1]) * math.exp(c[t] * z)
                    assert X[t, i, j, kk] == pytest.approx(want, rel=1e-14, abs=1e-15)


def test_smooth_is_separable_up_to_rounding():
    X = dataset("smooth", count=32, n=8, rng=0)
    assert np.abs(X).max() <= 2.0 * math.exp(1.5)
    for t in range(X.shape[0]):
        for mode in range(3):
            unfold = np.moveaxis(X[t], mode, 0).reshape(8, -1)
            s = np.linalg.svd(unfold, compute_uv=False)
            assert s[1] <= 1e-14 * s[0], (t, mode, s[:2])
        # rank one, entry by entry: X[i,j,k] X[0,0,0] = X[i,0,0] X[0,j,k] up to a few roundings
        T = X[t]
        if abs(T[0, 0, 0]) > 1e-3:
            lhs = T * T[0, 0, 0]
            rhs = T[:, :1, :1] * T[:1, :, :]
            assert np.allclose(lhs, rhs, rtol=1e-13, atol=1e-13 * np.abs(T).max() ** 2)


def test_chain_operators_and_axes():
    ops = chain_operators(4, n=3, rng=0)
    assert len(ops) == 4 and all(A.shape == (3, 3) and A.dtype == np.float64 for A in ops)
    g = np.random.default_rng(0)
    assert all(np.array_equal(A, g.uniform(-1, 1, (3, 3))) for A in ops)
    prefix = chain_operators(2, n=3, rng=0)
    assert all(np.array_equal(A, B) for A, B in zip(prefix, ops))
    big = np.concatenate([A.ravel() for A in chain_operators(50, rng=1)])
    assert big.min() >= -1 and big.max() < 1 and big.min() < -0.99 and big.max() > 0.99
    assert cycling_axes(8) == (0, 1, 2, 0, 1, 2, 0, 1)
    assert cycling_axes(1) == (0,)
    assert cycling_axes(5, ndim=2) == (0, 1, 0, 1, 0)


@pytest.mark.parametrize(
    "call, word",
    [
        (lambda: dataset("gauss"), "name"),
        (lambda: dataset("uniform", count=0), "count"),
        (lambda: dataset("uniform", count=2.5), "count"),
        (lambda: dataset("smooth", n=0), "n"),
        (lambda: dataset("uniform", rng="seed"), "rng"),
        (lambda: dataset("uniform", rng=-1), "rng"),
        (lambda: chain_operators(0), "d"),
        (lambda: chain_operators(3, n=-2), "n"),
        (lambda: cycling_axes(0), "d"),
        (lambda: cycling_axes(3, ndim=0), "ndim"),
    ],
)
def test_bad_arguments_name_themselves(call, word):
    with pytest.raises(ValueError, match=rf"^{word}\b"):
        call()


# ----- error metrics (Eq. 30-32) --------------------------------------------------------------


def test_error_metrics_hand_cases():
    assert error_metrics(np.ones(4), np.ones(4)) == {"normwise": 0.0, "max": 0.0, "median": 0.0}
    # eps = [0, 1/4, 1/2, 1]: even count, the median averages the middle two
    m = error_metrics([4.0, 5.0, 6.0, 8.0], [4.0, 4.0, 4.0, 4.0])
    assert m == {"normwise": 1.0, "max": 1.0, "median": 0.375}
    # signs: |diff| / |ref|; the normwise denominator is the largest |ref|
    m = error_metrics([-3.0, 8.0, 1.0], [-2.0, 8.0, 1.0])
    assert m == {"normwise": 1 / 8, "max": 0.5, "median": 0.0}
    # a zero reference entry contributes its absolute error (Eq. 31)
    m = error_metrics([1.0, 2.5, 1e-3], [1.0, 2.0, 0.0])
    assert m == {"normwise": 0.25, "max": 0.25, "median": 1e-3}
    m = error_metrics([0.0, 3.0, -0.5], [0.0, 0.0, 0.0])
    assert m == {"normwise": 3.0, "max": 3.0, "median": 0.5}
    # any shape; every entry counts once
    Y = np.array([[[1.0, 2.0]], [[3.0, 4.0]]])
    R = np.array([[[1.0, 2.0]], [[3.0, 2.0]]])
    assert error_metrics(Y, R) == {"normwise": 2 / 3, "max": 1.0, "median": 0.0}
    # results are plain floats
    assert all(type(v) is float for v in m.values())


def test_error_metrics_nonfinite_result_and_bad_input():
    m = error_metrics([np.nan, 1.0], [1.0, 1.0])
    assert math.isnan(m["normwise"]) and math.isnan(m["max"])
    m = error_metrics([np.inf, 1.0], [1.0, 1.0])
    assert m["normwise"] == math.inf
    with pytest.raises(ValueError, match="same shape"):
        error_metrics(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="Yref has 1 non-finite"):
        error_metrics(np.ones(2), [1.0, np.inf])
    with pytest.raises(ValueError, match="Yref is empty"):
        error_metrics(np.ones(0), np.ones(0))
