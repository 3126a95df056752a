"""``moduli='auto'`` through einsum, contract_expression and chain plans: every entry correctly rounded.

Oracle: the exact rational value (Fractions through numpy's einsum on object
arrays), rounded once by ``float``. Wide-range data makes the exact plan need
many moduli, and beyond 49 the exact split (:mod:`rnstensor.run.exact`).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import rnstensor as rt
from rnstensor.run import exact, policy

_F = np.vectorize(Fraction, otypes=[object])
_to_float = np.vectorize(float, otypes=[float])  # (Fraction -> float: correctly rounded)


def _round(v):
    return np.ascontiguousarray(_to_float(v))  # (an optimized einsum's result may be strided)


def _exact(sub, *ops):
    if any(np.iscomplexobj(o) for o in ops):
        re = [_F(np.real(o)) for o in ops]
        im = [_F(np.imag(o)) for o in ops]
        # multilinear: expand (re + i im) products term by term
        n = len(ops)
        tot_re, tot_im = 0, 0
        for mask in range(1 << n):
            args = [im[k] if mask >> k & 1 else re[k] for k in range(n)]
            v = np.einsum(sub, *args, optimize="greedy")  # (pairwise: exact in any order, Fractions)
            k = bin(mask).count("1")  # i**k
            if k % 4 == 0:
                tot_re = tot_re + v
            elif k % 4 == 1:
                tot_im = tot_im + v
            elif k % 4 == 2:
                tot_re = tot_re - v
            else:
                tot_im = tot_im - v
        return _round(tot_re) + 1j * _round(tot_im)
    v = np.einsum(sub, *[_F(o) for o in ops], optimize="greedy")
    return _round(v) if np.ndim(v) else float(v)


def _wide(rng, shape, spread):
    return rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread, shape))


def _same(got, want):
    """The same values bit for bit (signed zeros and NaN positions included)."""
    got, want = np.atleast_1d(np.asarray(got)), np.atleast_1d(np.asarray(want))
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    same = got.view(np.uint8) == want.view(np.uint8)
    assert same.all() or np.array_equal(got, want, equal_nan=True) and np.array_equal(np.signbit(got.real),
                                                                                      np.signbit(want.real)), \
        np.argwhere(got != want)[:5]


CASES = [
    ("ij,jk->ik", [(3, 4), (4, 2)], 30),
    ("ijab,abcd->ijcd", [(2, 2, 3, 3), (3, 3, 2, 2)], 8),  # the GEMM-shaped chemistry contraction
    ("pqrs,pi,qj,rk,sl->ijkl", [(3, 3, 3, 3)] + [(3, 3)] * 4, 6),  # the 4-index transform, 5 operands
    ("i,i->", [(6,), (6,)], 40),
    ("ii->i", [(4, 4)], 20),  # a diagonal
    ("ij,ij->ij", [(3, 5), (3, 5)], 50),  # elementwise
]


@pytest.mark.parametrize("sub, shapes, spread", CASES)
def test_einsum_auto_is_correctly_rounded(sub, shapes, spread):
    rng = np.random.default_rng(len(sub) + spread)
    ops = [_wide(rng, s, spread) for s in shapes]
    got = rt.einsum(sub, *ops, moduli="auto")
    _same(got, _exact(sub, *ops))


def test_einsum_auto_splits_beyond_49_moduli(monkeypatch):
    import rnstensor.contract.auto as auto

    rng = np.random.default_rng(11)
    a, b = _wide(rng, (3, 4), 400), _wide(rng, (4, 2), 400)  # slices spanning ~800 binades
    expr = rt.contract_expression("ij,jk->ik", a.shape, b.shape, moduli="auto")
    _same(expr(a, b), _exact("ij,jk->ik", a, b))  # (one GEMM: dgemm's 'auto', which splits too)
    monkeypatch.setattr(auto, "gemm_labels", lambda e: None)  # einsum's own exact value, pairwise
    got = expr(a, b)
    _same(got, _exact("ij,jk->ik", a, b))
    assert "pairwise" in expr.last_evaluation
    assert rt.einsum("ij,jk->ik", np.array([[1e300, 1e-300]]), np.array([[1e-300], [1e300]]), moduli="auto")[0, 0] == 2.0


# operands no plan of 49 moduli holds at once (each spans hundreds of binades, or holds a subnormal beside normal
# entries: ~1100 bits): the exact value pairwise in integers; the part-products split that came before refused them
WIDE = [
    ("pqrs,pi,qj,rk,sl->ijkl", [(3, 3, 3, 3)] + [(3, 3)] * 4, 150, False),  # the 5-operand 4-index transform
    ("ij,jk,kl->il", [(4, 5), (5, 6), (6, 3)], 20, True),  # a subnormal in every operand
    ("ij,ij,j->i", [(4, 5), (4, 5), (5,)], 300, False),  # elementwise, then a sum
    ("abc,ia,jb,kc,la,mb->ijklm", [(2, 3, 2), (2, 2), (2, 3), (2, 2), (2, 2), (2, 3)], 120, False),  # 6 operands
    ("ij,jk,k->", [(3, 4), (4, 5), (5,)], 250, False),  # a scalar
]


@pytest.mark.parametrize("sub, shapes, spread, subnormal", WIDE)
def test_einsum_auto_beyond_one_plan_is_correctly_rounded(sub, shapes, spread, subnormal):
    rng = np.random.default_rng(len(sub) + spread)
    ops = [_wide(rng, s, spread) for s in shapes]
    if subnormal:
        for x in ops:
            x.reshape(-1)[1] = 7 * 5e-324
    cplx = [o + 1j * _wide(rng, o.shape, spread) for o in ops]
    for args in (ops, cplx[:1] + ops[1:], cplx):
        expr = rt.contract_expression(sub, *[a.shape for a in args], moduli="auto")
        got = expr(*args)
        assert "pairwise" in expr.last_evaluation  # (so the test reaches that path)
        _same(got, _exact(sub, *args))


def test_chain_auto_and_rtol_beyond_one_plan():
    # six operators of wide160's span: the exact chain takes ~1500 bits; 'auto' and a target the classical GEMMs do
    # not meet both give the correctly rounded chain
    rng = np.random.default_rng(21)
    ops = [_wide(rng, (4, 4), 80) for _ in range(6)]
    X = _wide(rng, (2, 4, 4, 4), 80)
    axes = [0, 1, 2, 0, 1, 2]
    want = _exact(rt.plan_chain(ops, axes, moduli="fast").einsum_subscripts(1), X, *ops)
    _same(rt.mode_chain(X, ops, axes, moduli="auto"), want)
    _same(rt.plan_chain(ops, axes, rtol=1e-15)(X), want)


def test_einsum_auto_complex_and_constants():
    rng = np.random.default_rng(12)
    A = _wide(rng, (3, 4), 20) + 1j * _wide(rng, (3, 4), 20)
    B = _wide(rng, (4, 2), 20) - 1j * _wide(rng, (4, 2), 3)
    _same(rt.einsum("ij,jk->ik", A, B, moduli="auto"), _exact("ij,jk->ik", A, B))
    C = _wide(rng, (3, 3), 10)
    expr = rt.contract_expression("eij,ai,bj->eab", (4, 3, 3), C, C, constants=[1, 2], moduli="auto")
    X = _wide(rng, (4, 3, 3), 25)
    _same(expr(X), _exact("eij,ai,bj->eab", X, C, C))


def test_einsum_auto_follows_numpy_on_inf_and_nan():
    a = np.array([[1.0, np.inf], [2.0, 3.0]])
    b = np.array([[0.5, 1.0], [1.0, 0.0]])
    got = rt.einsum("ij,jk->ik", a, b, moduli="auto")
    with np.errstate(invalid="ignore"):
        want = a @ b
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got[1], want[1])
    assert np.isinf(got[0, 0])


@pytest.mark.parametrize("method", ["rescale_be", "norescale"])
def test_chain_auto_returns_the_exact_chain_rounded_once(method):
    rng = np.random.default_rng(13)
    ops = [_wide(rng, (3, 4), 10), _wide(rng, (2, 3), 10), _wide(rng, (3, 3), 10)]
    plan = rt.plan_chain(ops, [1, 0, 1], moduli="auto", method=method)
    X = _wide(rng, (2, 3, 4), 20)
    got = plan(X)
    sub = plan.einsum_subscripts(1)
    _same(got, _exact(sub, X, *ops))
    exact_value = np.einsum(sub, *[_F(o) for o in [X] + ops])
    err = max(abs(Fraction(float(g)) - v) for g, v in zip(got.ravel(), exact_value.ravel()))
    assert err <= Fraction(plan.error_bound(X)) == Fraction(float(np.spacing(np.abs(got).max()))) / 2
    _same(rt.mode_chain(X, ops, [1, 0, 1], moduli="auto"), got)
    with pytest.raises(ValueError, match="leave bits and input_bits unset"):
        rt.plan_chain(ops, [1, 0, 1], moduli="auto", bits=20)


def test_auto_call_after_a_call_on_another_basis():
    # the same plan called on data needing 13, then 26 moduli: the exact rungs share the constants' arrays, never
    # an encoding on another basis (a cached 13-moduli constant once broke the 26-moduli run with an IndexError)
    ops = [np.array([[0.0], [0.5]]), np.array([[5.55111512e-17, 0.5, 0.0]])]  # (long mantissas: wide exact widths)
    X = np.array([[[0.5, 0.0, 1.38777878e-17]], [[0.5, 0.0, 0.0]]])
    plan = rt.plan_chain(ops, [0, 1], moduli="auto")
    sub = plan.einsum_subscripts(1)
    for x in (X[1:], X[:1], X):
        _same(plan(x), _exact(sub, x, *ops))
    assert plan.last_evaluation.startswith("26 moduli")


def test_policy_names_and_errors():
    assert policy.accuracy_policy(None, "f").certified and policy.accuracy_policy("auto", "f").correctly_rounded
    assert policy.accuracy_policy("fast", "f").policy == "fast"
    with pytest.raises(ValueError, match="moduli must be None, 'fast', 'auto'"):
        rt.einsum("ij,jk->ik", np.eye(2), np.eye(2), moduli="exact")
    with pytest.raises(ValueError, match="leave bits=None"):
        rt.einsum("ij,jk->ik", np.eye(2), np.eye(2), moduli="auto", bits=30)
    with pytest.raises(ValueError, match="decode=None"):
        rt.contract_expression("ij,jk->ik", (2, 2), (2, 2), moduli="auto", decode=None)
    # 'fast': the 15-moduli plan, uncertified: the explicit basis's bits
    rng = np.random.default_rng(14)
    a, b = rng.uniform(-1, 1, (4, 5)), rng.uniform(-1, 1, (5, 3))
    _same(rt.einsum("ij,jk->ik", a, b, moduli="fast"), rt.einsum("ij,jk->ik", a, b, moduli=15))
    plan = rt.plan_chain([np.eye(3)], [0], moduli="fast")
    assert plan.policy == "fast" and not plan.classical


def test_least_moduli():
    assert exact.least_moduli(lambda s: s >= 23, 5) == 23
    assert exact.least_moduli(lambda s: s >= 2, 2) == 2
    assert exact.least_moduli(lambda s: False, 3) is None


def test_decode_exact_refusals_name_a_fix_that_works():
    rng = np.random.default_rng(16)
    a, b = rng.standard_normal((2, 2, 3, 3)), rng.standard_normal((3, 3, 2, 2))
    sub = "ijab,abcd->ijcd"
    with pytest.raises((rt.RNSRangeError, rt.PlanError), match="moduli='auto'") as info:
        rt.einsum(sub, a, b, decode="exact")
    assert "decode='exact'" in str(info.value)
    _same(rt.einsum(sub, a, b, moduli="auto"), _exact(sub, a, b))  # the hint followed
    with pytest.raises((rt.RNSRangeError, rt.PlanError), match="moduli='auto'"):  # 49 moduli do not hold it exactly
        rt.einsum("pqrs,pi,qj,rk,sl->ijkl", *([rng.standard_normal((12,) * 4)] + [rng.standard_normal((12, 12))] * 4),
                  moduli=49, decode="exact")
