"""The residue primitives against Python-int arithmetic: residues bit for bit, bounds, exact scales.

Tensors are built two ways: from float data through ``encode`` (the public
path) and directly from Python ints through the ``RNSTensor`` constructor
(arbitrary magnitudes up to the basis range, arbitrary scales). The expected
values come from ``tests/oracle.py`` only.
"""

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
    centered,
    contract,
    crt,
    drop_all,
    drop_int,
    encode_oracle,
    max_abs,
    obj,
    rand_ints,
    residues,
    values,
)

import rnstensor as rt

FIG2 = rt.Basis((7, 5, 3))
SPREAD = (2, 3, 4, 7, 12, 15, 16, 23, 31, 40, 48, 49)


# ----- helpers ----------------------------------------------------------------------------------


def make(vals, basis, bound=None, active=None, scale=None):
    """An RNSTensor holding the Python ints ``vals`` (residues from the oracle)."""
    vals = np.asarray(vals, dtype=object)
    active = basis.moduli if active is None else tuple(active)
    bound = max_abs(vals) if bound is None else bound
    scale = rt.Scale.unit(vals.ndim) if scale is None else scale
    return rt.RNSTensor(residues(vals, active), basis, active, bound, scale)


def check_ints(T, vals, active=None):
    """T holds exactly ``vals``: residues bit for bit on T.active, bound respected and in range."""
    vals = np.asarray(vals, dtype=object)
    if active is not None:
        assert T.active == tuple(active)
    assert T.residues.dtype == np.int8
    assert T.shape == vals.shape
    np.testing.assert_array_equal(T.residues, residues(vals, T.active))
    assert max_abs(vals) <= T.bound, (max_abs(vals), T.bound)
    assert 2 * T.bound < math.prod(T.active)
    T.validate()
    # the independent CRT agrees (the integer is determined by the residues)
    assert crt(T.residues, T.active).tolist() == vals.tolist()


def full_exponent(T) -> np.ndarray:
    """T's exponent for every entry, as an object array of the full shape."""
    return obj(np.broadcast_to(T.scale.exponent(), T.shape))


def check_value(T, vals, factor, exp):
    """decode('exact') is the correctly rounded ``vals * factor * 2^exp``."""
    assert T.scale.factor == factor
    np.testing.assert_array_equal(full_exponent(T), np.broadcast_to(np.asarray(exp, dtype=object), T.shape))
    assert_bits_equal(rt.decode(T, mode="exact"), values(vals, factor, exp))


def random_bound(rng: random.Random, limit: int) -> int:
    """A bound in [0, limit], log-uniform-ish, with the edges likely."""
    if limit <= 0:
        return 0
    c = rng.random()
    if c < 0.15:
        return limit
    if c < 0.2:
        return rng.randint(0, min(limit, 3))
    return rng.randint(0, (1 << rng.randint(0, limit.bit_length())) - 1) % (limit + 1)


def random_scale(rng: random.Random, shape, no_pending=(), allow_field=True):
    """A random exact Scale for ``shape`` and its per-entry exponent (object array)."""
    nd = len(shape)
    exp2 = rng.randint(-40, 40)
    factor = rng.choice([1, 1, 3, 256 * 255, 7**30])
    axes = [None] * nd
    e = np.full(shape, exp2, dtype=object)
    for a in range(nd):
        if a not in no_pending and rng.random() < 0.4:
            vec = np.array([rng.randint(-30, 30) for _ in range(shape[a])], dtype=np.int64)
            axes[a] = vec
            idx = [None] * nd
            idx[a] = slice(None)
            e = e + obj(vec)[tuple(idx)]
    field = None
    if allow_field and nd and rng.random() < 0.3:
        fshape = tuple(1 if (a in no_pending or rng.random() < 0.5) else n for a, n in enumerate(shape))
        field = np.array([rng.randint(-20, 20) for _ in range(int(np.prod(fshape)))], dtype=np.int64).reshape(fshape)
        e = e + obj(field)
    return rt.Scale(exp2, factor, tuple(axes), field), np.broadcast_to(e, shape)


shape_st = st.lists(st.integers(1, 3), min_size=1, max_size=4).map(tuple)


# ----- [2610.05059] Fig. 2 --------------------------------------------------------------------------


