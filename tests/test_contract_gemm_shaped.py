"""A GEMM-shaped expression's default (rnstensor/contract/gemm_shaped.py): dgemm's moduli element by element, dgemm's
bits, the classical bound and error_bound held against exact rationals."""

from fractions import Fraction

import numpy as np
import pytest

import rnstensor as rt
from rnstensor.contract.gemm_shaped import gemm_elements, gemm_labels
from rnstensor.gemm.stack import shared_moduli

U = Fraction(1, 2**53)


def _phi4(rng, shape):
    return rng.standard_normal(shape) * np.exp(4 * rng.standard_normal(shape))


def _exact(subscripts, a, b):
    """The exact value of every entry and of the magnitude contraction ``|a||b|`` (Fractions)."""
    frac = np.vectorize(Fraction, otypes=[object])
    fa, fb = frac(a), frac(b)
    return (np.asarray(np.einsum(subscripts, fa, fb, optimize=False), dtype=object),
            np.asarray(np.einsum(subscripts, np.abs(fa), np.abs(fb), optimize=False), dtype=object))


@pytest.mark.parametrize("subscripts, labels", [
    ("ij,jk->ik", ("i", "j", "k")), ("ji,jk->ik", ("i", "j", "k")), ("ij,kj->ki", ("i", "j", "k")),
    ("iab,abc->ci", ("i", "ab", "c")), ("iab,bac->ic", ("i", "ab", "c")), ("i,i->", ("", "i", "")),
    ("bij,bjk->bik", None),  # a batch label both operands carry: a stack, not one GEMM
    ("ij,jk->i", None),  # k summed over one operand alone
    ("ij,jk->ijk", None),  # nothing contracted
    ("iij,jk->ik", None),  # a diagonal
])
def test_which_expressions_are_one_gemm(subscripts, labels):
    x, y = subscripts.split("->")[0].split(",")
    shapes = [(3,) * len(x), (3,) * len(y)]
    assert gemm_labels(rt.contract_expression(subscripts, *shapes)) == labels


@pytest.mark.parametrize("subscripts, sa, sb", [
    ("ij,jk->ik", (6, 7), (7, 5)), ("ji,jk->ik", (7, 6), (7, 5)), ("ij,kj->ki", (6, 7), (5, 7)),
    ("iab,abc->ci", (4, 3, 5), (3, 5, 6)), ("iab,bac->ic", (4, 3, 5), (5, 3, 6)), ("i,i->", (9,), (9,)),
])
def test_each_element_is_dgemm_alone_within_the_classical_bound(subscripts, sa, sb):
    rng = np.random.default_rng(3)
    a, b = _phi4(rng, sa), _phi4(rng, sb)
    expr = rt.contract_expression(subscripts, sa, sb)
    y, bound = np.asarray(expr(a, b)), np.asarray(expr.error_bound(a, b))
    assert "moduli" in expr.last_evaluation and "classical" not in expr.last_evaluation
    exact, mag = _exact(subscripts, a, b)
    for key in np.ndindex(exact.shape):
        err = abs(Fraction(float(y[key])) - exact[key])
        # the default's promise: (1 + 2**-5) u |A||B| entry by entry; error_bound bounds the error itself
        assert err <= (1 + Fraction(1, 32)) * U * mag[key], (subscripts, key)
        assert err <= Fraction(float(bound[key])), (subscripts, key)
    # each element (the slices along the first operand's first label, where only it carries it and the output keeps
    # it; else the whole call) is dgemm's product of its rows by the second operand, bit for bit
    x, t = subscripts.split("->")[0].split(",")
    out = subscripts.split("->")[1]
    rows, contracted, cols = gemm_labels(expr)
    batch = expr._batch_label()
    sizes = dict(zip(x + t, a.shape + b.shape))
    B = np.einsum(f"{t}->{contracted}{cols}", b).reshape(int(np.prod([sizes[c] for c in contracted])), -1)
    for e in range(sizes[batch] if batch else 1):
        ae = np.take(a, [e], axis=x.index(batch)) if batch else a
        ye = np.take(y, [e], axis=out.index(batch)) if batch else y
        Ae = np.einsum(f"{x}->{rows}{contracted}", ae).reshape(-1, B.shape[0])
        assert np.array_equal(np.einsum(f"{out}->{rows}{cols}", ye).reshape(Ae.shape[0], -1), rt.dgemm(Ae, B))


