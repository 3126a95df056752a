"""Chains of mode products: every method against exact references, plan reuse, the effective operator, bad input.

Oracles: ``reference.exact_mode_chain`` (object-int tensordot, cross-checked
here against a Fraction-per-entry chain), and a hand simulation of the
persistent methods (Python ints: the encoding of Alg. 5, the effective
operators of Sec. 5.2, the mode products and Alg. 1's drops) whose exact value
a ``decode='exact'`` chain must return correctly rounded, bit for bit.
"""

from __future__ import annotations

import functools

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rnstensor as rt
from rnstensor.reference import exact_mode_chain

from chain_oracle import dyadic, encode_rows, fraction_chain, max_abs_error, scaled_exact
from oracle import assert_bits_equal, contract, crt, drop_int, encode_oracle, to_float, values


# the papers' methods at any width: these tests check plans that keep fewer than min_bits bits
plan_any = functools.partial(rt.plan_chain, min_bits=0)
chain_any = functools.partial(rt.mode_chain, min_bits=0)

METHODS = ("rescale_be", "rescale", "norescale", "composed")
U = Fraction(1, 2**53)


def rand_ops(rng, shape_in, axes, outs, wide: int = 0):
    """Operators chaining along ``axes`` from ``shape_in`` (tensor axes only), with ``n_out`` from ``outs``."""
    cur = list(shape_in)
    ops = []
    for ax, n_out in zip(axes, outs):
        A = rng.uniform(-1, 1, (n_out, cur[ax]))
        if wide:
            A = np.ldexp(A, rng.integers(-wide, wide + 1, A.shape[0])[:, None].astype(np.int32))
            A = np.ldexp(A, rng.integers(-wide, wide + 1, A.shape[1])[None, :].astype(np.int32))
        ops.append(A)
        cur[ax] = n_out
    return ops


def wide_tensor(rng, shape, span=80):
    m = rng.uniform(1, 2, shape) * np.where(rng.integers(0, 2, shape) == 1, 1.0, -1.0)
    return np.ldexp(m, rng.integers(-span, span + 1, shape).astype(np.int32))


def exact_error(Y, X, ops, axes, ndim=None) -> tuple[Fraction, Fraction]:
    """``(max |Y - exact|, max |exact|)`` exactly."""
    ints, k = exact_mode_chain(X, ops, axes, ndim=ndim)
    ref = scaled_exact(ints, k)
    assert Y.shape == ref.shape
    return max_abs_error(Y, ref), max(abs(r) for r in ref.reshape(-1))


# ----- the cases: batch axes, ranks 1..4, rectangular, repeated and negative axes, wide ranges ---------

def _case(name, seed):
    rng = np.random.default_rng(seed)
    if name == "rank1-repeated":
        X = rng.uniform(-1, 1, (5, 8))
        axes = [0, 0, 0]
        return X, rand_ops(rng, (8,), axes, [8, 6, 6]), axes, 1
    if name == "rank2-rect":
        X = rng.uniform(-1, 1, (3, 8, 5))
        axes = [0, 0, 1, 0]  # 5x8 then 8x5 on axis 0
        return X, rand_ops(rng, (8, 5), axes, [5, 8, 3, 4]), axes, 2
    if name == "rank3-d7":
        X = rng.uniform(-1, 1, (2, 4, 5, 6))
        axes = [0, 1, 2, 0, 1, 2, 0]  # d > ndim revisits every mode
        return X, rand_ops(rng, (4, 5, 6), axes, [3, 5, 4, 4, 2, 6, 5]), axes, 3
    if name == "rank4-negative":
        X = rng.uniform(-1, 1, (2, 2, 3, 3, 4, 2))  # two batch axes
        axes = [-1, -4, -2, -3, -1]
        norm = [a % 4 for a in axes]
        return X, rand_ops(rng, (3, 3, 4, 2), norm, [3, 2, 4, 3, 2]), axes, 4
    if name == "wide-input":
        X = wide_tensor(rng, (3, 6, 6, 6))
        axes = [0, 1, 2, 0, 1]
        return X, rand_ops(rng, (6, 6, 6), axes, [6] * 5), axes, 3
    if name == "wide-operators":
        X = rng.uniform(-1, 1, (2, 5, 5))
        X[0] *= 2.0**40
        axes = [0, 1, 0, 1, 0]
        return X, rand_ops(rng, (5, 5), axes, [5, 4, 5, 4, 3], wide=30), axes, 2
    if name == "zeros":
        X = rng.uniform(-1, 1, (3, 4, 4))
        X[0] = 0.0  # an all-zero tensor in the batch
        X[1, 2, :] = 0.0
        axes = [1, 0, 1]
        ops = rand_ops(rng, (4, 4), axes, [4, 4, 4])
        ops[0][1, :] = 0.0  # a zero operator row
        return X, ops, axes, 2
    raise KeyError(name)


