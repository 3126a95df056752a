"""The default's certified bound (``(1 + 2**-5) u`` of the magnitudes, ``gamma_m`` where the classical GEMMs run) of
einsum / contract_expression / chain plans, against exact Fraction references."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rnstensor as rt
from rnstensor.encode import group_exponents
from rnstensor.program.classical import gamma
from rnstensor.run import policy
from rnstensor.run.policy import default_target

U = Fraction(1, 2**53)
TINY = Fraction(1, 2**1074)


def _terms_of(subscripts: str, ops):
    """``(output shape, [(output index, the operands' entries)])`` for every index assignment of an einsum."""
    ins, out = subscripts.split("->")
    terms = ins.split(",")
    sizes = {}
    for t, x in zip(terms, ops):
        sizes.update(zip(t, np.shape(x)))
    labels = sorted(sizes)
    rows = []
    for assign in itertools.product(*[range(sizes[c]) for c in labels]):
        env = dict(zip(labels, assign))
        rows.append((tuple(env[c] for c in out), [np.asarray(x)[tuple(env[c] for c in t)] for t, x in zip(terms, ops)]))
    return tuple(sizes[c] for c in out), rows


def _exact(subscripts: str, ops, f=lambda v: Fraction(float(v))):
    """The einsum over Fractions (every index assignment), with ``f`` applied to each entry."""
    shape, rows = _terms_of(subscripts, ops)
    res = {}
    for key, entries in rows:
        p = Fraction(1)
        for v in entries:
            p *= f(v)
        res[key] = res.get(key, 0) + p
    return shape, res


def _promise(m: int, evaluation: str) -> Fraction:
    """The default's relative bound: ``(1 + 2**-5) u`` (``gamma_m`` where smaller) of the magnitudes, ``gamma_m``
    where the composed classical GEMMs ran (for some elements or all; gamma() is rounded down)."""
    g = gamma(m) if "composed" in evaluation else default_target(m)
    return Fraction(g) * (1 + Fraction(1, 2**40))


def _terms(expr) -> int:
    """``m`` of the promise: the terms each contraction step of the path sums (1 for a plain product)."""
    return sum(math.prod(expr.sizes[c] for c in removed) for _, removed, *_ in expr._info.contraction_list)


def _check(subscripts: str, *ops):
    """The default result meets ``γ_m (|A||B|...)`` (plus a subnormal half-unit) on every entry, and so does
    ``error_bound``; returns the result."""
    expr = rt.contract_expression(subscripts, *[np.shape(x) for x in ops])
    y = np.asarray(expr(*ops))
    bound = np.asarray(expr.error_bound(*ops))
    shape, exact = _exact(subscripts, ops)
    _, mag = _exact(subscripts, ops, lambda v: abs(Fraction(float(v))))
    g = _promise(_terms(expr), expr.last_evaluation)
    assert y.shape == shape and y.dtype == np.float64
    for key, v in exact.items():
        err = abs(Fraction(float(y[key])) - v)
        assert err <= g * mag[key] + TINY, (subscripts, key, float(y[key]), float(v), float(err / max(mag[key], TINY)))
        assert err <= Fraction(float(bound[key])), (subscripts, key, float(err), float(bound[key]))
    return y


def test_issue_cases():
    # exact where float64 is exact or nearly so
    assert rt.einsum(",->", 1.0, 1.0) == 1.0
    assert rt.einsum("i,i->i", [0.5], [0.5])[0] == 0.25
    assert rt.einsum("i,i->", [1e300, 1e-300], [1e-300, 1e300]) == 2.0
    # [1e16, 1, -1e16] sums to 1 exactly; the classical bound gamma_3 * 2e16 allows float64's 0.0 (it is checked below)
    assert rt.einsum("ij,jk->ik", [[1.0, 1e-10]], [[1e-10], [1.0]])[0, 0] == np.float64(1e-10) + np.float64(1e-10)
    for sub, ops in [
        ("i,i->", ([1e300, 1e-300], [1e-300, 1e300])),
        ("ij,jk->ik", ([[1.0, 1e-10]], [[1e-10], [1.0]])),
        ("ij,jk,kl->il", ([[1.0, 1e-10]], [[1e-10, 0.0], [0.0, 1.0]], [[1.0], [1e-10]])),
        ("i->", ([1e16, 1.0, -1e16],)),
    ]:
        _check(sub, *[np.array(x) for x in ops])


def test_explicit_moduli_keep_the_fast_path():
    # the opt-out: an explicit basis runs the plan as planned (one exponent per slice, 53 bits)
    assert rt.einsum("i,i->", [1e300, 1e-300], [1e-300, 1e300], moduli=15) == 0.0
    a = np.random.default_rng(0).uniform(-1, 1, (6, 7))
    assert np.array_equal(rt.einsum("ij,kj->ik", a, a), rt.einsum("ij,kj->ik", a, a, moduli=15))


def test_well_scaled_data_takes_the_first_wider_rung():
    # the 15-moduli plan's 53-bit encodings alone may err by u of the magnitudes, more than (1 + 2**-5) u: well-scaled
    # data is certified one rung up (61 bits on 17 moduli), bit-identical to rtol set to the default's target, and
    # meets it (the oracle); the explicit basis is the fast opt-out
    rng = np.random.default_rng(1)
    A, U8 = rng.uniform(-1, 1, (4, 4)), rng.uniform(-1, 1, (5, 4, 4, 4))
    s = "ai,bj,ck,eijk->eabc"
    expr = rt.contract_expression(s, A.shape, A.shape, A.shape, U8.shape)
    y = _check(s, A, A, A, U8)
    assert np.array_equal(expr(A, A, A, U8), y) and expr.last_evaluation == "17 moduli, 61 bits"
    tight = rt.contract_expression(s, A.shape, A.shape, A.shape, U8.shape, rtol=policy.DEFAULT_RTOL)
    assert np.array_equal(tight(A, A, A, U8), y)
    fast = rt.contract_expression(s, A.shape, A.shape, A.shape, U8.shape, moduli=15)
    assert not np.array_equal(fast(A, A, A, U8), y)  # the opt-out rounds its 53-bit encodings


def test_elements_escalate_apart():
    # along the first index of the first operand (alone on it, kept by the output) each element takes the narrowest
    # width certified for it alone: a wide row escalates without its neighbours, which keep their bits
    rng = np.random.default_rng(8)
    X, A = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    X[2] *= np.exp(12 * rng.standard_normal(5))
    y = _check("bi,ij->bj", X, A)
    expr = rt.contract_expression("bi,ij->bj", X.shape, A.shape)
    expr(X, A)
    assert "of 6 elements)" in expr.last_evaluation
    alone = []
    for b in range(6):
        one = rt.contract_expression("bi,ij->bj", (1, 5), A.shape)
        assert np.array_equal(one(X[b:b + 1], A), y[b:b + 1])
        alone.append(one.last_evaluation)
    assert len(set(alone)) > 1 and all(f"{what} ({alone.count(what)} of 6 elements)" in expr.last_evaluation
                                       for what in alone)
    bound = expr.error_bound(X, A)
    for b in range(6):
        assert np.array_equal(rt.contract_expression("bi,ij->bj", (1, 5), A.shape).error_bound(X[b:b + 1], A),
                              bound[b:b + 1])


@pytest.mark.parametrize("target", [None, policy.DEFAULT_RTOL])
def test_chain_verdicts_are_each_tensors_own(target):
    # the per-tensor verdicts and excesses of a batch are bit for bit those of each tensor alone and of any subset
    # (the one-pass statistics included, which certify a lone tensor where the batch's do not)
    rng = np.random.default_rng(21)
    ops = [rng.uniform(-1, 1, (6, 6)) for _ in range(3)]
    X = rng.uniform(-1, 1, (12, 6, 6, 6)) * np.exp(rng.choice([0.0, 2.0, 6.0], (12, 1, 1, 1))
                                                   * rng.standard_normal((12, 6, 6, 6)))
    X[3, 0, 0, 0] = 2.0**-600  # one tensor refused (it spans too many binades)
    plan = rt.plan_chain(ops, [0, 1, 2])
    m = plan.classical_terms
    rtol = policy.default_target(m) if target is not None else None

    def verdicts(x):
        return plan._certificate(x, m, rtol, per_tensor=True).verdicts(m, rtol)

    ok, excess = verdicts(X)
    assert ok.any() and not ok.all() and np.isnan(excess[3])
    for t in range(len(X)):
        ok1, ex1 = verdicts(X[t:t + 1])
        assert ok1[0] == ok[t] and np.array_equal(ex1, excess[t:t + 1], equal_nan=True), t
    pick = [7, 3, 0, 11, 5]
    ok2, ex2 = verdicts(X[pick])
    assert np.array_equal(ok2, ok[pick]) and np.array_equal(ex2, excess[pick], equal_nan=True)


def test_fallbacks_are_each_tensors_own():
    # no residue plan certifies these tensors (operators spanning e**+-9); one exact plan holds all but the tensor
    # with a 2**-k entry, which needs the classical GEMMs: it alone takes them, the others stay correctly rounded,
    # as each alone (the whole group once fell back to the classical GEMMs together)
    rng = np.random.default_rng(45)
    n, B = int(rng.integers(2, 7)), int(rng.integers(2, 14))
    rng.choice(["uniform", "wide", "tiny", "int"])
    ops = [rng.uniform(-1, 1, (n, n)) * (np.exp(rng.choice([0, 3]) * rng.standard_normal((n, n)))) for _ in range(3)]
    X = rng.uniform(-1, 1, (B, n, n, n))
    X[rng.integers(0, B), 0, 0, 0] = 2.0 ** -int(rng.integers(100, 700))
    plan = rt.plan_chain(ops, [0, 1, 2])
    y = plan(X)
    assert "composed classical GEMMs (1 of 8 tensors)" in plan.last_evaluation
    assert plan.last_evaluation.startswith("correctly rounded")
    for t in range(B):
        assert np.array_equal(plan(X[t:t + 1]), y[t:t + 1]), t
    assert plan.error_bound(X) == max(plan.error_bound(X[t:t + 1]) for t in range(B))
    expr = rt.contract_expression("eijk,ai,bj,ck->eabc", X.shape, *ops, constants=[1, 2, 3])
    z = expr(X)
    one = rt.contract_expression("eijk,ai,bj,ck->eabc", (1, n, n, n), *ops, constants=[1, 2, 3])
    for t in range(B):
        assert np.array_equal(one(X[t:t + 1]), z[t:t + 1]), t


def test_escalation_and_fallback():
    # rows spanning ~40 binades need wider encodings; 1800 binades the composed classical GEMMs
    rng = np.random.default_rng(2)
    A = rng.uniform(-1, 1, (3, 5)) * 2.0 ** rng.integers(-40, 1, (3, 5))
    B = rng.uniform(-1, 1, (5, 2))
    _check("ij,jk->ik", A, B)
    A[0, 0], A[0, 1] = 1e300, 1e-300
    B[0, 0], B[1, 0] = 1e-300, 1e300
    _check("ij,jk->ik", A, B)


def test_default_falls_back_to_the_correctly_rounded_result():
    # an entry too small for the widest certified encoding (2**-200 in a row led by 1, read alone by b's zero): no
    # residue plan meets gamma_m of its magnitude, one exact plan of 43 moduli holds it all, so the default returns
    # the correctly rounded result (bit for bit moduli='auto') and half a unit at each entry as its bound
    # (the first row; the second, alone in its verdict, is certified in residues)
    a = np.array([[1.0, 2.0**-200, 3.0], [0.5, 1.0, 2.0**-150]])
    b = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 2.0**-100]])
    expr = rt.contract_expression("ij,jk->ik", a.shape, b.shape)
    y = _check("ij,jk->ik", a, b)
    assert np.array_equal(expr(a, b), y) and expr.last_evaluation.endswith(
        "correctly rounded (43 moduli, exact) (1 of 2 elements)")
    first = rt.contract_expression("ij,jk->ik", (1, 3), b.shape)
    assert np.array_equal(first(a[:1], b), y[:1]) and first.last_evaluation.startswith("correctly rounded")
    assert np.array_equal(y[:1], rt.einsum("ij,jk->ik", a[:1], b, moduli="auto"))
    assert np.array_equal(expr.error_bound(a, b)[:1], np.spacing(np.abs(y[:1])) / 2)
    # a chain the same: no certified plan for either tensor (A X[0] = (2**-200, 1)), their exact values on 27
    # moduli rounded once, in one fallback call; each alone the same (verdicts are per tensor)
    A, B = np.array([[1.0, 2.0**-200], [0.5, 1.0]]), np.array([[0.0, 1.0], [1.0, 3.0]])
    X = np.array([[0.0, 1.0], [1.0, -1.0]])
    plan = rt.plan_chain([A, B], [0, 0], ndim=1, min_bits=0)
    y = plan(X)
    assert plan.last_evaluation == "correctly rounded (27 moduli, exact)"
    for t in range(2):
        assert np.array_equal(plan(X[t:t + 1]), y[t:t + 1]) and plan.last_evaluation.startswith("correctly rounded")
    assert np.array_equal(y, rt.plan_chain([A, B], [0, 0], ndim=1, moduli="auto")(X))
    want = [Fraction(float(B[i, 0])) * sum(Fraction(float(A[0, j])) * Fraction(float(X[r, j])) for j in range(2))
            + Fraction(float(B[i, 1])) * sum(Fraction(float(A[1, j])) * Fraction(float(X[r, j])) for j in range(2))
            for r in range(2) for i in range(2)]
    assert [float(w) for w in want] == list(y.ravel())  # float(Fraction) rounds to nearest