@pytest.mark.parametrize("v, doubled, dropped, extended, decoded", [
    (12.0, (3, -1, 0), (1, -2), (1, -2, -1), 24.0),
    (13.0, None, None, None, 27.0),
])
def test_fig2(v, doubled, dropped, extended, decoded):
    T = rt.encode(np.array([v]), FIG2, bits=4)
    assert T.scale.exp2 == 0  # 2^3 <= v < 2^4: e = 4 - 4 = 0
    op = rt.encode(np.array([[2.0]]), FIG2, bits=2, shared_axes=(1,))
    assert op.scale.exponent().reshape(-1).tolist() == [0] and rt.operator_row_sums(op) == (2,)
    D = rt.mode_product(T, op, 0)
    w = int(2 * v)
    assert D.bound == 32
    check_ints(D, [w], FIG2.moduli)
    if doubled is not None:
        assert tuple(D.residues[:, 0].tolist()) == doubled
    for mode in ("exact", "fp64"):
        assert rt.decode(D, mode=mode).tolist() == [2 * v]
    R = rt.drop(D)
    assert R.active == (7, 5) and R.scale.factor == 3 and R.bound == 32 // 3 + 1
    q = drop_int(w, 3)
    check_ints(R, [q])
    if dropped is not None:
        assert tuple(R.residues[:, 0].tolist()) == dropped and q == 8
    E = rt.base_extend(R)
    assert E.active == (7, 5, 3) and E.scale.factor == 3 and E.bound == R.bound
    check_ints(E, [q])
    if extended is not None:
        assert tuple(E.residues[:, 0].tolist()) == extended
    for X in (R, E, rt.drop(D, extend=True)):
        for mode in ("exact", "fp64"):
            assert_bits_equal(rt.decode(X, mode=mode), np.array([decoded]))


# ----- mode_product ---------------------------------------------------------------------------


@settings(max_examples=150)
@given(seed=st.integers(0, 2**64 - 1), s=st.integers(2, 49), shape=shape_st, data=st.data())
def test_mode_product_vs_python_ints(seed, s, shape, data):
    rng = random.Random(seed)
    B = rt.Basis.int8(s)
    nd = len(shape)
    axis = data.draw(st.integers(-nd, nd - 1), label="axis")
    a = axis % nd
    n_in = shape[a]
    n_out = data.draw(st.integers(1, 4), label="n_out")
    # T may hold fewer moduli than the basis (after a drop); the operator holds them all
    k = data.draw(st.integers(1, s), label="active count")
    active = B.moduli[:k] if rng.random() < 0.5 else tuple(sorted(rng.sample(B.moduli, k), key=B.moduli.index))
    P = math.prod(active)
    half = (P - 1) // 2  # the largest bound with 2*bound < P
    op_bits = rng.randint(0, max(0, min(60, half.bit_length() - 2)))
    A = rand_ints(rng, (n_out, n_in), (1 << op_bits) - 1 if op_bits else rng.randint(0, 1), edges=rng.random() < 0.5)
    rho = max(sum(abs(int(x)) for x in row) for row in A)
    Tb = random_bound(rng, half // rho if rho else half)
    v = rand_ints(rng, shape, Tb)
    tscale, texp = random_scale(rng, shape, no_pending=(a,))
    T = make(v, B, bound=Tb, active=active, scale=tscale)
    row_e = np.array([rng.randint(-25, 25) for _ in range(n_out)], dtype=np.int64)
    op_exp2, op_factor = rng.randint(-10, 10), rng.choice([1, 5])
    op = make(A, B, bound=max(max_abs(A), 1), scale=rt.Scale(op_exp2, op_factor, (row_e, None)))

    R = rt.mode_product(T, op, axis)

    w = contract(A, v, a)
    check_ints(R, w, active)
    assert R.bound == Tb * rho  # B' = B * rho ([2610.05059] Eq. 21-22), exactly
    assert R.basis == B
    # scale: scalar parts multiply, the operator's row exponents become the pending scale of the axis
    assert R.scale.exp2 == tscale.exp2 + op_exp2
    np.testing.assert_array_equal(R.scale.axes[a], row_e)
    for b in range(nd):
        if b != a:
            assert (R.scale.axes[b] is None) == (tscale.axes[b] is None)
    base = np.take(texp, [0], axis=a)  # constant along the contracted axis
    idx = [None] * nd
    idx[a] = slice(None)
    exp = np.broadcast_to(base, w.shape) + obj(row_e)[tuple(idx)] + op_exp2
    check_value(R, w, tscale.factor * op_factor, exp)


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4), (2, 1, 3, 2)])
def test_mode_product_every_axis_float_data(shape):
    """Encoded float data and a rectangular encoded operator, on every axis (batch axes untouched)."""
    rng = np.random.default_rng(len(shape))
    B = rt.Basis.int8(15)
    x = rng.standard_normal(shape)
    X = rt.encode(x, B, bits=40)
    vx, ex = encode_oracle(x, 40, None)
    for a in range(len(shape)):
        for n_out in (1, 2, 5):
            Af = rng.standard_normal((n_out, shape[a])) * np.exp2(rng.integers(-5, 5, size=(n_out, 1)))
            op = rt.encode(Af, B, bits=30, shared_axes=(1,))
            va, ea = encode_oracle(Af, 30, (1,))
            R = rt.mode_product(X, op, a)
            assert R.shape == shape[:a] + (n_out,) + shape[a + 1 :]
            w = contract(va, vx, a)
            check_ints(R, w)
            rho = max(sum(abs(int(t)) for t in row) for row in va)
            assert R.bound == X.bound * rho
            idx = [None] * len(shape)
            idx[a] = slice(None)
            exp = -ex.reshape(-1)[0] - obj(ea[:, 0])[tuple(idx)]
            check_value(R, w, 1, np.broadcast_to(exp, w.shape))
            # and the value is close to the float64 contraction
            ref = np.moveaxis(np.tensordot(Af, x, axes=([1], [a])), 0, a)
            np.testing.assert_allclose(rt.decode(R, mode="exact"), ref, rtol=1e-6, atol=1e-6)