CASES = ["rank1-repeated", "rank2-rect", "rank3-d7", "rank4-negative", "wide-input", "wide-operators", "zeros"]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize(
    "method, planner",
    [("rescale_be", "greedy"), ("rescale_be", "optimal"), ("rescale", "greedy"), ("rescale", "optimal"),
     ("norescale", "greedy"), ("composed", "greedy")],
)
def test_every_method_within_its_error_bound(name, method, planner):
    X, ops, axes, ndim = _case(name, 1)
    plan = plan_any(ops, axes, method=method, planner=planner, ndim=ndim)
    for decode in ("fp64", "exact"):
        Y = plan(X, decode=decode)
        err, ymax = exact_error(Y, X, ops, axes, ndim)
        bound = plan.error_bound(X, decode=decode)
        assert err <= Fraction(bound), (name, method, planner, decode, float(err), bound)
        if method in ("rescale_be", "composed") and not name.startswith("wide"):
            # on well-scaled data the bound is meaningful, not astronomically loose (norm products are
                # loose for badly scaled operators and wide tensors, by design)
            assert bound <= 1e-9 * float(ymax), (bound, float(ymax))


def test_reference_cross_check_with_fractions():
    # the object-int reference used above equals a Fraction-per-entry chain on a small case
    X, ops, axes, ndim = _case("rank2-rect", 5)
    ints, k = exact_mode_chain(X, ops, axes, ndim=ndim)
    fr = fraction_chain(X, ops, axes, ndim)
    ref = scaled_exact(ints, k)
    assert all(fr[i] == ref[i] for i in np.ndindex(fr.shape))


# ----- hand simulation of the persistent methods: decode='exact' is the correctly rounded result ------


def hand_persistent(x, ops, axes, bits: int, input_bits: int, dropped):
    """The exact value the persistent methods represent after the chain (one tensor, no batch).

    Encode with one exponent (Alg. 5), then per product: fold the pending row
    scales into the operator's columns, row-encode it, contract the integers,
    and drop the moduli in order with ``(v - [v]_q) / q``.
    """
    v, e = encode_oracle(x, input_bits, None)
    scalar = -int(np.asarray(e).reshape(-1)[0]) if x.size else 0
    factor = 1
    pending: dict = {}
    for A, ax, qs in zip(ops, axes, dropped):
        pend = pending.get(ax)
        rows = []
        for j in range(A.shape[0]):
            row = []
            for k in range(A.shape[1]):
                n, t = dyadic(A[j, k])
                if pend is not None:
                    t -= pend[k] - max(pend)
                row.append((n, t))
            rows.append(row)
        ints, exps = encode_rows(rows, bits)
        if pend is not None:
            scalar += max(pend)
        v = contract(np.array(ints, dtype=object), v, ax)
        pending[ax] = [-f for f in exps]
        for q in qs:
            dropped_v = np.empty(v.shape, dtype=object)
            for i in np.ndindex(v.shape):
                dropped_v[i] = drop_int(int(v[i]), q)
            v = dropped_v
            factor *= q
    out = np.empty(v.shape, dtype=object)
    for idx in np.ndindex(v.shape):
        ex = scalar + sum(pending[a][idx[a]] for a in pending)
        out[idx] = Fraction(int(v[idx]) * factor) * Fraction(2) ** ex
    return out