def test_zeros_and_exact_results():
    A = np.array([[0.0, 3.0], [0.0, 0.0]])
    B = np.array([[2.0, 0.0], [0.0, 5.0]])
    y = _check("ij,jk->ik", A, B)
    assert np.array_equal(y, A @ B)
    x = np.array([2.0**-1074, 3.0, -2.0**1000])
    assert np.array_equal(_check("i,i->i", x, np.array([1.0, 1 / 3, 0.5])), x * np.array([1.0, 1 / 3, 0.5]))
    assert np.array_equal(rt.einsum("ij->ji", B), B.T)


def _cexact(subscripts: str, ops):
    """The complex einsum over pairs of Fractions, and a lower bound of its magnitudes (|z| >= max |parts|)."""
    val, low = {}, {}
    for key, entries in _terms_of(subscripts, ops)[1]:
        re, im, mag = Fraction(1), Fraction(0), Fraction(1)
        for z in map(complex, entries):
            zr, zi = Fraction(z.real), Fraction(z.imag)
            re, im = re * zr - im * zi, re * zi + im * zr
            mag *= max(abs(zr), abs(zi))
        r0, i0 = val.get(key, (0, 0))
        val[key] = (r0 + re, i0 + im)
        low[key] = low.get(key, 0) + mag
    return val, low