def test_mode_product_chain_with_fold_pending():
    """Two products along one axis: the pending row scale is folded into the next operator's columns."""
    rng = np.random.default_rng(11)
    B = rt.Basis.int8(20)
    x = rng.standard_normal((3, 4))
    A1 = rng.standard_normal((4, 4)) * np.exp2(rng.integers(-8, 8, size=(4, 1)))
    A2 = rng.standard_normal((2, 4))
    X = rt.encode(x, B, bits=30)
    op1 = rt.encode(A1, B, bits=20, shared_axes=(1,))
    Y = rt.mode_product(X, op1, 1)
    with pytest.raises(ValueError, match="pending"):
        rt.mode_product(Y, rt.encode(A2, B, bits=20, shared_axes=(1,)), 1)
    pend = Y.scale.axes[1].copy()
    c = int(pend.max())
    A_eff, Y0 = rt.fold_pending(Y, A2, 1)
    # A_eff[:, k] = A2[:, k] * 2^(pend[k] - c) exactly; the common 2^c moves to the scalar exponent
    for j in range(2):
        for k in range(4):
            assert Fraction(float(A_eff[j, k])) == Fraction(float(A2[j, k])) * Fraction(2) ** (int(pend[k]) - c)
    assert Y0.scale.axes[1] is None
    assert Y0.scale.exp2 == Y.scale.exp2 + c
    np.testing.assert_array_equal(Y0.residues, Y.residues)
    assert Y0.bound == Y.bound
    op2 = rt.encode(A_eff, B, bits=20, shared_axes=(1,))
    Z = rt.mode_product(Y0, op2, 1)
    # oracle: v1 = ints of x, a1 / a2 ints of A1 / A_eff
    vx, ex = encode_oracle(x, 30, None)
    va1, ea1 = encode_oracle(A1, 20, (1,))
    va2, ea2 = encode_oracle(A_eff, 20, (1,))
    w = contract(va2, contract(va1, vx, 1), 1)
    check_ints(Z, w)
    exp = -ex.reshape(-1)[0] + c - obj(ea2[:, 0])[None, :]
    check_value(Z, w, 1, np.broadcast_to(exp, w.shape))
    ref = x @ A1.T @ A2.T
    np.testing.assert_allclose(rt.decode(Z, mode="exact"), ref, rtol=1e-5)
    # no pending scale: returned unchanged
    A_same, X_same = rt.fold_pending(X, A2[:, :4], 1)
    assert X_same is X and np.array_equal(A_same, A2)