def greedy_dropped(plan, moduli):
    """The moduli greedy Alg. 2 schedules drop, smallest available first (restored or not)."""
    avail = sorted(moduli)
    out = []
    for g in plan.drops:
        out.append(tuple(avail[:g]))
        if plan.method == "rescale_be":
            continue
        avail = avail[g:]
    return out


HAND_CASES = [
    # (x tensor shape, axes, outs, moduli)
    ((3, 4), [0, 1, 0, 1], [5, 2, 3, 4], 15),
    ((2, 3, 2), [0, 1, 2, 0, 1], [3, 3, 2, 2, 3], 15),
    ((4, 3), [1, 1, 0, 1], [5, 3, 2, 2], 9),
]


@pytest.mark.parametrize("case", range(len(HAND_CASES)))
@pytest.mark.parametrize(
    "method, planner",
    [("rescale_be", "greedy"), ("rescale_be", "optimal"), ("rescale", "greedy"), ("rescale", "optimal"),
     ("norescale", "greedy")],
)
@pytest.mark.parametrize("input_bits", [None, 58])
def test_persistent_methods_equal_hand_simulation(case, method, planner, input_bits):
    shape, axes, outs, s = HAND_CASES[case]
    rng = np.random.default_rng(100 + case)
    ops = rand_ops(rng, shape, axes, outs, wide=6)
    X = np.stack([rng.uniform(-1, 1, shape), wide_tensor(rng, shape, 40)])  # a batch of two
    try:
        plan = plan_any(ops, axes, moduli=s, method=method, planner=planner, input_bits=input_bits)
    except rt.PlanError:
        assert input_bits is not None  # only an over-wide input may be infeasible
        return
    basis = rt.Basis.int8(s)
    if planner == "greedy":
        dropped = greedy_dropped(plan, basis.moduli)
        assert dropped == [st_.dropped for st_ in plan.schedule.steps]
    else:
        dropped = [st_.dropped for st_ in plan.schedule.steps]
    if method == "rescale_be" and planner == "greedy":
        assert all(len(q) > 0 for q in dropped[:-1])  # the drops are exercised
    Ye, Yf = plan(X, decode="exact"), plan(X, decode="fp64")
    m = len(basis) - (0 if method == "rescale_be" else sum(len(q) for q in dropped))
    for t in range(X.shape[0]):
        val = hand_persistent(X[t], ops, axes, plan.bits, plan.input_bits, dropped)
        want = np.array([to_float(val[i]) for i in np.ndindex(val.shape)]).reshape(val.shape)
        assert_bits_equal(Ye[t], want)
        # fp64: MRC + Horner + scale, within (6m + 4) u of the represented value (the bounds' decode model)
        for i in np.ndindex(val.shape):
            assert abs(Fraction(float(Yf[t][i])) - val[i]) <= (6 * m + 4) * U * abs(val[i]) + Fraction(1, 2**1074)


@pytest.mark.parametrize("method", ["rescale_be", "rescale", "norescale"])
def test_exact_decode_is_the_correctly_rounded_represented_value(method):
    # plan(X, 'exact') == round(value of plan.apply(plan.encode_input(X))) with the integer from plain CRT
    rng = np.random.default_rng(4)
    X = rng.uniform(-1, 1, (3, 6, 5, 4))
    X[1] = wide_tensor(rng, (6, 5, 4))
    axes = [2, 0, 1, 2, 0]
    ops = rand_ops(rng, (6, 5, 4), axes, [4, 6, 5, 3, 2], wide=10)
    plan = plan_any(ops, axes, method=method)
    T = plan.apply(plan.encode_input(X))
    v = crt(np.asarray(T.residues), T.active)
    exp = np.broadcast_to(T.scale.exponent(), T.shape)
    want = values(v, T.scale.factor, exp)
    assert_bits_equal(plan(X, decode="exact"), want)
    assert_bits_equal(plan.run(X, decode="exact"), want)
    # the integers respect the plan's bound, on the moduli the method leaves
    assert T.bound == plan.schedule.steps[-1].after
    assert max(abs(int(a)) for a in v.reshape(-1)) <= T.bound
    want_active = len(plan.basis) - (0 if method == "rescale_be" else sum(plan.drops))
    assert len(T.active) == want_active