@pytest.mark.parametrize("sub", ["ij,jk->ik", "i,i->", "ai,bj,eij->eab", "i,i->i"])
def test_complex_classical_bound(sub):
    # |err| <= sqrt(2) γ_m |A||B|...: checked as err² <= 2 γ_m² (a lower bound of the magnitudes)²
    rng = np.random.default_rng(len(sub))
    terms = sub.split("->")[0].split(",")
    sizes = {c: 3 for c in set("".join(terms))}
    for spread in (0, 30, 400):
        ops = []
        for t in terms:
            shape = tuple(sizes[c] for c in t)
            z = rng.standard_normal(shape) * 2.0 ** rng.integers(-spread, 1, shape) + 1j * rng.standard_normal(shape)
            ops.append(z)
        expr = rt.contract_expression(sub, *[z.shape for z in ops])
        y = np.asarray(expr(*ops))
        bound = np.asarray(expr.error_bound(*ops))
        val, low = _cexact(sub, ops)
        # the residue path meets sqrt(2) γ_m; the composed ZGEMMs (spread 400) their own sqrt(2) γ_(k+2) per step
        m = _terms(expr) + (2 * len(expr._info.contraction_list) if expr.last_evaluation.startswith("composed") else 0)
        g = _promise(m, expr.last_evaluation)
        for key, (re, im) in val.items():
            er, ei = Fraction(y[key].real) - re, Fraction(y[key].imag) - im
            assert er**2 + ei**2 <= 2 * (g * low[key] + TINY) ** 2, (sub, spread, key, expr.last_evaluation)
            assert abs(er) + abs(ei) <= Fraction(float(bound[key])), (sub, spread, key)