def test_fold_pending_not_exact_raises():
    B = rt.Basis.int8(6)
    T = make(np.array([[1, 2]], dtype=object), B, scale=rt.Scale(0, 1, (None, np.array([1100, 0]))))
    with pytest.raises(ValueError, match="underflow|exact"):
        rt.fold_pending(T, np.array([[1.0, 1.0]]), 1)
    T = make(np.array([[1, 2]], dtype=object), B, scale=rt.Scale(0, 1, (None, np.array([-80, 0]))))
    with pytest.raises(ValueError, match="underflow|exact"):
        rt.fold_pending(T, np.array([[2.0**-1000, 1.0]]), 1)


def test_mode_product_zero_operator_and_zero_tensor():
    B = rt.Basis.int8(4)
    T = make(rand_ints(random.Random(1), (3, 2), 1000), B)
    op = make(np.zeros((2, 3), dtype=object), B)
    R = rt.mode_product(T, op, 0)
    check_ints(R, np.zeros((2, 2), dtype=object))
    assert R.bound == 0
    Z = make(np.zeros((3, 2), dtype=object), B, bound=0)
    check_ints(rt.mode_product(Z, make(rand_ints(random.Random(2), (4, 3), 99), B), 0), np.zeros((4, 2), dtype=object))


def test_mode_product_operator_row_sums():
    B = rt.Basis.int8(5)
    A = np.array([[3, -4, 0], [-1, -1, -1]], dtype=object)
    op = make(A, B)
    assert rt.operator_row_sums(op) == (7, 3)
    T = make(np.array([[5], [-5], [2]], dtype=object), B, bound=5)
    R = rt.mode_product(T, op, 0)
    assert R.bound == 35
    check_ints(R, [[35], [-2]])


def test_mode_product_dropped_operator_on_full_tensor_refused():
    B = rt.Basis.int8(5)
    q = B.moduli[-1]  # 247, the smallest
    op = rt.drop(make(np.array([[1000, -2000]], dtype=object), B))
    assert op.active == B.moduli[:-1] and op.scale.factor == q
    T = make(np.array([1, 2], dtype=object), B)
    with pytest.raises(ValueError, match="base_extend"):
        rt.mode_product(T, op, 0)
    # extended again, it works
    R = rt.mode_product(T, rt.base_extend(op), 0)
    check_ints(R, [drop_int(1000, q) * 1 + drop_int(-2000, q) * 2])
    assert R.scale.factor == q
    # the other way round: a dropped T, a full operator -> the product on T's moduli
    R = rt.mode_product(rt.drop(T, 0), make(np.array([[1000, -2000]], dtype=object), B), 0)
    check_ints(R, [1000 - 4000], B.moduli)


# ----- hadamard ---------------------------------------------------------------------------------