def test_composed_single_product_exact_decode_is_correctly_rounded():
    # composed, d = 1: fibers encoded along the axis, row-encoded operator, one exact rounding
    rng = np.random.default_rng(8)
    X = wide_tensor(rng, (2, 3, 4), 30)
    A = rng.uniform(-1, 1, (5, 3))
    plan = rt.plan_chain([A], [0], method="composed", ndim=2)
    b = plan.bits
    ints, fexp = encode_rows([[dyadic(x) for x in row] for row in A], b)
    want = np.empty((2, 5, 4))
    for t in range(2):
        for c in range(4):
            fiber = X[t, :, c]
            xv, xe = encode_oracle(fiber, b, None)
            e = int(np.asarray(xe).reshape(-1)[0])
            for j in range(5):
                s = sum(ints[j][k] * int(xv[k]) for k in range(3))
                want[t, j, c] = to_float(Fraction(s) * Fraction(2) ** (-fexp[j] - e))
    assert_bits_equal(plan(X, decode="exact"), want)


# ----- wider input encoding -----------------------------------------------------------------------


def test_input_bits_60_is_exact_within_bound():
    rng = np.random.default_rng(2)
    X = wide_tensor(rng, (4, 8, 8, 8))
    ops = [rng.uniform(-1, 1, (8, 8)) for _ in range(3)]
    axes = [0, 1, 2]
    narrow = rt.plan_chain(ops, axes)
    wide = rt.plan_chain(ops, axes, input_bits=60)
    assert wide.input_bits == 60 and wide.bits == 53
    for decode in ("fp64", "exact"):
        Y = wide(X, decode=decode)
        err, _ = exact_error(Y, X, ops, axes)
        assert err <= Fraction(wide.error_bound(X, decode=decode))
    # the 60-bit input encoding holds every 60-bit slice of the input exactly
    T = wide.encode_input(X)
    assert T.bound == 2**60
    assert narrow.error_bound(X) > 0


# ----- plan reuse, batch splits, cached operators ---------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_plan_reuse_and_batch_splits_are_bitwise_identical(method):
    rng = np.random.default_rng(6)
    ops = [rng.uniform(-1, 1, (6, 6)) for _ in range(4)]
    axes = [0, 1, 2, 0]
    plan = plan_any(ops, axes, method=method)
    cached = [np.array(T.residues, copy=True) for T in plan._encoded]
    ints = [np.array(op.ints, copy=True) for op in plan.schedule.operators]
    opcopies = [A.copy() for A in ops]
    X = rng.uniform(-1, 1, (7, 6, 6, 6))
    X[2] *= 2.0**50  # a batch with very different scales: each tensor must keep its own
    X[5] *= 2.0**-70
    for decode in ("fp64", "exact"):
        Y = plan(X, decode=decode)
        for k in (1, 3, 6):
            assert_bits_equal(np.concatenate([plan(X[:k], decode=decode), plan(X[k:], decode=decode)]), Y)
        # tensor by tensor (no batch axis) and in a 2-D batch
        assert_bits_equal(np.stack([plan(x, decode=decode) for x in X]), Y)
        assert_bits_equal(plan(X[:6].reshape(2, 3, 6, 6, 6), decode=decode).reshape(6, 6, 6, 6), Y[:6])
        # a fresh plan, and the one-shot form
        assert_bits_equal(plan_any(ops, axes, method=method)(X, decode=decode), Y)
        assert_bits_equal(chain_any(X, ops, axes, method=method, decode=decode), Y)
    # many different tensors through the same plan
    for seed in range(3):
        Z = np.random.default_rng(seed).uniform(-1, 1, (2, 6, 6, 6))
        err, _ = exact_error(plan(Z), Z, ops, axes)
        assert err <= Fraction(plan.error_bound(Z))
    for a, b in zip(cached, plan._encoded):
        np.testing.assert_array_equal(a, np.asarray(b.residues))
    for a, op in zip(ints, plan.schedule.operators):
        np.testing.assert_array_equal(a, op.ints)
    for a, b in zip(opcopies, ops):
        assert_bits_equal(b, a)