def test_tensors_keep_their_path():
    # RNSTensor operands carry their basis (the explicit opt-out): the call runs on it as planned
    T = rt.encode(np.ones((2, 3)), 15)
    assert np.array_equal(rt.decode(rt.einsum("ij,ij->ij", T, T)), np.ones((2, 3)))


_EXPRESSIONS = ["ij,jk->ik", "i,i->", "ij,j->i", "ai,bj,eij->eab", "ij,jk,kl->il", "i,i->i", "ij->", "ijk,k->ij"]


@st.composite
def _case(draw):
    sub = draw(st.sampled_from(_EXPRESSIONS))
    terms = sub.split("->")[0].split(",")
    sizes = {c: draw(st.integers(1, 3)) for c in sorted(set("".join(terms)))}
    span = draw(st.sampled_from([0, 4, 40, 300]))  # binades each operand spans
    top = 1000 // len(terms) - span - 1  # no product of entries overflows or underflows
    ops = []
    for t in terms:
        shape = tuple(sizes[c] for c in t)
        n = math.prod(shape)
        mant = draw(st.lists(st.one_of(st.just(0.0), st.floats(0.5, 1, exclude_max=True), st.floats(-1, -0.5)),
                             min_size=n, max_size=n))
        exps = draw(st.lists(st.integers(-span, 0), min_size=n, max_size=n))
        base = draw(st.integers(-top, top))
        x = np.ldexp(np.array(mant), np.array(exps) + base).reshape(shape)
        if draw(st.booleans()):
            x = np.where(np.abs(x) < 0.25 * 2.0**base, 0.0, x)  # exact zeros
        if draw(st.integers(0, 4)) == 0 and n > 1:
            x.reshape(-1)[0] = -x.reshape(-1)[-1]  # an exactly cancelling pair
        ops.append(x)
    return sub, ops


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_case())
def test_classical_bound_property(case):
    sub, ops = case
    _check(sub, *ops)


