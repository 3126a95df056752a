"""encode: exponent per group (Alg. 5), round half to even, residues of every width, lossless round trips."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from oracle import (
    assert_bits_equal,
    centered,
    crt,
    encode_oracle,
    fits,
    max_abs,
    max_bits,
    residues,
    values,
)

import rnstensor as rt

FIG2 = rt.Basis((7, 5, 3))


def expected_decode(x, v, e):
    """decode('exact') of an encoding: v * 2^-e correctly rounded, -0.0 kept where x was -0.0."""
    want = values(v, 1, -np.asarray(e, dtype=object))
    x = np.asarray(x, dtype=np.float64)
    want[(x == 0) & np.signbit(x)] = -0.0
    return want


def check_encoding(x, basis, bits, shared_axes=None, T=None):
    """Every promise of encode, against the Fraction oracle. Returns (T, v, e)."""
    x64 = np.asarray(x).astype(np.float64)
    if T is None:
        T = rt.encode(x, basis, bits=bits, shared_axes=shared_axes)
    v, e = encode_oracle(x64, bits, shared_axes)
    assert isinstance(T, rt.RNSTensor)
    assert T.basis == basis
    assert T.active == basis.moduli
    assert T.shape == x64.shape and T.ndim == x64.ndim
    assert T.residues.dtype == np.int8 and T.residues.shape == (len(basis),) + x64.shape
    # residues bit for bit
    np.testing.assert_array_equal(T.residues, residues(v, basis.moduli))
    # the bound: |v| <= 2^bits, recorded exactly, and it fits the basis
    assert T.bound == 1 << bits
    assert max_abs(v) <= T.bound
    assert 2 * T.bound < math.prod(T.active)
    # the scale: factor 1, exponent -e for every entry
    assert T.scale.factor == 1
    got_e = np.broadcast_to(T.scale.exponent(), x64.shape)
    np.testing.assert_array_equal(got_e.astype(object), -e)
    # decode('exact') is v * 2^-e rounded once
    assert_bits_equal(rt.decode(T, mode="exact"), expected_decode(x64, v, e))
    return T, v, e


# ----- [2610.05059] Fig. 2 input --------------------------------------------------------------


def test_fig2_input():
    T = rt.encode(np.array([12.0]), FIG2, bits=4)
    assert T.residues[:, 0].tolist() == [-2, 2, 0]
    assert T.bound == 16
    assert T.scale.exp2 == 0 and T.scale.factor == 1
    assert rt.decode(T, mode="exact").tolist() == [12.0]


# ----- exponent per group ---------------------------------------------------------------------


def test_shared_none_one_exponent():
    x = np.array([[3.0, -0.75], [0.0, 1e-3]])
    T, v, e = check_encoding(x, rt.Basis.int8(8), 10)
    # max 3.0: 2^1 <= 3 < 2^2, E = 2, e = 8
    assert set(e.reshape(-1).tolist()) == {8}
    assert T.scale.exp2 == -8 and all(a is None for a in T.scale.axes) and T.scale.field is None
    assert v.tolist() == [[768, -192], [0, 0]]  # 1e-3 * 2^8 = 0.256 rounds to 0


def test_shared_rows_is_an_operator():
    x = np.array([[1.0, 0.5, -0.25], [96.0, -1.0, 3.0], [0.0, 0.0, 0.0], [2.0**-30, 0.0, -(2.0**-31)]])
    T, v, e = check_encoding(x, rt.Basis.int8(6), 7, shared_axes=(1,))
    # row exponents: E = 1, 7, zero row 0, -29  ->  e = 6, 0, 0, 36
    assert [e[i, 0] for i in range(4)] == [6, 0, 0, 36]
    assert T.scale.exp2 == 0 and T.scale.axes[1] is None and T.scale.field is None
    np.testing.assert_array_equal(T.scale.axes[0], [-6, 0, 0, -36])
    assert v[1].tolist() == [96, -1, 3] and v[3].tolist() == [64, 0, -32]
    assert v[2].tolist() == [0, 0, 0]


def test_shared_negative_axis_same_as_positive():
    x = np.random.default_rng(1).standard_normal((3, 4))
    A = rt.encode(x, 10, bits=20, shared_axes=(-1,))
    B = rt.encode(x, 10, bits=20, shared_axes=(1,))
    np.testing.assert_array_equal(A.residues, B.residues)
    np.testing.assert_array_equal(A.scale.exponent(), B.scale.exponent())


def test_shared_columns():
    x = np.array([[1.0, 100.0], [-3.0, 0.5]])
    T, v, e = check_encoding(x, rt.Basis.int8(5), 12, shared_axes=(0,))
    assert e[:, 0].tolist() == [10, 10] and e[:, 1].tolist() == [5, 5]


def test_shared_empty_tuple_every_entry():
    x = np.array([[1.0, 3.0, -0.1], [2.0**-1074, -0.0, 1e300]])
    T, v, e = check_encoding(x, rt.Basis.int8(15), 53, shared_axes=())
    assert_bits_equal(rt.decode(T, mode="exact"), x)


@pytest.mark.parametrize("shared", [None, (), (0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2), (-1, 0)])
def test_general_axes_3d(shared):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 4)) * np.exp2(rng.integers(-40, 40, size=(2, 3, 4)))
    x[1, 2, :] = 0.0
    x[0, :, 3] = 0.0
    check_encoding(x, rt.Basis.int8(12), 60, shared_axes=shared)


def test_zero_d_and_lists():
    check_encoding(np.float64(-2.5), rt.Basis.int8(4), 9)
    T = rt.encode(-2.5, rt.Basis.int8(4), bits=9)
    assert T.shape == () and rt.decode(T, mode="exact") == -2.5
    assert rt.decode(T, mode="fp64") == -2.5
    T = rt.encode([[1.5, 2.5]], rt.Basis.int8(4), bits=9)
    assert T.shape == (1, 2)
    assert rt.decode(T, mode="exact").tolist() == [[1.5, 2.5]]


# ----- rounding -------------------------------------------------------------------------------


def test_round_half_even_ties():
    # max 100 -> E = 7; bits 7 -> e = 0: the entries are rounded to integers
    x = np.array([100.0, 2.5, 3.5, -2.5, -3.5, 0.5, -0.5, 1.5, 0.49999999999999994, 4.5000000000000009])
    T, v, e = check_encoding(x, rt.Basis.int8(4), 7)
    assert v.tolist() == [100, 2, 4, -2, -4, 0, 0, 2, 0, 5]


def test_round_half_even_ties_wide():
    # ties at bits > 53: 2^70 + 0.5 is not a float, so build ties from small entries of a huge group
    big = 2.0**80  # E = 81; bits 60 -> e = -21: entries are rounded to multiples of 2^21
    x = np.array([big, 2.0**20, 3 * 2.0**20, -(2.0**20), 5 * 2.0**20, 2.0**20 + 2.0**-10])
    T, v, e = check_encoding(x, rt.Basis.int8(10), 60)
    assert v.tolist() == [2**59, 0, 2, 0, 2, 1]


def test_max_rounds_up_to_2_pow_bits():
    # just below 2^E rounds up to exactly 2^bits: the bound is attained
    x = np.array([np.nextafter(1.0, 0.0), -np.nextafter(1.0, 0.0), 0.25])
    T, v, e = check_encoding(x, rt.Basis.int8(3), 8)
    assert v.tolist() == [256, -256, 64]
    assert max_abs(v) == T.bound


@pytest.mark.parametrize("bits", [1, 2, 3])
def test_tiny_bits(bits):
    x = np.array([0.75, -0.5, 0.375, 0.25, -0.125, 0.0])
    check_encoding(x, rt.Basis((7, 5, 3)), bits)


# ----- widths and bases -----------------------------------------------------------------------


@pytest.mark.parametrize("s", range(2, 50))
def test_every_s(s):
    B = rt.Basis.int8(s)
    rng = np.random.default_rng(s)
    x = rng.standard_normal((3, 4)) * np.exp2(rng.integers(-30, 30, size=(3, 4)))
    bmax = min(max_bits(B.product), 120)
    for bits in sorted({1, max(1, bmax // 2), bmax}):
        check_encoding(x, B, bits, shared_axes=(1,))


@pytest.mark.parametrize("bits", range(1, 121))
def test_every_bits(bits):
    B = rt.Basis.int8(16)  # log2 P ~ 125.4
    rng = np.random.default_rng(bits)
    x = rng.standard_normal((2, 5)) * np.exp2(rng.integers(-70, 70, size=(2, 5)))
    x[0, 0] = -x[0, 0]
    check_encoding(x, B, bits, shared_axes=None)


def test_bits_at_basis_limit():
    for basis in (rt.Basis((7, 5, 3)), rt.Basis.int8(2), rt.Basis.int8(15), rt.Basis.int8(49)):
        b = max_bits(basis.product)  # the largest b with 2 * 2^b < P
        x = np.array([1.0, -1.0 / 3.0, 0.7])
        check_encoding(x, basis, b)
        with pytest.raises(rt.RNSRangeError):
            rt.encode(x, basis, bits=b + 1)


# ----- lossless round trips -------------------------------------------------------------------

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
subnormal = st.floats(min_value=-(2.0**-1022), max_value=2.0**-1022, allow_nan=False, allow_subnormal=True)
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3)


@settings(max_examples=100)
@given(x=hnp.arrays(np.float64, shapes, elements=finite | subnormal))
def test_roundtrip_per_entry_53_bits(x):
    """Any finite float64 (subnormals, -0.0, 2^±1000) fits 53 bits relative to its own exponent."""
    T = rt.encode(x, 15, bits=53, shared_axes=())
    assert_bits_equal(rt.decode(T, mode="exact"), x)
    assert_bits_equal(rt.decode(T, mode="fp64"), x)


@settings(max_examples=80)
@given(
    x=hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=2, max_side=4), elements=finite | subnormal),
    data=st.data(),
)
def test_encode_matches_oracle(x, data):
    s = data.draw(st.integers(2, 49), label="s")
    B = rt.Basis.int8(s)
    bits = data.draw(st.integers(1, min(120, max_bits(B.product))), label="bits")
    shared = data.draw(st.sampled_from([None, ()] + [(a,) for a in range(x.ndim)]), label="shared_axes")
    T, v, e = check_encoding(x, B, bits, shared)
    if fits(x, e):
        assert_bits_equal(rt.decode(T, mode="exact"), x)


@settings(max_examples=50)
@given(seed=st.integers(0, 2**32 - 1), shift=st.integers(0, 66), top=st.integers(-1000, 1000))
def test_roundtrip_wide_bits_shared_exponent(seed, shift, top):
    """bits=120 with one exponent: data spanning 67 binades (and shifted by 2^±1000) comes back exactly."""
    rng = random.Random(seed)
    n = 8
    m = [rng.randrange(1, 2**53) for _ in range(n)]
    sh = [rng.randint(0, shift) for _ in range(n)]
    x = np.array([math.ldexp(mi, top - 52 - si) * rng.choice((-1, 1)) for mi, si in zip(m, sh)])
    x[0] = math.ldexp(2**53 - 1, top - 52)  # the group maximum, E = top + 1
    assume(np.isfinite(x).all() and (x != 0).all())
    B = rt.Basis.int8(16)
    T, v, e = check_encoding(x, B, 120)
    assert fits(x, e)
    assert_bits_equal(rt.decode(T, mode="exact"), x)


def test_zeros():
    for shared in (None, (), (0,), (1,)):
        x = np.zeros((2, 3))
        T, v, e = check_encoding(x, rt.Basis.int8(5), 20, shared)
        assert not T.residues.any()
        assert (np.broadcast_to(T.scale.exponent(), x.shape) == 0).all()
        assert_bits_equal(rt.decode(T, mode="fp64"), x)


def test_signed_zeros():
    x = np.array([[-0.0, 0.0, 1.0], [-0.0, -0.0, -0.0]])
    for shared in (None, (), (1,)):
        T = rt.encode(x, 6, bits=30, shared_axes=shared)
        assert not T.residues[:, x == 0].any()
        assert_bits_equal(rt.decode(T, mode="exact"), x)
        assert_bits_equal(rt.decode(T, mode="fp64"), x)
        assert_bits_equal(rt.decode(rt.base_extend(T), mode="exact"), x)


def test_subnormals_and_extremes():
    tiny = 2.0**-1074
    x = np.array([tiny, -tiny, 3 * tiny, 2.0**-1022 - tiny, -(2.0**-1030) * 1.5, 2.0**-1022])
    check_encoding(x, rt.Basis.int8(15), 53, None)
    T, _, e = check_encoding(x, rt.Basis.int8(15), 53, ())
    assert_bits_equal(rt.decode(T, mode="exact"), x)
    y = np.array([2.0**1000, -(2.0**-1000), 2.0**1023 * 1.9999999999999998, np.finfo(np.float64).max, 2.0**-1000])
    T, _, _ = check_encoding(y, rt.Basis.int8(15), 53, ())
    assert_bits_equal(rt.decode(T, mode="exact"), y)
    check_encoding(y, rt.Basis.int8(15), 53, None)  # one exponent: the small ones round to 0
    check_encoding(np.array([2.0**1000, 2.0**-1000]), rt.Basis.int8(49), 120, None)


def test_group_of_subnormals_wide_bits():
    # the whole group is subnormal: e = bits - E is large and positive; entries are integers times 2^k, k > 0
    tiny = 2.0**-1074
    x = np.array([5 * tiny, -tiny, 0.0, 2.0**-1040])
    T, v, e = check_encoding(x, rt.Basis.int8(16), 120)
    assert_bits_equal(rt.decode(T, mode="exact"), x)


# ----- dtypes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_narrow_floats_widened(dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 4)) * 100).astype(dtype)
    x[0, 0] = np.finfo(dtype).smallest_subnormal
    x[0, 1] = -np.finfo(dtype).max
    x[0, 2] = -0.0
    T = rt.encode(x, 10, bits=40, shared_axes=())
    U = rt.encode(x.astype(np.float64), 10, bits=40, shared_axes=())
    np.testing.assert_array_equal(T.residues, U.residues)
    np.testing.assert_array_equal(T.scale.exponent(), U.scale.exponent())
    check_encoding(x, rt.Basis.int8(10), 40, (), T=T)
    out = rt.decode(T, mode="exact")
    assert out.dtype == np.float64
    assert_bits_equal(out, x.astype(np.float64))


def test_basis_forms():
    x = np.array([1.25, -7.5])
    a = rt.encode(x, 15, bits=20)
    b = rt.encode(x, rt.Basis.int8(15), bits=20)
    c = rt.encode(x, rt.int8_pool()[:15], bits=20)
    d = rt.encode(x, list(rt.int8_pool()[:15]), bits=20)
    for t in (b, c, d):
        assert t.basis == a.basis
        np.testing.assert_array_equal(t.residues, a.residues)
    assert rt.encode(x, np.int64(15), bits=20).basis == a.basis


def test_bits_numpy_integer_accepted():
    x = np.array([1.25, -7.5])
    a = rt.encode(x, 15, bits=np.int64(20))
    assert a.bound == 2**20


# ----- backends agree -------------------------------------------------------------------------


@pytest.mark.parametrize("bits,shared", [(53, ()), (30, (1,)), (100, None), (116, ())])
def test_numpy_backend_matches_default(bits, shared):
    rng = np.random.default_rng(bits)
    x = rng.standard_normal((4, 5)) * np.exp2(rng.integers(-60, 60, size=(4, 5)))
    x[0, 0], x[1, 1], x[2, 2] = 0.0, -0.0, 2.0**-1074
    d = rt.encode(x, 15, bits=bits, shared_axes=shared)
    n = rt.encode(x, 15, bits=bits, shared_axes=shared, backend="numpy")
    np.testing.assert_array_equal(d.residues, n.residues)
    assert d.bound == n.bound
    np.testing.assert_array_equal(d.scale.exponent(), n.scale.exponent())
    for mode in ("fp64", "exact"):
        assert_bits_equal(rt.decode(d, mode=mode), rt.decode(n, mode=mode, backend="numpy"))


# ----- the oracle itself ----------------------------------------------------------------------


def test_oracle_self_check():
    # the independent CRT inverts the independent residues
    vals = np.array([0, 1, -1, 52, -52, 37], dtype=object)
    assert crt(residues(vals, (7, 5, 3)), (7, 5, 3)).tolist() == vals.tolist()
    assert centered(24, 7) == 3 and centered(24, 5) == -1 and centered(2, 4) == -2 and centered(1, 4) == 1
    v, e = encode_oracle(np.array([12.0]), 4, None)
    assert v.tolist() == [12] and e.tolist() == [0]
    assert Fraction(2) ** 3 == 8


def test_exact_bits_needed_on_the_cpu_scan_matches_the_entrywise_rule():
    # the CPU path (groups as rows, the GEMM's one-pass scan) against the rule entry by entry (entry_stats)
    import itertools

    from rnstensor.encode import _NONE, entry_stats, exact_bits_needed

    def rule(x, shared):
        _, E, lsb = entry_stats(x)
        nz = x != 0
        Emax = np.max(np.where(nz, E, _NONE), axis=shared, keepdims=True) if shared else E
        return max(int(np.where(nz, Emax - lsb, 1).max()), 1)

    rng = np.random.default_rng(12)
    for trial in range(120):
        shape = tuple(int(n) for n in rng.integers(1, 5, rng.integers(1, 4)))
        x = rng.standard_normal(shape) * 2.0 ** rng.integers(-1074, 1000, shape).astype(float)
        x = np.where(rng.random(shape) < 0.3, 0.0, x)
        if trial % 5 == 0:
            x = np.round(x * 8)  # integers, and zeros
        if trial % 7 == 0:
            x.flat[0] = 5e-324  # the least subnormal
        for r in range(x.ndim + 1):
            for shared in itertools.combinations(range(x.ndim), r):
                assert exact_bits_needed(x, shared) == rule(x, shared), (x, shared)