def test_batch_entry_error_does_not_depend_on_its_neighbours():
    # a tiny tensor next to a huge one keeps float64-level accuracy (one exponent per tensor)
    rng = np.random.default_rng(9)
    ops = [rng.uniform(-1, 1, (8, 8)) for _ in range(3)]
    small = rng.uniform(-1, 1, (8, 8, 8))
    X = np.stack([small * 2.0**60, small])
    for method in ("rescale_be", "rescale", "norescale"):
        plan = plan_any(ops, [0, 1, 2], method=method)
        assert_bits_equal(plan(X)[1], plan(small))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("planner", ["greedy", "optimal"])
def test_mode_chain_equals_plan_call(method, planner):
    X, ops, axes, ndim = _case("rank3-d7", 3)
    for decode in ("fp64", "exact"):
        a = chain_any(X, ops, axes, method=method, planner=planner, decode=decode, ndim=ndim)
        b = plan_any(ops, axes, method=method, planner=planner, ndim=ndim)(X, decode=decode)
        assert_bits_equal(a, b)


def test_single_operator_and_integer_axis():
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (2, 3))
    A = rng.uniform(-1, 1, (4, 3))
    assert_bits_equal(rt.mode_chain(X, A, 1), rt.mode_chain(X, [A], [1]))
    assert rt.mode_chain(X, A, 1).shape == (2, 4)


def test_negative_axes_equal_positive_axes():
    X, ops, axes, ndim = _case("rank4-negative", 2)
    pos = [a % ndim for a in axes]
    p_neg = rt.plan_chain(ops, axes, ndim=ndim)
    p_pos = rt.plan_chain(ops, pos, ndim=ndim)
    assert p_neg.axes == tuple(pos)
    assert (p_neg.bits, p_neg.drops) == (p_pos.bits, p_pos.drops)
    assert_bits_equal(p_neg(X), p_pos(X))
    # the leading two axes of X are a batch: untouched
    assert p_neg(X).shape[:2] == X.shape[:2]


# ----- the effective operator: revisits apply every pending scale exactly once -------------------------


def test_revisits_with_power_of_two_operators_are_exact():
    # integer operators times powers of two, few-bit inputs: norescale with decode='exact' is exact,
    # so any scale applied twice (or dropped) shows up as a wrong power of two
    rng = np.random.default_rng(12)
    X = rng.integers(-7, 8, (2, 3, 4)).astype(np.float64) * 2.0**-3
    axes = [0, 1, 0, 0, 1]
    ops = []
    cur = [3, 4]
    for ax, n_out in zip(axes, [3, 2, 4, 2, 3]):
        A = rng.integers(-9, 10, (n_out, cur[ax])).astype(np.float64)
        A = np.ldexp(A, rng.integers(-4, 5, n_out)[:, None].astype(np.int32))  # different row scales
        ops.append(A)
        cur[ax] = n_out
    ints, k = exact_mode_chain(X, ops, axes)
    want = np.array([to_float(v) for v in scaled_exact(ints, k).reshape(-1)]).reshape(ints.shape)
    plan = plan_any(ops, axes, method="norescale", moduli=30)
    # wide enough that nothing is rounded: 4-bit integers times row scales spread over 2**8, folded
    assert plan.bits >= 30, plan.bits
    assert_bits_equal(plan(X, decode="exact"), want)
    # and the persistent methods with drops stay within their bound at float64 level
    for method in ("rescale_be", "rescale"):
        p = plan_any(ops, axes, method=method)
        err, ymax = exact_error(p(X), X, ops, axes)
        assert err <= Fraction(p.error_bound(X))
        if method == "rescale_be":
            assert err <= Fraction(1e-13) * ymax