def test_elements_choose_their_own_moduli_as_dgemm_does():
    rng = np.random.default_rng(11)
    a, b = _phi4(rng, (8, 4, 30)), _phi4(rng, (30, 20))
    counts = shared_moduli(30, False, a, b, np)[0]
    assert counts == [rt.gemm_moduli(a[i], b) for i in range(8)] and len(set(counts)) > 1
    expr = rt.contract_expression("ijk,kl->ijl", a.shape, b.shape)
    y = expr(a, b)
    for s in set(counts):
        assert f"{s} moduli" in expr.last_evaluation
    # a batch gives its elements' bits one by one (rnstensor.dask.apply's chunks)
    for i in range(8):
        assert np.array_equal(rt.einsum("ijk,kl->ijl", a[i:i + 1], b), y[i:i + 1])


def test_rows_dgemm_would_split_take_the_certificate_alone():
    # row 2 spans 2000 binades against a column that cancels its two ends: no 49 moduli keep the classical bound
    rng = np.random.default_rng(5)
    a, b = rng.uniform(-1, 1, (5, 6)), rng.uniform(-1, 1, (6, 4))
    a[2, :2], b[:2, 0] = (1e300, 1e-300), (1e-300, 1e300)
    assert shared_moduli(6, False, a[:, None, :], b, np)[0][2] is None
    expr = rt.contract_expression("ij,jk->ik", a.shape, b.shape)
    y, bound = expr(a, b), expr.error_bound(a, b)
    assert "composed classical GEMMs (1 of 5 elements)" in expr.last_evaluation
    alone = rt.contract_expression("ij,jk->ik", (1, 6), b.shape)
    assert np.array_equal(alone(a[2:3], b), y[2:3]) and alone.last_evaluation == "composed classical GEMMs"
    for i in (0, 1, 3, 4):  # the others: dgemm's
        assert np.array_equal(y[i:i + 1], rt.dgemm(a[i:i + 1], b))
    exact, mag = _exact("ij,jk->ik", a, b)
    for key in np.ndindex(exact.shape):
        err = abs(Fraction(float(y[key])) - exact[key])
        assert err <= (1 + Fraction(1, 32)) * U * mag[key] and err <= Fraction(float(bound[key])), key


def test_other_operands_take_the_certificate():
    rng = np.random.default_rng(2)
    a, b = rng.uniform(-1, 1, (4, 5)), rng.uniform(-1, 1, (5, 3))
    a[1, 2] = np.inf  # numpy's inf / NaN rule: the certificate's path, as before
    y = rt.einsum("ij,jk->ik", a, b)
    with np.errstate(invalid="ignore"):
        ref = a @ b
    bad = ~np.isfinite(ref)
    assert bad.any() and np.array_equal(y[bad], ref[bad], equal_nan=True)
    a[1, 2] = 0.5
    plain = rt.contract_expression("ij,jk->ik", a.shape, b.shape)
    assert gemm_elements(plain, gemm_labels(plain), plain._operands((a, b)), None, "i", False) is not None
    # a target keeps the certificate's own path; complex operands take zgemm's choice (test below)
    target = rt.contract_expression("ij,jk->ik", a.shape, b.shape, rtol=1e-10)
    assert gemm_elements(target, gemm_labels(target), target._operands((a, b)), None, "i", False) is None


def test_elements_on_several_widths_share_one_product(monkeypatch):
    # elements on several widths: the CPU's wide engine runs them as one product on the shared operand's integers at
    # the narrowest width (the wider ones lifted from it), each element still dgemm's bits
    from rnstensor.backends import get_backend

    be = get_backend("cpu")
    taken = []
    shared = be.exact_gemm_shared
    monkeypatch.setattr(be, "exact_gemm_shared", lambda *a: taken.append(shared(*a)) or taken[-1])
    rng = np.random.default_rng(4)
    a, b = _phi4(rng, (6, 16, 200)), _phi4(rng, (200, 100))
    y = rt.einsum("ijk,kl->ijl", a, b)
    assert len(taken) == 1 and taken[0] is not None and len(taken[0]) > 1
    for i in range(6):
        assert np.array_equal(y[i], rt.dgemm(a[i], b))


