"""decode: 'exact' is correctly rounded (subnormals, ties, overflow); 'fp64' is faithfully rounded."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import (
    assert_bits_equal,
    crt,
    drop_all,
    max_abs,
    rand_ints,
    residues,
    to_float,

    value,
    values,
)

import rnstensor as rt

TINY = 2.0**-1074
MAXF = np.finfo(np.float64).max


def make(vals, basis, exp2=0, factor=1, active=None, bound=None, axes=None):
    vals = np.asarray(vals, dtype=object)
    active = basis.moduli if active is None else tuple(active)
    bound = max_abs(vals) if bound is None else bound
    axes = (None,) * vals.ndim if axes is None else axes
    return rt.RNSTensor(residues(vals, active), basis, active, bound, rt.Scale(exp2, factor, axes))


def decode_both(T):
    return rt.decode(T, mode="exact"), rt.decode(T, mode="fp64")


# ----- the oracle's rounding is CPython's correctly rounded conversion ----------------------------


def float_of_fraction(q: Fraction) -> float:
    try:
        return float(q)
    except OverflowError:
        return math.inf if q > 0 else -math.inf


@settings(max_examples=300)
@given(
    num=st.integers(-(2**200), 2**200),
    den_exp=st.integers(-1200, 1200),
    odd=st.integers(0, 2**60).map(lambda t: 2 * t + 1),
)
def test_oracle_rounding_agrees_with_cpython(num, den_exp, odd):
    for q in (Fraction(num) * Fraction(2) ** den_exp, Fraction(num * 2**den_exp if den_exp >= 0 else num, odd)):
        got, want = to_float(q), float_of_fraction(q)
        assert np.array([got]).view(np.uint64)[0] == np.array([want]).view(np.uint64)[0], (q, got, want)


# ----- 'exact' --------------------------------------------------------------------------------------


SUBNORMAL_CASES = [
    # (v, exp2, expected)
    (1, -1074, TINY),
    (3, -1075, 2 * TINY),  # 1.5 ulp: tie to even -> 2
    (5, -1075, 2 * TINY),  # 2.5 -> 2
    (7, -1075, 4 * TINY),  # 3.5 -> 4
    (1, -1075, 0.0),  # 0.5 -> 0 (even)
    (-1, -1075, -0.0),  # the correctly rounded negative underflow is -0.0
    (3, -1076, TINY),  # 0.75 -> 1
    (1, -1076, 0.0),  # 0.25 -> 0
    (-3, -1076, -TINY),
    (2**52 - 1, -1074, 2.0**-1022 - TINY),  # largest subnormal
    (2**53 - 1, -1075, 2.0**-1022),  # (2^52 - 1/2) ulp: tie, rounds to the even 2^52 = smallest normal
    (2**53 - 3, -1075, 2.0**-1022 - 2 * TINY),  # (2^52 - 3/2): tie, rounds to even 2^52 - 2
    (2**60 + 1, -1134, 2.0**-1074),  # 2^60 * 2^-1134 = 2^-1074, the +1 is far below
    (-(2**200), -1200, -(2.0**-1000)),
]

OVERFLOW_CASES = [
    (2**53 - 1, 971, MAXF),
    (2**54 - 1, 970, math.inf),  # halfway between MAX and 2^1024: ties to even = 2^1024 -> inf
    (-(2**54 - 1), 970, -math.inf),
    (2**54 - 3, 970, float.fromhex("0x1.ffffffffffffep+1023")),  # tie between odd and even: even
    (2**54 - 2, 970, MAXF),
    (1, 1024, math.inf),
    (1, 1023, 2.0**1023),
    (-1, 5000, -math.inf),
    (2**300, 800, math.inf),
    (0, 5000, 0.0),  # zero stays zero whatever the scale
    (0, -5000, 0.0),
]


@pytest.mark.parametrize("v, exp2, want", SUBNORMAL_CASES + OVERFLOW_CASES)
def test_exact_edges(v, exp2, want):
    B = rt.Basis.int8(49)
    T = make([v], B, exp2=exp2)
    assert value(v, 1, exp2) == want  # the oracle agrees with the literal (bits checked below)
    assert_bits_equal(rt.decode(T, mode="exact"), np.array([want]))
    assert_bits_equal(rt.decode(T, mode="exact"), np.array([value(v, 1, exp2)]))


def test_exact_edges_with_factor():
    """The factor is part of the single rounding: v*factor*2^e is rounded once, not v*2^e then *factor."""
    B = rt.Basis.int8(20)
    q = 3 * 5 * 7
    cases = [
        (2**53 + 1, q, -53),  # 105 * (2^53 + 1) needs 60 bits: one rounding of the whole product
        (1, 3, -1076),  # 0.75 ulp -> 1 ulp (v*2^e alone would round to 0)
        (1, 3**40, -1074 - 63),
        ((2**53 - 1) * 2, 2**970, 0),
        (2**53 + 1, 3, 0),  # 3 * (2^53 + 1) = 2^54 + 2^53 + 3: rounds to nearest once
    ]
    for v, f, e in cases:
        T = make([v, -v], B, exp2=e, factor=f)
        want = np.array([value(v, f, e), value(-v, f, e)])
        assert_bits_equal(rt.decode(T, mode="exact"), want)
        assert want[0] == to_float(Fraction(v * f) * Fraction(2) ** e)


@settings(max_examples=100)
@given(seed=st.integers(0, 2**64 - 1), s=st.integers(1, 49), data=st.data())
def test_exact_vs_fraction(seed, s, data):
    rng = random.Random(seed)
    B = rt.Basis.int8(s)
    k = data.draw(st.integers(1, s), label="active count")
    active = tuple(sorted(rng.sample(B.moduli, k), key=B.moduli.index))
    half = (math.prod(active) - 1) // 2
    bound = rng.randint(0, half) >> rng.randint(0, half.bit_length())
    shape = data.draw(st.sampled_from([(1,), (4,), (2, 3), (2, 1, 2)]), label="shape")
    v = rand_ints(rng, shape, bound)
    factor = rng.choice([1, 3, 255 * 253, 3**50, math.prod(rt.int8_pool()[-10:])])
    exp2 = data.draw(
        st.one_of(st.integers(-1200, 1100), st.integers(-1140, -1040), st.integers(900, 1030), st.integers(-80, 80)),
        label="exp2",
    )
    axvec = np.array([rng.randint(-40, 40) for _ in range(shape[-1])], dtype=np.int64)
    axes = (None,) * (len(shape) - 1) + (axvec,)
    T = make(v, B, exp2=exp2, factor=factor, active=active, bound=bound, axes=axes)
    exp = exp2 + np.asarray(axvec, dtype=object)  # broadcasts along the last axis
    assert_bits_equal(rt.decode(T, mode="exact"), values(v, factor, exp))


def test_exact_huge_integers_s49():
    B = rt.Basis.int8(49)
    half = (B.product - 1) // 2
    vals = np.array([half, -half, half - 1, 1, -1, 0, 2**300 + 1, -(2**341) // 3], dtype=object)
    for exp2 in (-1400, -1100, -700, -341, 0, 600, 683, 700):
        T = make(vals, B, exp2=exp2, bound=half)
        assert_bits_equal(rt.decode(T, mode="exact"), values(vals, 1, exp2))


def test_exact_after_drop_and_extension():
    B = rt.Basis.int8(15)
    rng = random.Random(3)
    v = rand_ints(rng, (3, 4), 2**100)
    T = make(v, B, exp2=-1100, bound=2**100)
    for count in (1, 5, 10):
        for X in (rt.drop(T, count), rt.drop(T, count, extend=True)):
            q = 1
            w = v
            act = list(B.moduli)
            for _ in range(count):
                p = min(act)
                act.remove(p)
                w = drop_all(w, p)
                q *= p
            assert X.scale.factor == q
            assert_bits_equal(rt.decode(X, mode="exact"), values(w, q, -1100))


# ----- 'fp64' ---------------------------------------------------------------------------------------


def faithful(q: Fraction) -> set:
    """The float64 values a faithful rounding of ``q`` may return: ``q`` itself if it is one, else its two neighbours.

    Beyond the largest float64 the neighbours are that float and infinity; a
    zero's sign is not part of the promise (both zeros compare equal).
    """
    c = to_float(q)
    if math.isinf(c):
        return {math.copysign(MAXF, c), c}
    if Fraction(c) == q:
        return {c}
    other = np.nextafter(c, math.inf if Fraction(c) < q else -math.inf)
    return {c, float(other)}


def assert_faithful(got, v, factor, exp2):
    for g, w, e in zip(np.ravel(got), np.ravel(np.asarray(v, dtype=object)), np.ravel(np.broadcast_to(exp2, np.shape(got)))):
        q = Fraction(int(w) * int(factor)) * Fraction(2) ** int(e)
        assert float(g) in faithful(q), (float(g), q, int(w), factor, int(e))


@settings(max_examples=150)
@given(seed=st.integers(0, 2**64 - 1), s=st.integers(1, 49), data=st.data())
def test_fp64_is_faithful(seed, s, data):
    """Any integer the planes hold, any factor, any exponent: 'fp64' is one of the two neighbours of the exact value.

    Results across the whole float64 range (subnormal, vanishing, overflowing)
    and factors wider than 53 bits (a drop's product of moduli).
    """
    rng = random.Random(seed)
    B = rt.Basis.int8(s)
    k = data.draw(st.integers(1, s), label="active count")
    active = B.moduli[:k]
    half = (math.prod(active) - 1) // 2
    bound = rng.randint(0, half) >> rng.randint(0, min(40, half.bit_length()))
    v = rand_ints(rng, (3, 3), bound)
    factor = rng.choice([1, 3, (1 << 53) - 1, 3**40, math.prod(rt.int8_pool()[-12:]), rng.randint(1, 2**200)])
    centre = -(math.prod(active).bit_length() + factor.bit_length()) // 2
    exp2 = rng.choice([rng.randint(-400, 400), rng.randint(-1200, -1000), rng.randint(900, 1100)]) + centre
    T = make(v, B, exp2=exp2, factor=factor, active=active, bound=bound)
    got = rt.decode(T, mode="fp64")
    assert got.dtype == np.float64 and got.shape == (3, 3)
    assert_bits_equal(rt.decode(T, mode="exact"), values(v, factor, exp2))
    assert_faithful(got, v, factor, exp2)


@settings(max_examples=200)
@given(
    w=st.integers(-(2**53) + 1, 2**53 - 1),
    shift=st.integers(0, 300),
    exp2=st.integers(-1074, 900),
    s=st.integers(8, 49),
    factor=st.sampled_from([1, 3, 255 * 253, (1 << 53) - 1]),
)
def test_fp64_exact_when_representable(w, shift, exp2, s, factor):
    """A float64 result comes back exactly, however many digits the integer has (1.0 * 1.0 gave 1 - 2 ulp)."""
    B = rt.Basis.int8(s)
    w //= factor  # w * factor: at most 53 bits
    shift = min(shift, max((B.product - 1) // 2 // max(abs(w), 1), 1).bit_length() - 1)
    T = make([w << shift], B, exp2=exp2 - shift, factor=factor)
    want = to_float(Fraction(w * factor) * Fraction(2) ** exp2)
    got = rt.decode(T, mode="fp64")
    assert float(got[0]) == want, (float(got[0]), want)


@settings(max_examples=100)
@given(
    v=st.lists(st.integers(-(2**53) + 1, 2**53 - 1), min_size=1, max_size=6),
    exp2=st.integers(-1120, 900),
    s=st.integers(8, 49),
)
def test_fp64_exact_for_53_bit_integers(v, exp2, s):
    """|v| < 2^53 and factor 1: every Horner step is exact, one rounding at the scaling -> correctly rounded."""
    B = rt.Basis.int8(s)
    T = make(v, B, exp2=exp2)
    want = values(np.array(v, dtype=object), 1, exp2)
    want[want == 0] = 0.0  # fp64 makes no promise about the sign of an underflowed zero
    got = rt.decode(T, mode="fp64")
    got[got == 0] = 0.0
    assert_bits_equal(got, want)


def test_fp64_and_exact_on_float_data():
    rng = np.random.default_rng(2)
    B = rt.Basis.int8(15)
    x = rng.standard_normal((4, 5))
    A = rng.standard_normal((3, 5))
    X = rt.encode(x, B, bits=53)
    Y = rt.mode_product(X, rt.encode(A, B, bits=53, shared_axes=(1,)), 1)
    ex, fp = decode_both(Y)
    assert_faithful(fp, rt.to_int(Y), Y.scale.factor, Y.exponent())
    np.testing.assert_allclose(ex, x @ A.T, rtol=1e-13, atol=1e-13)
    D = rt.drop(Y, 7, extend=True)
    ex, fp = decode_both(D)
    assert D.scale.factor.bit_length() > 53  # the product of the dropped moduli: f + g carries it
    assert_faithful(fp, rt.to_int(D), D.scale.factor, D.exponent())


def test_decode_shapes_and_dtype():
    B = rt.Basis.int8(6)
    for shape in [(), (1,), (2, 3), (2, 1, 3), (1, 1, 1, 2)]:
        x = np.arange(1, 1 + int(np.prod(shape, dtype=int)), dtype=np.float64).reshape(shape) / 8
        T = rt.encode(x, B, bits=30)
        for mode in ("exact", "fp64"):
            out = rt.decode(T, mode=mode)
            assert isinstance(out, np.ndarray) and out.dtype == np.float64 and out.shape == shape
            assert_bits_equal(out, x)
    assert_bits_equal(rt.decode(rt.encode(np.array([1.0]), B, bits=30)), np.array([1.0]))  # default 'fp64'


def test_negative_zero_policy():
    B = rt.Basis.int8(6)
    x = np.array([-0.0, 0.0, -1.0])
    T = rt.encode(x, B, bits=20)
    for mode in ("exact", "fp64"):
        assert_bits_equal(rt.decode(T, mode=mode), x)
    # arithmetic makes an integer zero, which decodes as +0.0
    S = rt.sub(T, T)
    for mode in ("exact", "fp64"):
        assert_bits_equal(rt.decode(S, mode=mode), np.zeros(3))


def test_to_int_is_the_crt_integer():
    rng = random.Random(4)
    B = rt.Basis.int8(30)
    for active in (B.moduli, B.moduli[:7], B.moduli[3:9], (255, 253)):
        half = (math.prod(active) - 1) // 2
        v = rand_ints(rng, (2, 3), half)
        T = make(v, B, active=active)
        got = rt.to_int(T)
        assert got.shape == (2, 3) and all(type(t) is int for t in got.reshape(-1))
        assert got.tolist() == crt(T.residues, active).tolist() == v.tolist()
    assert rt.to_int(make([5], B)).tolist() == [5]
    T0 = rt.encode(-2.5, B, bits=9)
    assert int(np.asarray(rt.to_int(T0)).reshape(-1)[0]) == -320  # 0-d: -2.5 * 2^(9 - 2)


def test_backends_decode_agree():
    rng = random.Random(8)
    B = rt.Basis.int8(20)
    half = (B.product - 1) // 2
    v = rand_ints(rng, (4, 5), half)
    for exp2 in (-1300, -1150, -200, 0, 400, 870):
        for active in (B.moduli, B.moduli[:9]):
            w = v if active == B.moduli else rand_ints(rng, (4, 5), (math.prod(active) - 1) // 2)
            T = make(w, B, exp2=exp2, factor=3**7, active=active)
            for mode in ("exact", "fp64"):
                assert_bits_equal(rt.decode(T, mode=mode), rt.decode(T, mode=mode, backend="numpy"))