def test_revisits_with_wide_row_scales_are_accurate():
    rng = np.random.default_rng(13)
    X = rng.uniform(-1, 1, (4, 6, 6))
    axes = [0, 0, 1, 0, 1, 0]
    ops = rand_ops(rng, (6, 6), axes, [6] * 6, wide=40)
    for method, planner in (("rescale_be", "optimal"), ("rescale_be", "greedy"), ("composed", "greedy")):
        plan = rt.plan_chain(ops, axes, method=method, planner=planner)
        Y = plan(X)
        err, ymax = exact_error(Y, X, ops, axes)
        assert err <= Fraction(plan.error_bound(X))
        assert err <= Fraction(1e-12) * ymax  # a scale applied twice would be off by ~2**40


def test_zero_operator_row_on_a_revisited_axis_keeps_full_accuracy():
    # a zero row's exponent must not dominate the folding of the next operator on its axis
    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, (3, 4, 4))
    ops = [rng.uniform(-1, 1, (4, 4)) for _ in range(3)]
    ops[0][1, :] = 0.0
    axes = [1, 0, 1]
    for method in ("rescale_be", "composed"):
        plan = rt.plan_chain(ops, axes, method=method)
        err, ymax = exact_error(plan(X), X, ops, axes)
        assert err <= Fraction(1e-14) * ymax, float(err / ymax)
        assert Fraction(plan.error_bound(X)) <= Fraction(1e-12) * ymax
    # the zero row's pending exponent is the smallest scale of its axis
    f = np.ravel(rt.plan_chain(ops, axes).schedule.operators[0].row_exponents)
    assert f[1] == max(f[0], f[2], f[3])
    # an operator that is entirely zero gives exact zeros
    zero_ops = [np.zeros((4, 4)), ops[1], ops[2]]
    for method in METHODS:
        assert_bits_equal(rt.mode_chain(X, zero_ops, axes, method=method), np.zeros((3, 4, 4)))


# ----- property test: random chains through mode_chain ------------------------------------------------


@given(
    seed=st.integers(0, 2**32 - 1),
    ndim=st.integers(1, 3),
    batch=st.integers(0, 2),
    d=st.integers(1, 5),
    method=st.sampled_from(METHODS),
    planner=st.sampled_from(["greedy", "optimal"]),
    decode=st.sampled_from(["fp64", "exact"]),
    wide=st.booleans(),
)
def test_random_chains_within_bound(seed, ndim, batch, d, method, planner, decode, wide):
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(1, 5, ndim))
    bshape = tuple(int(n) for n in rng.integers(1, 3, batch))
    X = wide_tensor(rng, bshape + shape, 60) if wide else rng.uniform(-1, 1, bshape + shape)
    axes = [int(a) for a in rng.integers(0, ndim, d)]
    ops = rand_ops(rng, shape, axes, [int(n) for n in rng.integers(1, 6, d)], wide=8 if wide else 0)
    sign_axes = [a - ndim if rng.integers(0, 2) else a for a in axes]
    plan = plan_any(ops, sign_axes, method=method, planner=planner, ndim=ndim)
    Y = chain_any(X, ops, sign_axes, method=method, planner=planner, decode=decode, ndim=ndim)
    assert_bits_equal(plan(X, decode=decode), Y)
    err, _ = exact_error(Y, X, ops, axes, ndim)
    assert err <= Fraction(plan.error_bound(X, decode=decode))


# ----- bad input --------------------------------------------------------------------------------------


def _ops3():
    rng = np.random.default_rng(0)
    return [rng.uniform(-1, 1, (8, 8)) for _ in range(3)]


def test_non_2d_operator():
    ops = _ops3()
    with pytest.raises(ValueError, match=r"operators\[1\].*2-D"):
        rt.plan_chain([ops[0], np.ones(8), ops[2]], [0, 1, 2])
    with pytest.raises(ValueError, match=r"operators\[0\].*2-D"):
        rt.plan_chain([np.ones((2, 8, 8))], [0])