@pytest.mark.parametrize("mix", ["complex x complex", "real x complex", "complex x real"])
def test_complex_elements_are_zgemm_alone_within_the_classical_bound(mix):
    # complex operands (a real one with a complex one: its imaginary part 0): each element on the moduli zgemm gives
    # it alone, zgemm's bits; the default's promise sqrt(2) (1 + 2**-5) u |A||B| (moduli), and error_bound bounding
    # |Re err| + |Im err|, against Fractions
    import math

    rng = np.random.default_rng(len(mix))
    a, b = _phi4(rng, (4, 3, 20)), _phi4(rng, (20, 5))
    if mix.startswith("complex"):
        a = a + 1j * _phi4(rng, a.shape)
    if mix.endswith("complex"):
        b = b - 1j * _phi4(rng, b.shape)
    expr = rt.contract_expression("ijk,kl->ijl", a.shape, b.shape)
    y, bound = expr(a, b), expr.error_bound(a, b)
    assert "moduli" in expr.last_evaluation and "classical" not in expr.last_evaluation
    for i in range(4):
        assert np.array_equal(y[i], rt.zgemm(a[i].astype(complex), b.astype(complex)))
    F = lambda v: (Fraction(complex(v).real), Fraction(complex(v).imag))  # noqa: E731
    below = Fraction(1) - Fraction(1, 2**51)  # (math.hypot within an ulp: a lower bound of |z|)
    for i, j, l in np.ndindex(4, 3, 5):
        terms = [(F(a[i, j, q]), F(b[q, l])) for q in range(20)]
        re = sum(ar * br - ai * bi for (ar, ai), (br, bi) in terms)
        im = sum(ar * bi + ai * br for (ar, ai), (br, bi) in terms)
        er, ei = Fraction(y[i, j, l].real) - re, Fraction(y[i, j, l].imag) - im
        assert abs(er) + abs(ei) <= Fraction(float(bound[i, j, l]))
        mag = sum(Fraction(math.hypot(*map(float, x))) * Fraction(math.hypot(*map(float, z))) * below**2
                  for x, z in terms)
        assert er**2 + ei**2 <= 2 * ((1 + Fraction(1, 32)) * U * mag) ** 2


@pytest.mark.parametrize("subscripts, sa, sb", [
    ("ij,jk->ik", (6, 7), (7, 5)), ("ji,jk->ik", (7, 6), (7, 5)), ("iab,bac->ic", (4, 3, 5), (5, 3, 6)),
    ("i,i->", (9,), (9,)), ("bij,jk->bik", (3, 4, 5), (5, 6)),
])
@pytest.mark.parametrize("kind", ["real", "complex", "signed zeros"])
def test_auto_takes_dgemms_auto_with_the_same_bits(monkeypatch, subscripts, sa, sb, kind):
    # moduli='auto' of one GEMM: dgemm's (zgemm's) 'auto' on it, correctly rounded as einsum's own exact plan is, so
    # the same bits (signed zeros too), and correctly rounded against Fractions
    import rnstensor.contract.auto as auto

    rng = np.random.default_rng(len(subscripts) + len(kind))
    a, b = _phi4(rng, sa), _phi4(rng, sb)
    if kind == "complex":
        a = a + 1j * _phi4(rng, sa)
    if kind == "signed zeros":
        a.flat[:2], b.flat[:2] = (-0.0, 0.0), (-0.0, -0.0)
    y = rt.einsum(subscripts, a, b, moduli="auto")
    expr = rt.contract_expression(subscripts, sa, sb, moduli="auto")
    expr(a, b)
    assert expr.last_evaluation == "one GEMM, correctly rounded (dgemm's 'auto')"
    monkeypatch.setattr(auto, "gemm_labels", lambda e: None)  # einsum's own exact plan
    own = rt.einsum(subscripts, a, b, moduli="auto")
    assert np.array_equal(y, own) and np.array_equal(np.signbit(np.real(y)), np.signbit(np.real(own)))
    assert np.array_equal(np.signbit(np.imag(y)), np.signbit(np.imag(own)))
    if kind == "real":
        exact, _ = _exact(subscripts, a, b)
        for key in np.ndindex(exact.shape):
            assert float(np.asarray(y)[key]) == float(exact[key])