@st.composite
def _chain_case(draw):
    d = draw(st.integers(1, 3))
    n = [draw(st.integers(1, 3)) for _ in range(d)]
    span = draw(st.sampled_from([0, 4, 30, 200]))

    def arr(shape):
        k = math.prod(shape)
        mant = draw(st.lists(st.one_of(st.just(0.0), st.floats(0.5, 1, exclude_max=True), st.floats(-1, -0.5)),
                             min_size=k, max_size=k))
        exps = draw(st.lists(st.integers(-span, 0), min_size=k, max_size=k))
        return np.ldexp(np.array(mant), np.array(exps) + draw(st.integers(-100, 100))).reshape(shape)

    ops = [arr((draw(st.integers(1, 3)), n[k])) for k in range(d)]
    return ops, arr((draw(st.integers(1, 2)),) + tuple(n))


def _check_chain(ops, axes, X):
    """The default plan of the chain meets ``γ_m |A_n| ... |A_1| |X|`` entrywise, and so does ``error_bound``."""
    plan = rt.plan_chain(ops, axes, min_bits=0)
    y = plan(X)
    bound = plan.error_bound(X)
    exact, mag = _mode_products(ops, axes, X), _mode_products([np.abs(A) for A in ops], axes, np.abs(X))
    g = _promise(plan.classical_terms, plan.last_evaluation)
    for key in np.ndindex(exact.shape):
        err = abs(Fraction(float(y[key])) - exact[key])
        assert err <= g * mag[key] + TINY, (key, float(y[key]), float(exact[key]), plan.last_evaluation)
        assert err <= Fraction(bound), (key, float(err), bound)
    return plan


def _mode_products(ops, axes, X):
    """``A_d ... A_1 X`` over Fractions, operator ``k`` contracting axis ``axes[k]`` of the tensors (batch first)."""
    y = np.vectorize(Fraction, otypes=[object])(X)
    for A, ax in zip(ops, axes):
        Af = np.vectorize(Fraction, otypes=[object])(A)
        y = np.moveaxis(np.tensordot(Af, y, axes=([1], [1 + ax])), 0, 1 + ax)
    return y


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_chain_case())
def test_chain_plan_classical_bound_property(case):
    ops, X = case
    _check_chain(ops, list(range(len(ops))), X)


@st.composite
def _revisiting_chain(draw):
    """A chain on a 1-D or 2-D tensor whose operators come back to an axis (folded row exponents)."""
    span = draw(st.sampled_from([0, 8, 60, 250]))
    axes = draw(st.sampled_from([[0, 0], [0, 1, 0], [1, 1, 0, 1], [0, 0, 0]]))
    length = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    ops = []
    for ax in axes:
        rows = draw(st.integers(1, 3))
        k = rows * length[ax]
        mant = draw(st.lists(st.floats(0.5, 1, exclude_max=True), min_size=k, max_size=k))
        exps = draw(st.lists(st.integers(-span, 0), min_size=k, max_size=k))
        sign = draw(st.lists(st.sampled_from([1.0, -1.0, 0.0]), min_size=k, max_size=k))
        ops.append(np.ldexp(np.array(mant) * sign, np.array(exps) + draw(st.integers(-60, 60))).reshape(rows, -1))
        length[ax] = rows
    # the plan's tensor has as many axes as the operators name, after the batch axis
    shape = (draw(st.integers(1, 2)),) + tuple(ops[axes.index(ax)].shape[1] for ax in range(max(axes) + 1))
    k = math.prod(shape)
    x = np.ldexp(np.array(draw(st.lists(st.floats(-1, 1), min_size=k, max_size=k))),
                 np.array(draw(st.lists(st.integers(-span, 0), min_size=k, max_size=k))))
    return ops, axes, x.reshape(shape)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_revisiting_chain())