def test_operator_axis_size_mismatch():
    ops = _ops3()
    plan = rt.plan_chain(ops, [0, 1, 2])
    with pytest.raises(ValueError, match=r"axis 1.*length 7.*8 columns"):
        plan(np.ones((2, 8, 7, 8)))
    with pytest.raises(ValueError, match="at least 3 axes"):
        plan(np.ones((8, 8)))
    with pytest.raises(ValueError):
        rt.mode_chain(np.ones((8, 5, 8)), ops, [0, 1, 2])
    # consecutive operators on one axis that do not chain: 5x8 then 8x6 (needs 5 columns)
    rng = np.random.default_rng(1)
    with pytest.raises(ValueError, match=r"operator 1 .*8 x 6.*axis 0.*length 5"):
        rt.plan_chain([rng.uniform(-1, 1, (5, 8)), rng.uniform(-1, 1, (8, 6))], [0, 0])
    # but they may interleave with other axes and still chain
    rt.plan_chain([rng.uniform(-1, 1, (5, 8)), rng.uniform(-1, 1, (3, 3)), rng.uniform(-1, 1, (8, 5))], [0, 1, 0])


def test_nan_and_inf():
    ops = _ops3()
    X = np.ones((8, 8, 8))
    X[1, 2, 3] = np.nan
    with pytest.raises(ValueError, match="X"):
        rt.mode_chain(X, ops, [0, 1, 2], nonfinite="raise")
    plan = rt.plan_chain(ops, [0, 1, 2])
    with pytest.raises(ValueError, match="non-finite"):
        plan.run(X, nonfinite="raise")
    with pytest.raises(ValueError, match="nonfinite must be one of"):
        plan.run(X, nonfinite="zero")
    bad = [A.copy() for A in ops]
    bad[2][0, 0] = np.inf
    with pytest.raises(ValueError, match=r"operators\[2\]"):
        rt.plan_chain(bad, [0, 1, 2])
    bad[2][0, 0] = np.nan
    with pytest.raises(ValueError, match=r"operators\[2\]"):
        rt.mode_chain(np.ones((8, 8, 8)), bad, [0, 1, 2])


@pytest.mark.parametrize("method", ["rescale_be", "composed"])
@pytest.mark.parametrize("axes", [[0, 1, 2], [1, 1]])
def test_nonfinite_inputs_follow_numpy(method, axes):
    """Outputs that meet an inf or NaN are numpy's float64 chain; the others are bitwise the finite input's."""
    rng = np.random.default_rng(31)
    ops = [rng.uniform(-1, 1, (8, 8)) for _ in axes]
    plan = rt.plan_chain(ops, axes, method=method, ndim=3)
    X = rng.uniform(-1, 1, (4, 8, 8, 8))
    X[1, 2, 3, 4], X[2, 0, 0, 0], X[2, 7, 7, 7] = np.nan, np.inf, -np.inf
    Y = plan(X)
    with np.errstate(invalid="ignore"):
        want = np.einsum("ij,bjkl->bikl", ops[0], X) if axes == [0, 1, 2] else None
    ref = plan.float64_chain(X)
    if want is not None:  # float64_chain is numpy's mode products: its first product is numpy's too
        one = rt.plan_chain(ops[:1], [0], ndim=3).float64_chain(X)
        assert np.array_equal(np.isnan(one), np.isnan(want)) and np.array_equal(one[np.isinf(one)], want[np.isinf(want)])
    bad = ~np.isfinite(ref)
    assert bad.any() and (~bad).any()
    np.testing.assert_array_equal(Y[bad], ref[bad])
    Z = np.where(np.isfinite(X), X, 0.0)
    assert np.array_equal(Y[~bad], plan(Z)[~bad])  # the exact computation of the finite entries
    assert np.array_equal(Y[0], plan(X[:1])[0]) and np.isfinite(Y[0]).all()  # a finite tensor keeps its result
    assert plan.error_bound(X) == plan.error_bound(Z)
    assert np.array_equal(rt.mode_chain(X, ops, axes, method=method, ndim=3), Y, equal_nan=True)


def test_axis_out_of_range():
    ops = _ops3()
    with pytest.raises(ValueError, match="out of range"):
        rt.plan_chain(ops, [0, 1, 3], ndim=3)
    with pytest.raises(ValueError, match="out of range"):
        rt.plan_chain(ops, [0, -4, 1], ndim=3)
    with pytest.raises(ValueError, match="ndim"):
        rt.plan_chain(ops, [0, -1, 1])  # negative axes need ndim
    with pytest.raises(ValueError):
        rt.mode_chain(np.ones((8, 8, 8)), ops, [0, 1, 5])  # ndim = 6 > X.ndim
    with pytest.raises(ValueError, match="axes"):
        rt.plan_chain(ops, [0, 1])
    with pytest.raises(TypeError):
        rt.plan_chain(ops, [0, 1.5, 2])