@settings(max_examples=100)
@given(seed=st.integers(0, 2**64 - 1), s=st.integers(2, 49), shape=shape_st, data=st.data())
def test_hadamard_vs_python_ints(seed, s, shape, data):
    rng = random.Random(seed)
    B = rt.Basis.int8(s)
    nd = len(shape)
    fnd = data.draw(st.integers(1, nd), label="field ndim")
    fshape = tuple(n if rng.random() < 0.7 else 1 for n in shape[nd - fnd :])
    k = data.draw(st.integers(1, s), label="active count")
    active = B.moduli[:k]
    half = (math.prod(active) - 1) // 2
    Fb = random_bound(rng, half)
    Tb = random_bound(rng, half // Fb if Fb else half)
    v = rand_ints(rng, shape, Tb)
    f = rand_ints(rng, fshape, Fb)
    tscale, texp = random_scale(rng, shape)
    fscale, fexp = random_scale(rng, fshape)
    T = make(v, B, bound=Tb, active=active, scale=tscale)
    F = make(f, B, bound=Fb, active=B.moduli if rng.random() < 0.5 else active, scale=fscale)

    R = rt.hadamard(T, F)

    w = v * f  # numpy broadcasting on Python ints
    assert R.shape == shape
    check_ints(R, w, active)
    assert R.bound == Tb * Fb
    check_value(R, w, tscale.factor * fscale.factor, texp + fexp)


def test_hadamard_float_field_broadcast():
    rng = np.random.default_rng(5)
    B = rt.Basis.int8(12)
    x = rng.standard_normal((2, 3, 4))
    g = rng.standard_normal((3, 4)) * np.exp2(rng.integers(-20, 20, size=(3, 4)))
    X = rt.encode(x, B, bits=30, shared_axes=(0, 2))  # one exponent per index of axis 1
    G = rt.encode(g, B, bits=25, shared_axes=())  # one per entry: a field
    R = rt.hadamard(X, G)
    vx, ex = encode_oracle(x, 30, (0, 2))
    vg, eg = encode_oracle(g, 25, ())
    w = vx * vg
    check_ints(R, w)
    check_value(R, w, 1, -(ex + eg))
    np.testing.assert_allclose(rt.decode(R, mode="exact"), x * g, rtol=1e-7)


# ----- add / sub --------------------------------------------------------------------------------


@settings(max_examples=80)
@given(seed=st.integers(0, 2**64 - 1), s=st.integers(2, 49), shape=shape_st, subtract=st.booleans())
def test_add_sub_vs_python_ints(seed, s, shape, subtract):
    rng = random.Random(seed)
    B = rt.Basis.int8(s)
    k = rng.randint(1, s)
    active = B.moduli[:k]
    half = (math.prod(active) - 1) // 2
    b1 = random_bound(rng, half)
    b2 = random_bound(rng, half - b1)
    scale, exp = random_scale(rng, shape)
    v, u = rand_ints(rng, shape, b1), rand_ints(rng, shape, b2)
    T = make(v, B, bound=b1, active=active, scale=scale)
    U = make(u, B, bound=b2, active=active, scale=rt.Scale(scale.exp2, scale.factor, scale.axes, scale.field))
    R = rt.sub(T, U) if subtract else rt.add(T, U)
    w = v - u if subtract else v + u
    check_ints(R, w, active)
    assert R.bound == b1 + b2
    check_value(R, w, scale.factor, exp)


def test_add_sub_encoded():
    x = np.array([[1.5, -2.25], [0.0, 3.0]])
    y = np.array([[0.5, 0.25], [-1.0, 3.0]])
    XY = rt.encode(np.stack([x, y]), 15, bits=50, shared_axes=None)
    X = rt.encode(x, 15, bits=50)
    Y = rt.encode(y, 15, bits=50)
    assert X.scale.exp2 == Y.scale.exp2  # same E: same scale
    assert_bits_equal(rt.decode(rt.add(X, Y), mode="exact"), x + y)
    assert_bits_equal(rt.decode(rt.sub(X, Y), mode="exact"), x - y)
    assert_bits_equal(rt.decode(rt.sub(X, X), mode="exact"), np.zeros((2, 2)))
    assert XY.shape == (2, 2, 2)


# ----- drop / base_extend ---------------------------------------------------------------------------


@settings(max_examples=100)
@given(seed=st.integers(0, 2**64 - 1), s=st.integers(2, 49), shape=shape_st, data=st.data())
def test_drop_vs_python_ints(seed, s, shape, data):
    rng = random.Random(seed)
    moduli = list(rt.int8_pool()[:s])
    if rng.random() < 0.3:
        rng.shuffle(moduli)  # a custom order: the smallest modulus is not the last one
    elif rng.random() < 0.3:
        moduli = rng.sample(rt.int8_pool(), s)  # any pool subset, any order
    B = rt.Basis(moduli)
    count = data.draw(st.integers(0, s - 1), label="count")
    extend = data.draw(st.booleans(), label="extend")
    P = B.product
    Tb = random_bound(rng, (P - 1) // 2)
    v = rand_ints(rng, shape, Tb)
    scale, exp = random_scale(rng, shape)
    T = make(v, B, bound=Tb, scale=scale)

    # oracle: count times, the smallest active modulus
    active, w, bound, factor, Pa = list(B.moduli), v.copy(), Tb, scale.factor, P
    ok = True
    for _ in range(count):
        q = min(active)
        active.remove(q)
        w = drop_all(w, q)
        bound, factor, Pa = bound // q + 1, factor * q, Pa // q
        ok = ok and 2 * bound < Pa
    if not ok:
        with pytest.raises(rt.RNSRangeError):
            rt.drop(T, count, extend=extend)
        return
    R = rt.drop(T, count, extend=extend)
    check_ints(R, w, B.moduli if extend else active)
    assert R.bound == bound
    check_value(R, w, factor, exp)
    if not extend:
        # the same result from single drops
        S = T
        for _ in range(count):
            S = rt.drop(S)
        np.testing.assert_array_equal(S.residues, R.residues)
        assert S.active == R.active and S.bound == R.bound and S.scale.factor == R.scale.factor


@settings(max_examples=60)
@given(seed=st.integers(0, 2**64 - 1), s=st.integers(2, 49), shape=shape_st, extend=st.booleans())
def test_drop_chosen_moduli_vs_python_ints(seed, s, shape, extend):
    """drop(T, moduli=...) divides by exactly the given moduli, in the given order."""
    rng = random.Random(seed)
    B = rt.Basis.int8(s)
    chosen = rng.sample(B.moduli, rng.randint(0, s - 1))
    Tb = random_bound(rng, (B.product - 1) // 2)
    v = rand_ints(rng, shape, Tb)
    scale, exp = random_scale(rng, shape)
    T = make(v, B, bound=Tb, scale=scale)
    active, w, bound, factor, Pa, ok = list(B.moduli), v, Tb, scale.factor, B.product, True
    for q in chosen:
        active.remove(q)
        w = drop_all(w, q)
        bound, factor, Pa = bound // q + 1, factor * q, Pa // q
        ok = ok and 2 * bound < Pa
    if not ok:
        with pytest.raises(rt.RNSRangeError):
            rt.drop(T, moduli=chosen, extend=extend)
        return
    R = rt.drop(T, moduli=chosen, extend=extend)
    check_ints(R, w, B.moduli if extend else tuple(active))
    assert R.bound == bound
    check_value(R, w, factor, exp)
    if chosen == sorted(B.moduli)[: len(chosen)]:
        np.testing.assert_array_equal(R.residues, rt.drop(T, len(chosen), extend=extend).residues)


def test_drop_each_count_int8_15():
    """All counts 0..14 on s = 15 from a 53-bit encoding, with and without extension."""
    rng = np.random.default_rng(0)
    B = rt.Basis.int8(15)
    x = rng.uniform(-1, 1, size=(2, 3))
    x[0, 0] = 1.0  # E = 1, e = 52: the largest integer is exactly 2^52
    T = rt.encode(x, B, bits=53)
    v, e = encode_oracle(x, 53, None)
    for count in range(15):
        w, bound, factor, active = v, T.bound, 1, list(B.moduli)
        for _ in range(count):
            q = min(active)
            active.remove(q)
            w = drop_all(w, q)
            bound, factor = bound // q + 1, factor * q
        for extend in (False, True):
            R = rt.drop(T, count, extend=extend)
            check_ints(R, w, B.moduli if extend else tuple(active))
            assert R.bound == bound and R.scale.factor == factor
            check_value(R, w, factor, -e)
            # |x - decoded| <= sum of the dropped moduli's halves times the scale (Eq. 20)
            err = np.abs(rt.decode(R, mode="exact") - x)
            assert (err <= 2.0 ** (-int(e.reshape(-1)[0])) * factor).all()


def test_drop_smallest_modulus_rounding_semantics():
    """v' = (v - [v]_q) / q: division rounding to nearest, ties decided by the centered residue."""
    B = rt.Basis((8, 7, 5, 3))  # P = 840, range [-420, 419]; q = 3 first, then 5
    vals = np.array(list(range(-400, 401, 7)) + [400, -400, 1, -1, 2, -2], dtype=object)
    T = make(vals, B, bound=400)
    R = rt.drop(T)
    assert R.active == (8, 7, 5) and R.scale.factor == 3 and R.bound == 400 // 3 + 1
    want = np.array([(int(t) - centered(int(t), 3)) // 3 for t in vals], dtype=object)
    for t, q in zip(vals, want):  # nearest integer to t/3 (never a tie: 3 is odd)
        assert abs(Fraction(int(t), 3) - q) <= Fraction(1, 3)
    check_ints(R, want)
    R2 = rt.drop(T, 2)
    assert R2.active == (8, 7) and R2.scale.factor == 15 and R2.bound == (400 // 3 + 1) // 5 + 1
    check_ints(R2, [drop_int(int(t), 5) for t in want])
    # even modulus: B' = (2, 3) -> drop 2: centered residue of an odd v modulo 2 is -1 (range [-1, 0])
    C = rt.Basis((3, 2))
    U = make(np.array([1, -1, 2, -2, 0], dtype=object), C, bound=2)
    with pytest.raises(rt.RNSRangeError):
        rt.drop(U)  # bound 2 // 2 + 1 = 2 does not fit modulus 3
    U = make(np.array([1, -1, 0], dtype=object), C, bound=1)
    D = rt.drop(U)
    assert D.active == (3,) and D.bound == 1
    check_ints(D, [1, 0, 0])  # (1 - (-1)) / 2 = 1, (-1 - (-1)) / 2 = 0


@settings(max_examples=80)
@given(seed=st.integers(0, 2**64 - 1), s=st.integers(2, 49), shape=shape_st, data=st.data())
def test_base_extend_vs_python_ints(seed, s, shape, data):
    rng = random.Random(seed)
    B = rt.Basis.int8(s)
    if rng.random() < 0.3:  # any pool subset in any order: the even modulus anywhere, or none
        B = rt.Basis(rng.sample(rt.int8_pool(), s))
    k = data.draw(st.integers(1, s), label="active count")
    active = tuple(sorted(rng.sample(B.moduli, k), key=B.moduli.index))
    half = (math.prod(active) - 1) // 2
    Tb = random_bound(rng, half)
    v = rand_ints(rng, shape, Tb)
    scale, exp = random_scale(rng, shape)
    T = make(v, B, bound=Tb, active=active, scale=scale)
    R = rt.base_extend(T)
    check_ints(R, v, B.moduli)
    assert R.bound == Tb
    assert R.scale.same_as(T.scale)
    check_value(R, v, scale.factor, exp)
    # already full: unchanged
    assert rt.base_extend(R).active == B.moduli
    np.testing.assert_array_equal(rt.base_extend(R).residues, R.residues)


def test_base_extend_keeps_negative_zeros_and_edges():
    B = rt.Basis.int8(5)
    active = B.moduli[:2]  # 256 * 255 = 65280: range [-32640, 32639]
    vals = np.array([32639, -32639, 0, 1, -1, 128, -128, 255, -255, 256, -256], dtype=object)
    R = rt.base_extend(make(vals, B, bound=32639, active=active))
    check_ints(R, vals, B.moduli)
    odd = (255, 253, 251)  # no even modulus among the active ones
    R = rt.base_extend(make(vals, B, bound=32639, active=odd))
    check_ints(R, vals, B.moduli)
    # entries that were -0.0 at encoding stay -0.0 through a base extension
    x = np.array([-0.0, 1.0, 0.0])
    T = rt.encode(x, B, bits=20)
    assert_bits_equal(rt.decode(rt.drop(T, 0, extend=True), mode="exact"), x)
    Tsub = rt.RNSTensor(T.residues[:3], B, B.moduli[:3], T.bound, T.scale, T.negative_zeros)
    assert_bits_equal(rt.decode(rt.base_extend(Tsub), mode="exact"), x)


# ----- every s: a small chain through the public API --------------------------------------------


@pytest.mark.parametrize("s", range(2, 50))
def test_chain_every_s(s):
    """encode -> mode_product -> hadamard -> add -> drop(k) -> extend -> decode, vs Python ints."""
    B = rt.Basis.int8(s)
    rng = np.random.default_rng(100 + s)
    L2 = B.product.bit_length() - 1  # ~ log2 P
    b = max(1, min(53, (L2 - 6) // 4))  # bits so that x*A*g plus a sum stay in range
    x = rng.standard_normal((2, 3))
    A = rng.standard_normal((2, 3))
    g = rng.standard_normal((1, 2))  # broadcast over the leading axis
    X = rt.encode(x, B, bits=b)
    op = rt.encode(A, B, bits=b, shared_axes=(1,))
    G = rt.encode(g, B, bits=b)
    vx, ex = encode_oracle(x, b, None)
    va, ea = encode_oracle(A, b, (1,))
    vg, eg = encode_oracle(g, b, None)
    Y = rt.mode_product(X, op, 1)  # (2, 3) along axis 1 -> (2, 2)
    w = contract(va, vx, 1)
    check_ints(Y, w)
    Z = rt.hadamard(Y, G)
    w = w * vg
    check_ints(Z, w)
    S = rt.add(Z, Z)
    w = w + w
    check_ints(S, w)
    exp = -int(ex.reshape(-1)[0]) - obj(ea[:, 0])[None, :] - int(eg.reshape(-1)[0])
    check_value(S, w, 1, np.broadcast_to(exp, w.shape))
    # drop as many moduli as the range allows, then extend
    count, bound, act = 0, S.bound, list(B.moduli)
    factor = 1
    while count < s - 1:
        q = min(act)
        nb, nP = bound // q + 1, math.prod(act) // q
        if 2 * nb >= nP:
            break
        act.remove(q)
        w = drop_all(w, q)
        bound, factor, count = nb, factor * q, count + 1
    D = rt.drop(S, count)
    check_ints(D, w, tuple(act))
    E = rt.base_extend(D)
    check_ints(E, w, B.moduli)
    check_value(E, w, factor, np.broadcast_to(exp, w.shape))
    if count < s - 1:
        with pytest.raises(rt.RNSRangeError):
            rt.drop(S, count + 1)


# ----- backends agree ---------------------------------------------------------------------------


def test_numpy_backend_matches_default():
    rng = np.random.default_rng(9)
    B = rt.Basis.int8(15)
    x = rng.standard_normal((3, 4, 5))
    X = rt.encode(x, B, bits=53)
    Xn = rt.encode(x, B, bits=53, backend="numpy")
    np.testing.assert_array_equal(X.residues, Xn.residues)
    op = rt.encode(rng.standard_normal((6, 4)), B, bits=30, shared_axes=(1,))
    Y = rt.mode_product(X, op, 1)
    Yn = rt.mode_product(X, op, 1, backend="numpy")
    np.testing.assert_array_equal(Y.residues, Yn.residues)
    assert Y.bound == Yn.bound
    F = rt.encode(rng.standard_normal((6, 5)), B, bits=10, shared_axes=())
    H, Hn = rt.hadamard(Y, F), rt.hadamard(Y, F, backend="numpy")
    np.testing.assert_array_equal(H.residues, Hn.residues)
    S, Sn = rt.sub(H, H), rt.sub(H, H, backend="numpy")
    np.testing.assert_array_equal(S.residues, Sn.residues)
    A, An = rt.add(Y, Y), rt.add(Y, Y, backend="numpy")
    np.testing.assert_array_equal(A.residues, An.residues)
    for count in (1, 7, 9):
        for extend in (False, True):
            D = rt.drop(Y, count, extend=extend)
            Dn = rt.drop(Y, count, extend=extend, backend="numpy")
            assert D.active == Dn.active and D.bound == Dn.bound
            np.testing.assert_array_equal(D.residues, Dn.residues)
            for mode in ("fp64", "exact"):
                assert_bits_equal(rt.decode(D, mode=mode), rt.decode(D, mode=mode, backend="numpy"))
    D = rt.drop(Y, 7)
    np.testing.assert_array_equal(rt.base_extend(D).residues, rt.base_extend(D, backend="numpy").residues)


def test_set_backend_roundtrip():
    old = rt.set_backend("numpy")
    try:
        assert rt.get_backend().name == "numpy"
    finally:
        assert rt.set_backend(old) == "numpy"
    assert "numpy" in rt.available_backends() and "cpu" in rt.available_backends()
    with pytest.raises(ValueError, match="backend"):
        rt.set_backend("no-such-backend")


def test_large_operator_uses_the_a_priori_row_sum_bound():
    # past EXACT_ROW_SUMS_MAX entries mode_product bounds the growth by n_in * bound (rigorous),
    # and the residues are still exact
    from rnstensor.primitives import EXACT_ROW_SUMS_MAX, operator_rho

    rng = np.random.default_rng(7)
    n_out, n_in = 2, EXACT_ROW_SUMS_MAX // 2 + 1
    A = rng.uniform(-1, 1, (n_out, n_in))
    B = rt.Basis.int8(12)
    op = rt.encode(A, B, bits=20, shared_axes=(1,))
    assert operator_rho(op) == n_in * op.bound
    x = rng.uniform(-1, 1, (n_in, 3))
    T = rt.encode(x, B, bits=20)
    Y = rt.mode_product(T, op, 0)
    assert Y.bound == T.bound * n_in * op.bound
    va, vt = rt.to_int(op), rt.to_int(T)
    want = [[sum(int(va[j, k]) * int(vt[k, c]) for k in range(n_in)) for c in range(3)] for j in range(n_out)]
    assert rt.to_int(Y).tolist() == want
    # a small operator keeps the exact largest row sum
    small = rt.encode(A[:, :8], B, bits=20, shared_axes=(1,))
    assert operator_rho(small) == max(sum(abs(int(v)) for v in row) for row in rt.to_int(small))