def test_revisiting_chain_classical_bound_property(case):
    ops, axes, X = case
    _check_chain(ops, axes, X)


def test_error_bound_leaves_the_calls_evaluation():
    # found by hypothesis: a batch whose first tensor spans 900 binades (the classical GEMMs, alone) and whose second
    # is correctly rounded; error_bound replays the fallback tensor by tensor, and its last label ("correctly rounded")
    # replaced the call's, so a reader of last_evaluation held the classical GEMMs' result to the residues' target
    ops = [np.array([[0.9984362142253211]]), np.array([[3.870602074806481e-16, 0.5]]), np.array([[0.9984362142253211]])]
    X = np.array([0.19295817577216012, -8.108462021896723e-272, -0.011130820711346615, 0.0]).reshape(2, 1, 2)
    plan = _check_chain(ops, [0, 1, 0], X)
    said = plan.last_evaluation
    assert said.startswith("composed classical GEMMs (1 of 2 tensors); correctly rounded (")
    plan.error_bound(X)
    assert plan.last_evaluation == said
    expr = rt.contract_expression("ij,jk->ik", (2, 2), (2, 1))
    a, b = np.array([[1.0, 2.0**-900], [0.5, 0.25]]), np.array([[1.0], [3.0]])
    expr(a, b)
    said = expr.last_evaluation
    expr.error_bound(a, b)
    assert expr.last_evaluation == said


def test_an_overflowing_bound_refuses_its_tensor():
    # a tensor whose residue bound overflows (here its relative part, inf) is refused, NaN, like a floor's refusal:
    # an inf excess asked for an infinite next rung, so no group took the tensor and its result was never written
    from rnstensor.program.classical import ClassicalErrors

    rng = np.random.default_rng(8)
    plan = rt.plan_chain([rng.uniform(-1, 1, (3, 3))], [0])
    m = plan.classical_terms
    obs = plan._certificate(rng.uniform(-1, 1, (2, 3)), m, 1e-16, per_tensor=True)
    assert isinstance(obs, ClassicalErrors)
    c, sc, g, r, a, lo = obs.state[obs.out]
    obs.state[obs.out] = (c, sc, g, np.array([0.0, np.inf]), a, lo)
    ok, excess = obs.verdicts(m, 1e-16)
    assert not ok[1] and np.isnan(excess[1]) and (ok[0] or 0 < excess[0] < np.inf)
    assert not obs.certified(m, 1e-16) and obs.excess is None and obs.reason


def test_revisiting_chain_is_certified():
    # rows of the first product differ by 2**-40: folded into the second operator's columns on the same axis
    A1 = np.diag([1.0, 2.0**-40, 3.0])
    A2 = np.array([[1.0, 2.0**40, 1.0], [0.5, 1.0, -1.0]])
    X = np.random.default_rng(5).uniform(-1, 1, (4, 3))
    plan = _check_chain([A1, A2], [0, 0], X)
    assert any(isinstance(st, rt.program.Fold) for st in plan.program.steps)
    assert plan.last_evaluation.startswith("residues on")