def test_unknown_names():
    ops = _ops3()
    X = np.ones((8, 8, 8))
    with pytest.raises(ValueError, match="method"):
        rt.mode_chain(X, ops, [0, 1, 2], method="Rescale-BE")
    with pytest.raises(ValueError, match="planner"):
        rt.mode_chain(X, ops, [0, 1, 2], planner="exhaustive")
    plan = rt.plan_chain(ops, [0, 1, 2])
    for call in (lambda: plan(X, decode="fp32"), lambda: rt.mode_chain(X, ops, [0, 1, 2], decode="round"),
                 lambda: plan.error_bound(X, decode="fast")):
        with pytest.raises(ValueError, match="decode") as exc:
            call()
        assert not isinstance(exc.value, rt.PlanError)
    with pytest.raises(ValueError, match="input_bits"):
        rt.mode_chain(X, ops, [0, 1, 2], method="composed", input_bits=60)
    with pytest.raises(ValueError, match="at least one operator"):
        rt.plan_chain([], [])


def test_too_few_moduli_raise_plan_error_with_numbers():
    ops = _ops3()
    with pytest.raises(rt.PlanError, match=r"product 2 .*bits missing"):
        rt.mode_chain(np.ones((8, 8, 8)), ops, [0, 1, 2], moduli=1)
    with pytest.raises(rt.PlanError, match=r"product 1 \(axis 0\).*bits missing"):
        rt.mode_chain(np.ones((8, 8, 8)), ops, [0, 1, 2], moduli=10, bits=53)


def test_composed_has_no_persistent_encoding():
    ops = _ops3()
    plan = rt.plan_chain(ops, [0, 1, 2], method="composed")
    with pytest.raises(ValueError):
        plan.encode_input(np.ones((8, 8, 8)))


def test_composed_overflow_between_products_names_the_cause_and_the_fix():
    # the first product is 2**1024 (eight terms of 2**1021), the second brings it back to about 2**325: the
    # composed method decodes the intermediate to float64, which overflows; the input itself is finite
    A1 = np.full((3, 8), 2.0**1021)
    A2 = np.full((2, 3), 2.0**-700)
    X = np.ones((1, 8, 2))
    plan = rt.plan_chain([A1, A2], [0, 0], ndim=2, method="composed", moduli=15, min_bits=0)
    with pytest.raises(rt.RNSRangeError, match="composed method decodes every intermediate") as info:
        plan(X)
    assert "overflows" in str(info.value) and "method='rescale_be'" in str(info.value)
    assert "non-finite entries" not in str(info.value)
    # the fix it names: the intermediates stay in residues, the result is finite and within its bound
    fixed = rt.plan_chain([A1, A2], [0, 0], ndim=2, method="rescale_be", moduli=15, min_bits=0)
    Y = fixed(X)
    exact = 8 * 3 * 2.0**321
    assert np.isfinite(Y).all() and np.abs(Y - exact).max() <= fixed.error_bound(X)


def test_describe_returns_the_text_and_prints_nothing(capsys):
    import io

    from rnstensor.fem import MassOperator, TensorBasis, box_mesh

    rng = np.random.default_rng(0)
    plan = rt.plan_chain([rng.uniform(-1, 1, (4, 4)) for _ in range(3)], [0, 1, 2])
    basis = TensorBasis(3)
    fem_plan = MassOperator(basis, box_mesh(basis, shape=(1, 1, 1)).qdata).plan
    for described in (plan, fem_plan):
        text = described.describe()
        assert isinstance(text, str) and text.count("\n") >= 2, text
        assert capsys.readouterr().out == ""  # a REPL shows the returned text once, not printed and returned
        buf = io.StringIO()
        assert described.describe(file=buf) == text and buf.getvalue() == text + "\n"  # file=: written as asked
        assert capsys.readouterr().out == ""