def test_chain_plan_default_and_opt_out():
    rng = np.random.default_rng(3)
    ops = [rng.uniform(-1, 1, (6, 6)) for _ in range(3)]
    X = rng.uniform(-1, 1, (20, 6, 6, 6))
    # the default's target, (1 + 2**-5) u, met by the 15-moduli plan itself on these tensors: the explicit basis's bits
    plan, fast = rt.plan_chain(ops, [0, 1, 2]), rt.plan_chain(ops, [0, 1, 2], moduli=15)
    assert np.array_equal(plan(X), fast(X)) and plan.last_evaluation == "residues on 15 moduli"
    _check_chain(ops, [0, 1, 2], X[:4])
    diag = [np.diag(rng.uniform(0.5, 1, 6)) for _ in range(3)]
    plan, fast = rt.plan_chain(diag, [0, 1, 2]), rt.plan_chain(diag, [0, 1, 2], moduli=15)
    X[0, 0, 0, 0] = 2.0**-700  # one tensor spans 700 binades: its small entry needs the classical GEMMs
    y = plan(X)
    assert "composed classical GEMMs (1 of 20 tensors)" in plan.last_evaluation
    assert np.array_equal(plan(X[:1]), y[:1]) and plan.last_evaluation == "composed classical GEMMs"
    assert np.array_equal(plan(X[1:]), y[1:]) and "classical" not in plan.last_evaluation  # the others: residues
    want = Fraction(X[0, 0, 0, 0]) * math.prod(Fraction(float(D[0, 0])) for D in diag)
    assert abs(Fraction(y[0, 0, 0, 0]) - want) <= Fraction(gamma(18)) * want
    assert fast(X)[0, 0, 0, 0] == 0  # the planned basis rounds it away (one exponent per tensor)


@pytest.mark.parametrize("shared", [(), (1,), (0, 2), None])
def test_certificate_reads_the_encodes_exponents(shared):
    # the certification runs before the residues: its exponents must be the ones encode() gives
    from rnstensor.encode import group_exponents

    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 4, 5)) * 2.0 ** rng.integers(-30, 30, (3, 4, 5))
    x[1] = 0.0
    axes = tuple(range(3)) if shared is None else shared
    T = rt.encode(x, 15, 53, shared_axes=shared)
    assert np.array_equal(np.broadcast_to(T.exponent(), x.shape), np.broadcast_to(-group_exponents(x, 53, axes), x.shape))


def test_classical_chain_keeps_intermediate_results_out_of_underflow():
    # found by hypothesis: 0.047 * 2**-1022 rounded as a subnormal, then multiplied by 4, was 2 units of
    # 2**-1074 off; each tensor is now scaled up (exactly) for the classical GEMMs and scaled back once
    ops = [np.array([[0.04735344133845164, 0.0]]), np.array([[4.0]])]
    X = np.array([[2.2250738585072014e-308, 1.0]])
    plan = _check_chain(ops, [0, 0], X)
    assert plan.last_evaluation == "composed classical GEMMs"
    y = plan.classical_chain(X)
    exact = 4 * Fraction(ops[0][0, 0]) * Fraction(X[0, 0])
    # a normal rounding of the scaled product, then the scaling back's half unit of 2**-1074 (the old path
    # was 2 units off)
    assert abs(Fraction(float(y[0, 0])) - exact) <= exact * Fraction(1, 2**52) + Fraction(1, 2**1075)


# ----- the chain certificate from blocked statistics ------------------------------------------------------


def _chain_case(rng, kind: str, shape, outs):
    X = rng.uniform(-1, 1, (37,) + tuple(shape))
    if kind == "per-tensor":
        X *= np.ldexp(1.0, rng.integers(-400, 400, (37,) + (1,) * len(shape)).astype(np.int32))
    elif kind == "wide":
        X = np.ldexp(X, rng.integers(-40, 40, X.shape).astype(np.int32))
    elif kind == "sparse":
        X[rng.random(X.shape) < 0.8] = 0.0
        X[3] = 0.0
    elif kind == "integers":
        X = rng.integers(-50, 50, X.shape).astype(np.float64)
    ops = []
    cur = list(shape)
    for ax, n_out in enumerate(outs):
        A = rng.uniform(-1, 1, (n_out, cur[ax]))
        if kind == "sparse":
            A[0] = 0.0  # a zero row: zero magnitudes along it
        ops.append(A)
        cur[ax] = n_out
    return X, ops


@pytest.mark.parametrize("kind", ["uniform", "per-tensor", "wide", "sparse", "integers"])
@pytest.mark.parametrize("shape,outs", [((8, 8, 8), (8, 8, 8)), ((3, 20, 5), (6, 4, 17)), ((40,), (9,)),
                                        ((2, 70), (5, 3))])
def test_chain_statistics_bound_the_full_certificate(kind, shape, outs):
    from rnstensor.program.classical import ChainStatistics, ClassicalErrors

    rng = np.random.default_rng(len(shape) * 100 + sum(outs))
    X, ops = _chain_case(rng, kind, shape, outs)
    plan = rt.plan_chain(ops, list(range(len(shape))))
    m = plan.classical_terms
    full = plan._certificate(X)
    stats = ChainStatistics.of(plan.program, lambda st: plan._float_operators(np, True)[st.source] if st.constant else X,
                    lambda st: (plan._operator_value(st.source, np).exp.total() if st.constant
                                else -group_exponents(X, st.bits, st.shared)))
    if any(op.shape[1] > 64 for op in ops):
        assert stats is None  # the arrays' einsum path, not the fused magnitudes: no statistics
        return
    assert stats is not None
    quick = ClassicalErrors(full.leaf, full.exponents, magnitudes=stats).run(plan.program)
    assert quick.reason is None or full.reason is not None
    if full.reason is None and quick.reason is None:
        for slot in full.state:
            cf, sf, gf, rf, af, lof = full.state[slot]
            cq, sq, gq, rq, aq, loq = quick.state[slot]
            assert (sq, gq, af) == (sf, gf, aq) and cq.shape == cf.shape
            assert loq == lof, "the smallest magnitudes are the arrays' own values"
            assert rq >= rf and rq <= rf * 4 + 1e-300, "the ratios bound the arrays' from above, not far"
        assert not quick.certified(m) or full.certified(m)
    assert quick.exact == full.exact
    # the plan's own certificate: the quick one where it holds, the full verdict always
    obs = plan._certificate(X, m)
    assert obs.certified(m) == full.certified(m) and obs.exact == full.exact


def test_chain_statistics_apply_to_plain_chains_only():
    from rnstensor.program.classical import ChainStatistics

    rng = np.random.default_rng(5)
    X = rng.uniform(-1, 1, (4, 5, 6))
    revisit = rt.plan_chain([rng.uniform(-1, 1, (5, 5)), rng.uniform(-1, 1, (6, 6)), rng.uniform(-1, 1, (3, 5))],
                            [0, 1, 0])
    leaf = lambda st: revisit._float_operators(np, True)[st.source] if st.constant else X  # noqa: E731
    exps = lambda st: (revisit._operator_value(st.source, np).exp.total() if st.constant  # noqa: E731
                       else -group_exponents(X, st.bits, st.shared))
    assert ChainStatistics.of(revisit.program, leaf, exps) is None  # a fold: the arrays' certificate
    y = revisit(X)
    assert revisit.last_evaluation.startswith("residues") and y.shape == (4, 3, 6)


@pytest.mark.parametrize("kind", ["uniform", "per-tensor", "wide", "sparse", "integers"])
def test_einsum_certifies_from_statistics_with_the_same_verdicts_and_bits(monkeypatch, kind):
    from rnstensor.program import classical

    rng = np.random.default_rng(len(kind))
    X, ops = _chain_case(rng, kind, (6, 5, 7), (4, 8, 3))
    used = []
    real_of = classical.ChainStatistics.of
    monkeypatch.setattr(classical.ChainStatistics, "of",
                        classmethod(lambda cls, *a: used.append(real_of(*a)) or used[-1]))
    for make in (lambda: (lambda x: rt.einsum("eijk,ai,bj,ck->eabc", x, *ops)),
                 lambda: rt.contract_expression("eijk,ai,bj,ck->eabc", X.shape, *ops, constants=[1, 2, 3])):
        used.clear()
        got = make()(X)
        assert used and used[0] is not None, "the chain's statistics apply (matrices as operands or constants)"
        monkeypatch.setattr(classical.ChainStatistics, "of", classmethod(lambda cls, *a: None))
        want = make()(X)  # the full certificate only
        monkeypatch.setattr(classical.ChainStatistics, "of",
                            classmethod(lambda cls, *a: used.append(real_of(*a)) or used[-1]))
        assert np.array_equal(got.view(np.int64), want.view(np.int64))


def test_statistics_refuse_a_change_of_units():
    # the statistics hold magnitudes in the units of the input; a step that folds the scale into the arrays (a
    # chain far deeper than planned) leaves the verdict to the arrays' certificate
    from rnstensor.program import classical as C

    quick = C.ClassicalErrors(None, None, magnitudes=C.ChainStatistics(np.zeros((1, 3)), 0))
    with pytest.raises(C._Refused, match="change units"):
        quick._normalized(np.zeros(2), 2.0**-700, 1)
    c, sc = C.ClassicalErrors(None, None)._normalized(np.ones(2), 2.0**-700, 1)
    assert sc == 1.0 and c[0] == 2.0**-700
    assert quick._normalized(np.ones(2), 0.5, 1 << 100)[1] == 0.5
