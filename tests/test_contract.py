"""einsum / contract_expression: numpy semantics, exact values within the stated bound, plans and errors."""

from __future__ import annotations

import importlib
import math
from fractions import Fraction

import numpy as np
import opt_einsum
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rnstensor as rt
from rnstensor.arith import float_parts, round_scaled_int
from rnstensor.errors import PlanError, RNSRangeError
from rnstensor import ir

contract_mod = importlib.import_module("rnstensor.contract")

# (expression, shapes): explicit and implicit outputs, ellipses, diagonals, traces, sums,
# outer products, 0-d operands, broadcasting of size-1 dimensions, 2..6 operands
CORPUS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 2)]),
    ("ij,kj", [(3, 4), (2, 4)]),
    ("ii", [(4, 4)]),
    ("ii->i", [(3, 3)]),
    ("iij->j", [(3, 3, 2)]),
    ("ij->", [(3, 4)]),
    ("ij->j", [(3, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ijk->kji", [(2, 3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("i,i->", [(7,), (7,)]),
    ("i,i->i", [(5,), (5,)]),
    ("ij,ij->i", [(3, 4), (3, 4)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    (",ij->ij", [(), (2, 3)]),
    (",", [(), ()]),
    ("i,", [(3,), ()]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bij,bjk->bki", [(3, 2, 2), (3, 2, 4)]),
    ("ijk,jil->kl", [(2, 3, 4), (3, 2, 5)]),
    ("iij,jk->ik", [(3, 3, 4), (4, 2)]),
    ("...j,jk", [(2, 3, 4), (4, 5)]),
    ("...j,j...", [(2, 4), (4, 2)]),
    ("i...,i...->...", [(3, 1, 2), (3, 4, 2)]),
    ("ij,jk->ik", [(3, 1), (4, 5)]),
    ("eijk,ai,bj,ck->eabc", [(5, 3, 3, 3), (4, 3), (4, 3), (4, 3)]),
    ("eijk,ia,jb,kc->eabc", [(2, 4, 4, 4), (4, 2), (4, 2), (4, 2)]),
    ("ab,bc,cd,de->ae", [(2, 3), (3, 4), (4, 5), (5, 2)]),
    ("ab,bc,cd,de,ef,fa->", [(2, 3), (3, 2), (2, 3), (3, 2), (2, 2), (2, 2)]),
    ("ij,jk,kl->li", [(2, 6), (6, 3), (3, 4)]),
    ("abc,cd,db->a", [(3, 2, 4), (4, 5), (5, 2)]),
    ("ab,cd->abcd", [(2, 2), (3, 2)]),
    ("ijk,ijk,ijk->", [(2, 3, 2), (2, 3, 2), (2, 3, 2)]),
    ("ij,i,j->", [(4, 5), (4,), (5,)]),
    ("ji,kj,lk,ml->im", [(3, 2), (4, 3), (2, 4), (3, 2)]),
]


def _operands(shapes, cplx, seed: int):
    """Random U[-1, 1) operands; ``cplx``: True (all complex), 'mixed' (every other one) or False."""
    r = np.random.default_rng(seed)
    ops = [r.uniform(-1, 1, s) for s in shapes]
    if cplx:
        ops = [o + 1j * r.uniform(-1, 1, o.shape) if (cplx is True or k % 2 == seed % 2) else o for k, o in enumerate(ops)]
    return ops


def _exact(eq: str, ops) -> tuple[np.ndarray, np.ndarray, int]:
    """The exact einsum: (real ints, imag ints, e) with value ``(re + i im) * 2**e``, via Python-int einsum."""
    parts_re, parts_im, e = [], [], 0
    for x in ops:
        x = np.asarray(x, dtype=np.complex128)
        both = np.stack([x.real, x.imag])
        m, q = float_parts(both)
        lo = int(q[m != 0].min()) if (m != 0).any() else 0
        ints = np.vectorize(lambda mm, qq: (int(mm) << (int(qq) - lo)) if mm else 0, otypes=[object])(m, q)
        parts_re.append(np.asarray(ints[0], dtype=object))  # 0-d: a bare int would become int64
        parts_im.append(np.asarray(ints[1], dtype=object))
        e += lo
    # (a + ib)(c + id)... by expanding over the real/imaginary choice of every operand
    n = len(ops)
    re = im = None
    for mask in range(1 << n):
        args = [parts_im[k] if mask >> k & 1 else parts_re[k] for k in range(n)]
        term = np.asarray(np.einsum(eq, *args) if n else 0, dtype=object)
        k = bin(mask).count("1")
        sign = -1 if k % 4 in (2, 3) else 1
        if k % 2 == 0:
            re = term * sign if re is None else re + term * sign
        else:
            im = term * sign if im is None else im + term * sign
    return np.asarray(re, dtype=object), np.asarray(im if im is not None else re * 0, dtype=object), e


def _round(ints: np.ndarray, e: int) -> np.ndarray:
    out = np.empty(ints.shape)
    for idx in np.ndindex(ints.shape):
        out[idx] = round_scaled_int(int(ints[idx]), e)
    return out


def _abs_err(got: np.ndarray, ints: np.ndarray, e: int) -> np.ndarray:
    """|got - ints 2**e| exactly, then rounded up to float64."""
    out = np.empty(ints.shape)
    for idx in np.ndindex(ints.shape):
        d = Fraction(float(got[idx])) - Fraction(int(ints[idx])) * Fraction(2) ** e
        f = float(abs(d))
        out[idx] = f if Fraction(f) >= abs(d) else math.nextafter(f, math.inf)
    return out


@pytest.mark.parametrize("cplx", [False, True, "mixed"], ids=["real", "complex", "mixed"])
@pytest.mark.parametrize("eq,shapes", CORPUS, ids=[c[0] or "scalar" for c in CORPUS])
def test_corpus_matches_numpy_and_the_exact_value_within_the_bound(eq, shapes, cplx):
    ops = _operands(shapes, cplx, seed=len(eq) + 7 * bool(cplx))
    cplx = any(np.iscomplexobj(o) for o in ops)
    ref = np.einsum(eq, *ops)
    got = rt.einsum(eq, *ops)
    assert np.shape(got) == np.shape(ref)
    assert np.asarray(got).dtype == np.asarray(ref).dtype
    assert type(got) is type(ref) or np.ndim(ref) > 0
    re, im, e = _exact(eq, ops)
    got = np.asarray(got)
    bound = rt.contract_expression(eq, *shapes).error_bound(*ops)
    err = _abs_err(got.real, re, e) + (_abs_err(got.imag, im, e) if cplx else 0)
    assert (err <= bound).all()
    # the bound is float64-level: within a modest multiple of u times the expression on |x|
    absx = [np.abs(o.real) + np.abs(o.imag) for o in ops]
    scale = np.einsum(eq, *absx) if absx else 1.0
    assert (bound <= 2.0**-53 * 4096 * scale + 2.0**-1000).all()


@pytest.mark.parametrize("eq,shapes", [("ij,jk->ik", [(4, 6), (6, 3)]), ("i,i->", [(9,), (9,)]), ("bij,bj->bi", [(3, 2, 5), (3, 5)])])
def test_exact_decode_is_correctly_rounded_for_one_sum_of_products(eq, shapes):
    r = np.random.default_rng(3)
    # wide exponent range inside every operand: exact only with wide encodings
    ops = [r.uniform(-1, 1, s) * 2.0 ** r.integers(-40, 40, s) for s in shapes]
    with pytest.raises(RNSRangeError, match="needs 1[0-9][0-9] bits"):  # 30 moduli cannot encode them exactly
        rt.einsum(eq, *ops, moduli=30, decode="exact")
    got = rt.einsum(eq, *ops, moduli=40, decode="exact")
    re, _, e = _exact(eq, ops)
    assert np.array_equal(np.asarray(got), _round(re, e))
    # complex: both parts correctly rounded
    opsc = [o + 1j * r.uniform(-1, 1, o.shape) * 2.0 ** r.integers(-30, 30, o.shape) for o in ops]
    gotc = np.asarray(rt.einsum(eq, *opsc, moduli=40, decode="exact"))
    re, im, e = _exact(eq, opsc)
    assert np.array_equal(gotc.real, _round(re, e)) and np.array_equal(gotc.imag, _round(im, e))


def test_interleaved_form_and_implicit_output():
    r = np.random.default_rng(0)
    a, b = r.uniform(-1, 1, (3, 4)), r.uniform(-1, 1, (4, 2))
    ref = np.einsum(a, [0, 1], b, [1, 2], [0, 2])
    got = rt.einsum(a, [0, 1], b, [1, 2], [0, 2])
    assert got.shape == ref.shape and np.allclose(got, ref, rtol=1e-15, atol=1e-15)
    got2 = rt.einsum(a, [0, 1], b, [1, 2])
    assert got2.shape == np.einsum(a, [0, 1], b, [1, 2]).shape


def test_out_argument_like_numpy():
    r = np.random.default_rng(9)
    a, b = r.uniform(-1, 1, (3, 4)), r.uniform(-1, 1, (4, 2))
    out = np.empty((3, 2))
    assert rt.einsum("ij,jk->ik", a, b, out=out) is out
    assert np.array_equal(out, rt.einsum("ij,jk->ik", a, b))
    with pytest.raises(ValueError, match="out must be"):
        rt.einsum("ij,jk->ik", a, b, out=np.empty((2, 3)))
    with pytest.raises(TypeError, match="Cannot cast the complex128 result"):  # numpy's error type, too
        rt.einsum("ij,jk->ik", a + 1j, b, out=np.empty((3, 2)))


def test_optimize_none_and_order_like_numpy():
    a, b, c = (np.arange(float(n * (n + 1))).reshape(n, n + 1) for n in (2, 3, 4))
    exact = np.array([[int(v) for v in row] for row in (a.astype(object) @ b[:, :3].astype(object))])
    got = rt.einsum("ij,jk", a, b[:, :3], optimize=None)  # numpy reads None as False
    assert np.array_equal(got, exact.astype(float))
    f = rt.einsum("ij,jk", a, b[:, :3], order="F")
    assert f.flags.f_contiguous and np.array_equal(f, got)
    assert rt.einsum("ij,jk", a, b[:, :3], order="C").flags.c_contiguous
    with pytest.raises(ValueError, match="order must be"):
        rt.einsum("ij,jk", a, b[:, :3], order="X")


def _ints(shape, seed: int, lo: int = -9, hi: int = 10) -> np.ndarray:
    """Small integers as float64: numpy's float64 einsum is exact on them, so exact results are expected."""
    return np.random.default_rng(seed).integers(lo, hi, shape).astype(np.float64)


@pytest.mark.parametrize("args,eq,shape", [
    (lambda a, b: (a, [Ellipsis, 0, 0], [Ellipsis, 0]), "xii->xi", (2, 3)),
    (lambda a, b: (a.transpose(1, 2, 0), [0, 0, Ellipsis], [Ellipsis, 0]), "iix->xi", (2, 3)),
    (lambda a, b: (a, [Ellipsis]), "ijk->ijk", (2, 3, 3)),
    (lambda a, b: (a, [0, 1, 2], b, [2, 51]), "ijk,kl->ijl", (2, 3, 4)),  # 51 is 'z': implicit output A, B, z
    (lambda a, b: (a, np.array([0, 1, 1]), [1]), "ijj->j", (3,)),  # numpy integer arrays as sublists (gh-15961)
    (lambda a, b: (b, [30, 4]), "ij->ji", (4, 3)),  # 30 is 'e', 4 is 'E': the implicit output sorts 'E' first
    (lambda a, b: (a, [0, 1, 2], b, [2, Ellipsis], [Ellipsis, 0]), "ijk,kl->li", (4, 2)),
    (lambda a, b: (" i j k , k l -> l i ", a, b), "ijk,kl->li", (4, 2)),  # spaces are ignored, as numpy's
    (lambda a, b: ("Bai,iA", a, b), "Bai,iA->ABa", (4, 2, 3)),  # implicit output: uppercase sorts before lowercase
])
def test_interleaved_form_with_ellipsis_and_integer_labels_like_numpy(args, eq, shape):
    """numpy's labels in the interleaved form (0..25 are A..Z, 26..51 a..z), ``Ellipsis``, implicit outputs."""
    a, b = _ints((2, 3, 3), 1), _ints((3, 4), 2)
    call = args(a, b)
    got = rt.einsum(*call)
    ops = [x for x in call if isinstance(x, np.ndarray) and x.dtype == np.float64]
    re, _, e = _exact(eq, ops)  # the same contraction written out by hand, Python ints
    assert got.shape == shape == np.einsum(*call).shape
    assert np.array_equal(got, _round(re, e))


@pytest.mark.parametrize("call,exc,match", [
    (lambda a: (a, [0, 52, 1]), ValueError, "outside 0..51"),
    (lambda a: (a, [-1, 0, 1]), ValueError, "outside 0..51"),
    (lambda a: (a, [0, "a", 1]), TypeError, "integer 0..51 or Ellipsis"),
    (lambda a: (a, 0), TypeError, "must be a list"),
    (lambda a: ("...i->i", a), ValueError, "has no '...'"),
    (lambda a: ("i..", a), ValueError, "invalid ellipsis"),
    (lambda a: (".i...", a), ValueError, "invalid ellipsis"),
    (lambda a: ("ij", a), ValueError, "name 2 indices but the operand has 3 dimensions"),
    (lambda a: (a, [0, 0]), ValueError, "name 2 indices but the operand has 3 dimensions"),
    (lambda a: ("ijk->->", a), ValueError, "'->' at most once"),
    (lambda a: ("ijk,", a), ValueError, "Number of einsum subscripts"),
    (lambda a: ("ijé", a), ValueError, "invalid subscript"),  # letters a-z, A-Z only, as numpy's
])
def test_bad_subscripts_follow_numpy(call, exc, match):
    with pytest.raises(exc, match=match):
        rt.einsum(*call(np.ones((2, 3, 3))))


@pytest.mark.parametrize("optimize", [
    False, True, "greedy", "optimal", ("greedy", 0), ("optimal", 10**6),
    ["einsum_path", (0, 1), (0, 1)], ["einsum_path", (1, 2), (0, 1)], [(0, 2), (0, 1)], ["einsum_path", (0, 1, 2)],
    opt_einsum.DynamicProgramming(),  # opt_einsum's own optimizers pass through
], ids=lambda v: type(v).__name__ if isinstance(v, opt_einsum.paths.PathOptimizer) else str(v))  # (stable ids)
def test_optimize_takes_numpy_values(optimize):
    """numpy's optimize values; ['einsum_path', ...] raised "TypeError: 'str' object cannot be interpreted as an integer"."""
    ops = [_ints((3, 4), 3), _ints((4, 5), 4), _ints((5, 2), 5)]
    re, _, e = _exact("ab,bc,cd->ad", ops)
    assert np.array_equal(rt.einsum("ab,bc,cd->ad", *ops, optimize=optimize), _round(re, e))


def test_optimize_path_with_an_internal_trace_and_invalid_paths():
    x, y = _ints((2, 3, 4), 6), _ints((2, 5, 5), 7)
    re, _, e = _exact("cab,cdd->ab", [x, y])
    assert np.array_equal(rt.einsum("cab,cdd->ab", x, y, optimize=["einsum_path", (1,), (0, 1)]), _round(re, e))
    ops = [np.ones((2, 2))] * 4
    for bad in (["einsum_path", (2, 3), (0, 1)], ["einsum_path", (0, 4), (0, 1), (0, 1)], [(0, 0), (0, 1)]):
        with pytest.raises(contract_mod.EinsumPathError, match="optimize path") as info:
            rt.einsum("ab,bc,cd,de->ae", *ops, optimize=bad)
        assert isinstance(info.value, RuntimeError) and isinstance(info.value, ValueError)  # numpy's, and ours
    with pytest.raises(TypeError, match="optimize=3.5 is not understood"):
        rt.einsum("ab,bc->ac", *ops[:2], optimize=3.5)


def test_integer_data_is_exact_as_in_numpy():
    """On operands float64 holds in few bits the default plan drops nothing: numpy's float64 result is exact there,
    so must ours be (a three-matrix product of aranges gave 7329.999999999999 for 7330)."""
    a, b, c = np.arange(12).reshape(3, 4), np.arange(20).reshape(4, 5), np.arange(30).reshape(5, 6)
    want = np.einsum("ij,jk,kl", a.astype(object), b.astype(object), c.astype(object)).astype(np.float64)
    for opt in (False, True):
        assert np.array_equal(rt.einsum("ij,jk,kl", a, b, c, optimize=opt), want)
        assert np.array_equal(rt.einsum(a * 1.0, [0, 1], b * 1.0, [1, 2], c * 1.0, [2, 3], optimize=opt), want)
    ones = [np.ones((5, 12, 4, 2, 3)), np.ones((5, 12, 11)), np.ones((5, 12, 11))]
    assert rt.einsum("ijklm,ijn,ijn->", *ones) == 5 * 12 * 24 * 11
    # short mantissas that are not integers (the scanned width): multiples of 1/8
    ops = [_ints((3, 4), 8) / 8, _ints((4, 5), 9) / 8, _ints((5, 4), 10) / 8, _ints((4, 2), 11) / 8]
    re, _, e = _exact("ab,bc,cd,de->ae", ops)
    assert np.array_equal(rt.einsum("ab,bc,cd,de->ae", *ops), _round(re, e))


def test_dtype_argument_like_numpy():
    a, b = _ints((3, 4), 12), _ints((4, 2), 13)
    re, _, e = _exact("ij,jk", [a, b])
    got = rt.einsum("ij,jk", a, b, dtype=np.complex128)
    assert got.dtype == np.complex128 and np.array_equal(got.real, _round(re, e)) and not got.imag.any()
    assert np.array_equal(rt.einsum("ij,jk", a, b, dtype="f8"), _round(re, e))
    assert np.iscomplexobj(rt.einsum("i,i", np.ones(3), np.ones(3), dtype="c16"))  # a 0-d result too
    with pytest.raises(TypeError, match=r"operand 1 \(complex128\) cannot be cast to dtype=float64 under casting='safe'"):
        rt.einsum("ij,jk", a, b + 1j, dtype=np.float64)
    # numpy's casting='unsafe': the real parts; and the result into a narrower out, as numpy's assignment
    assert np.array_equal(rt.einsum("ij,jk", a, b + 1j, dtype=np.float64, casting="unsafe"), _round(re, e))
    with pytest.raises(TypeError, match="cannot be cast to dtype=float64 under casting='no'"):
        rt.einsum("ij,jk", a.astype(np.int64), b, dtype=np.float64, casting="no")
    c = np.zeros((3, 2), np.int64)
    assert rt.einsum("ij,jk", a / 2, b, out=c, casting="unsafe") is c
    assert c.tolist() == [[int(Fraction(int(v)) * Fraction(2) ** e / 2) for v in row] for row in re]  # truncated
    with pytest.raises(TypeError, match="Cannot cast .* under casting='same_kind'"):
        rt.einsum("ij,jk", a + 1j, b, out=np.zeros((3, 2)), casting="same_kind")
    with pytest.raises(ValueError, match="casting must be one of"):
        rt.einsum("ij,jk", a, b, casting="blah")
    with pytest.raises(TypeError, match="dtype=float32 is not supported"):
        rt.einsum("ij,jk", a, b, dtype=np.float32)
    with pytest.raises(TypeError, match="not a data type"):
        rt.einsum("ij,jk", a, b, dtype="bad_data_type")


def test_out_may_be_an_operand_and_must_be_an_array():
    a = _ints((3, 3), 14)
    b = _ints((3, 3), 15)
    re, _, e = _exact("ij,jk->ik", [a, b])
    assert rt.einsum("ij,jk->ik", a, b, out=b) is b  # the whole result exists before out is written
    assert np.array_equal(b, _round(re, e))
    out = np.array(0.0)
    assert rt.einsum("i,i->", np.ones(7), np.ones(7), out=out, optimize="optimal") is out and out == 7.0
    view = np.ones(10)[::2]  # a strided out
    rt.einsum("mi,mi,mi->m", *[np.ones((5, 5))] * 3, out=view)
    assert np.array_equal(view.base, np.where(np.arange(10) % 2 == 0, 5.0, 1.0))
    with pytest.raises(TypeError, match="out must be an array"):
        rt.einsum("i->", np.ones(3), out="test")


def test_empty_contraction_to_a_scalar_is_a_numpy_scalar():
    got = rt.einsum("i,i", np.ones(0), np.ones(0))
    assert type(got) is np.float64 and got == 0.0


def test_scalar_result_is_a_numpy_scalar_like_numpy():
    x = np.arange(1.0, 4.0)
    got = rt.einsum("i,i", x, x)
    assert np.ndim(got) == 0 and got == 14.0


def test_empty_operands_give_zeros():
    a, b = np.ones((3, 0)), np.ones((0, 2))
    got = rt.einsum("ij,jk->ik", a, b)
    assert got.shape == (3, 2) and not got.any()
    assert rt.einsum("ij,jk->ik", np.ones((0, 4)), np.ones((4, 2))).shape == (0, 2)


def test_constants_are_encoded_once(monkeypatch):
    calls = []
    real = contract_mod._encode_leaf

    def counting(x, *rest):  # (basis, bits, shared, and the call's backend and array module)
        calls.append(x.shape)
        return real(x, *rest)

    monkeypatch.setattr(contract_mod, "_encode_leaf", counting)
    r = np.random.default_rng(1)
    A = r.uniform(-1, 1, (4, 3))
    X1, X2 = r.uniform(-1, 1, (6, 3, 3, 3)), r.uniform(-1, 1, (6, 3, 3, 3))
    # (an explicit basis: this plan runs, step by step; the default's rung below)
    expr = _unfused(rt.contract_expression("eijk,ai,bj,ck->eabc", (6, 3, 3, 3), A, A, A, constants=[1, 2, 3],
                                           moduli=15))
    y1 = expr(X1)
    assert len(calls) == 4  # three constants, one input
    y2 = expr(X2)
    assert len(calls) == 5  # only the new input
    ref = np.einsum("eijk,ai,bj,ck->eabc", X2, A, A, A)
    assert np.abs(y2 - ref).max() < 1e-14
    assert np.abs(y1 - np.einsum("eijk,ai,bj,ck->eabc", X1, A, A, A)).max() < 1e-14
    calls.clear()  # fused on the CPU: the kernel encodes the input in cache, the constants are encoded once
    fused = rt.contract_expression("eijk,ai,bj,ck->eabc", (6, 3, 3, 3), A, A, A, constants=[1, 2, 3], moduli=15)
    assert np.array_equal(fused(X1), y1) and np.array_equal(fused(X2), y2)
    assert calls == [(4, 3)] * 3
    calls.clear()  # the default: its certified rung encodes the constants once too, fused
    default = rt.contract_expression("eijk,ai,bj,ck->eabc", (6, 3, 3, 3), A, A, A, constants=[1, 2, 3])
    default(X1), default(X2)
    assert calls == [(4, 3)] * 3 and default.last_evaluation == "17 moduli, 61 bits"


def test_contract_expression_matches_mode_chain_and_is_reusable():
    r = np.random.default_rng(2)
    ops = [r.uniform(-1, 1, (8, 8)) for _ in range(3)]
    X = r.uniform(-1, 1, (16, 8, 8, 8))
    expr = rt.contract_expression("eijk,ai,bj,ck->eabc", X.shape, *ops, constants=[1, 2, 3])
    ref = np.einsum("eijk,ai,bj,ck->eabc", X, *ops)
    got = expr(X)
    assert np.abs(got - ref).max() <= np.abs(rt.mode_chain(X, ops, [1, 2, 3]) - ref).max() * 8 + 1e-15
    text = expr.explain()
    assert "mode product" in text and "opt_einsum path" in text and "constant 1 encoded once" in text


def _unfused(expr):
    """The same expression with the fused CPU interpreter switched off (its step-by-step run)."""
    expr._fused = lambda *a, **k: None
    return expr


@pytest.mark.parametrize("eq,batch", [("eijk,ai,bj,ck->eabc", (300,)), ("ijk,ai,bj,ck->abc", ()),
                                      ("eijk,ai,bj,ck->ecba", (70,)), ("eij,ai,bj->eab", (900,)),
                                      ("eijkl,ai,bj,ck,dl->eabcd", (5,))])
@pytest.mark.parametrize("moduli,decode", [(None, "fp64"), (15, "fp64"), (40, "exact")])
def test_mode_product_chains_run_fused_on_the_cpu(monkeypatch, eq, batch, moduli, decode):
    from rnstensor.backends import cpu_fused

    r = np.random.default_rng(len(eq) + len(batch))
    terms = eq.split("->")[0].split(",")
    n = len(terms[0]) - len(batch)
    shape = batch + (6,) * n
    ops = [r.uniform(-1, 1, (6, 6)) for _ in terms[1:]]
    calls = []
    real = cpu_fused.run_chain
    monkeypatch.setattr(cpu_fused, "run_chain", lambda *a, **k: calls.append(1) or real(*a, **k))
    for kind in ("uniform", "per-tensor", "integers"):
        X = r.uniform(-1, 1, shape)
        if kind == "per-tensor" and batch:
            X *= np.ldexp(1.0, r.integers(-900, 900, batch + (1,) * n).astype(np.int32))
        elif kind == "integers":
            X = r.integers(-1000, 1000, shape)
        make = lambda: rt.contract_expression(eq, shape, *ops, constants=list(range(1, len(terms))),  # noqa: E731
                                              moduli=moduli, decode=decode)
        calls.clear()
        got = make()(X)
        assert calls, "the CPU backend runs the chain fused"
        want = _unfused(make())(X)
        assert got.shape == want.shape == np.einsum(eq, X, *ops).shape
        assert np.array_equal(got.view(np.int64), want.view(np.int64)), kind


def test_einsum_that_is_not_a_chain_runs_step_by_step(monkeypatch):
    from rnstensor.backends import cpu_fused

    r = np.random.default_rng(3)
    calls = []
    monkeypatch.setattr(cpu_fused, "run_chain", lambda *a, **k: calls.append(1))
    a, b = r.uniform(-1, 1, (5, 6)), r.uniform(-1, 1, (6, 7))
    X = r.uniform(-1, 1, (9, 6, 6))
    X[2, 1, 1] = np.inf
    rt.einsum("ij,jk->ik", a, b)  # two tensors
    rt.einsum("eij,jk->eik", X[:, :, :6] * 0 + 1, r.uniform(-1, 1, (6, 7)))  # one exponent per (e, i) slice
    A, B = r.uniform(-1, 1, (4, 6)), r.uniform(-1, 1, (5, 6))
    y = rt.contract_expression("eij,ai,bj->eab", X.shape, A, B, constants=[1, 2])(X)  # an inf: numpy's values there
    ref = np.einsum("eij,ai,bj->eab", X, A, B)
    assert not calls and not np.isfinite(y[2]).all() and np.array_equal(np.isfinite(y), np.isfinite(ref))
    rt.einsum("eij,ai->eaj", X[:3] + 0j, r.uniform(-1, 1, (4, 6)))  # complex
    assert not calls


@pytest.mark.parametrize("eq,shapes,moduli", [
    ("mi,mi,mi->m", [(5, 5)] * 3, 15),
    ("ij,jk,kl->il", [(3, 5), (5, 4), (4, 2)], 30),
    ("ij,jk,kl,lm->im", [(2, 3), (3, 4), (4, 3), (3, 2)], 40),
    ("i,i,i->", [(7,)] * 3, 30),
])
def test_exact_decode_is_the_correctly_rounded_true_result(eq, shapes, moduli):
    """decode='exact' plans no drops (a drop rounds) and the result is the true result rounded once."""
    r = np.random.default_rng(len(eq))
    ops = [np.ones(s) if moduli == 15 else r.uniform(-1, 1, s) for s in shapes]
    expr = rt.contract_expression(eq, *shapes, moduli=moduli, decode="exact")
    got = expr(*ops)
    assert not any(isinstance(st, ir.Drop) for st in expr._plan(("input",) * len(ops), (False,) * len(ops), {}).steps)
    re, _, e = _exact(eq, ops)
    assert np.array_equal(np.asarray(got), _round(re, e))
    # the former plan on 15 moduli dropped and gave 5.000000000000001 for the first case
    assert np.array_equal(rt.einsum("mi,mi,mi->m", *[np.ones((5, 5))] * 3, decode="exact"), np.full(5, 5.0))


def test_exact_decode_says_what_it_lacks():
    r = np.random.default_rng(8)
    a, b, c = r.standard_normal((3, 5)), r.standard_normal((5, 4)), r.standard_normal((4, 2))
    # three full 53-bit operands on 15 moduli: no drop-free plan encodes them exactly
    with pytest.raises(RNSRangeError, match=r"decode='exact'.*operand \d needs 5[0-9] bits.*encodes it at"):
        rt.einsum("ij,jk,kl->il", a, b, c, decode="exact")
    with pytest.raises(PlanError, match="method='composed'"):
        rt.einsum("ij,jk,kl->il", a, b, c, decode="exact", method="composed", moduli=30)
    with pytest.raises(PlanError, match="drops no moduli"):
        rt.einsum("ij,jk,kl->il", a, b, c, decode="exact", moduli=1, min_bits=0)
    # with enough moduli the same operands are correctly rounded
    re, _, e = _exact("ij,jk,kl->il", [a, b, c])
    assert np.array_equal(rt.einsum("ij,jk,kl->il", a, b, c, decode="exact", moduli=30), _round(re, e))


def test_composed_method_and_backends_agree_bitwise():
    r = np.random.default_rng(4)
    a, b, c = r.uniform(-1, 1, (3, 5)), r.uniform(-1, 1, (5, 4)), r.uniform(-1, 1, (4, 2))
    x = rt.einsum("ij,jk,kl->il", a, b, c, decode="exact", moduli=30)
    y = rt.einsum("ij,jk,kl->il", a, b, c, decode="exact", moduli=30, backend="numpy")
    assert np.array_equal(x, y)
    z = rt.einsum("ij,jk,kl->il", a, b, c, method="composed")
    bound = rt.contract_expression("ij,jk,kl->il", a.shape, b.shape, c.shape, method="composed").error_bound(a, b, c)
    re, _, e = _exact("ij,jk,kl->il", [a, b, c])
    assert (_abs_err(z, re, e) <= bound).all()


def test_small_basis_forces_drops_and_stays_within_the_bound():
    r = np.random.default_rng(5)
    ops = [r.uniform(-1, 1, (4, 4)) for _ in range(4)]
    expr = rt.contract_expression("ab,bc,cd,de->ae", *[o.shape for o in ops], moduli=10, min_bits=20)
    assert "drop" in expr.explain() or "at 3" in expr.explain()
    got = expr(*ops)
    re, _, e = _exact("ab,bc,cd,de->ae", ops)
    assert (_abs_err(got, re, e) <= expr.error_bound(*ops)).all()


def test_rnstensor_operands_stay_in_residues_through_opt_einsum():
    r = np.random.default_rng(6)
    X, A = r.uniform(-1, 1, (5, 3, 3, 3)), r.uniform(-1, 1, (4, 3))
    B = rt.Basis.int8(15)
    Xt, At = rt.encode(X, B), rt.encode(A, B, shared_axes=(1,))
    Z = opt_einsum.contract("eijk,ai,bj,ck->eabc", Xt, At, At, At, backend="rnstensor")
    assert isinstance(Z, rt.RNSTensor)
    ref = np.einsum("eijk,ai,bj,ck->eabc", X, A, A, A)
    assert np.abs(rt.decode(Z) - ref).max() < 1e-14
    W = rt.einsum("eijk,ai->eajk", Xt, At)
    assert isinstance(W, rt.RNSTensor) and W.shape == (5, 4, 3, 3)


def test_rnstensor_operand_with_varying_exponents_along_a_summed_axis_is_aligned():
    r = np.random.default_rng(7)
    A = r.uniform(-1, 1, (3, 4)) * np.array([1.0, 4.0, 0.25, 2.0])
    At = rt.encode(A, 15, bits=30, shared_axes=(0,))  # one exponent per column: varies along j
    v = r.uniform(-1, 1, 4)
    got = rt.einsum("ij,j->i", At, rt.encode(v, 15, bits=30), decode="fp64")
    ref = rt.decode(At, "exact") @ rt.decode(rt.encode(v, 15, bits=30), "exact")
    assert np.abs(got - ref).max() < 1e-15


def test_rnstensor_operand_with_repeated_indices():
    r = np.random.default_rng(13)
    X = r.uniform(-1, 1, (4, 4, 3))
    T = rt.encode(X, 15, shared_axes=(0, 1))
    assert np.array_equal(rt.decode(rt.einsum("iij->ij", T), "exact"), np.einsum("iij->ij", rt.decode(T, "exact")))
    expr = rt.contract_expression("iij,j->i", T.shape, (3,), decode="exact")
    assert np.array_equal(expr(T, np.ones(3)), rt.einsum("iij,j->i", T, np.ones(3), decode="exact"))
    got = rt.einsum("iij,j->i", T, np.ones(3), decode="exact")
    re, _, e = _exact("iij,j->i", [rt.decode(T, "exact"), np.ones(3)])
    assert np.array_equal(got, _round(re, e))


@pytest.mark.parametrize("expr, shapes", [
    ("ij,ij->ij", [(1, 3), (2, 3)]),
    ("ij,ij->ij", [(2, 1), (1, 3)]),
    ("ij,jk->ik", [(2, 1), (3, 2)]),
    ("ij,j->i", [(4, 1), (5,)]),
])
def test_rnstensor_operands_broadcast_size_one_axes(expr, shapes):
    """numpy's size-1 broadcasting holds for RNSTensor operands as for arrays (it crashed in the executor)."""
    r = np.random.default_rng(14)
    xs = [r.uniform(-1, 1, s) for s in shapes]
    Ts = [rt.encode(x, 15, bits=53) for x in xs]
    got = rt.einsum(expr, *Ts, decode="exact")
    re, _, e = _exact(expr, [rt.decode(T, "exact") for T in Ts])
    assert np.array_equal(got, _round(re, e))
    assert got.shape == np.einsum(expr, *xs).shape
    mixed = rt.einsum(expr, Ts[0], xs[1], decode="exact")  # one encoded operand, one float array
    assert np.array_equal(mixed, got)


def test_rnstensor_operand_that_cannot_be_aligned_is_a_range_error():
    A = np.array([[1.0, 2.0**-100], [1.0, 1.0]])
    At = rt.encode(A, 15, bits=53, shared_axes=())  # every entry its own exponent: 100 bits apart along j
    with pytest.raises(rt.RNSRangeError, match="aligning"):
        rt.einsum("ij,j->i", At, rt.encode(np.ones(2), 15))


def test_tensordot_and_transpose():
    r = np.random.default_rng(8)
    a, b = r.uniform(-1, 1, (3, 4, 5)), r.uniform(-1, 1, (5, 4, 2))
    got = rt.tensordot(a, b, axes=([1, 2], [1, 0]))
    assert np.abs(got - np.tensordot(a, b, axes=([1, 2], [1, 0]))).max() < 1e-14
    T = rt.encode(a, 15, shared_axes=(1, 2))
    U = rt.transpose(T, (2, 0, 1))
    assert np.array_equal(rt.decode(U, "exact"), np.transpose(rt.decode(T, "exact"), (2, 0, 1)))


def test_tensordot_takes_the_accuracy_policy():
    # moduli='auto' and rtol= as einsum takes them: correctly rounded against Fractions on a 300-binade spread
    r = np.random.default_rng(9)
    a = r.standard_normal((3, 4, 5)) * np.exp2(r.integers(-150, 150, (3, 4, 5)))
    b = r.standard_normal((5, 4, 2)) * np.exp2(r.integers(-150, 150, (5, 4, 2)))
    F = np.vectorize(Fraction, otypes=[object])
    exact = np.tensordot(F(a), F(b), axes=([1, 2], [1, 0]))
    want = np.vectorize(float, otypes=[float])(exact)
    assert np.array_equal(rt.tensordot(a, b, axes=([1, 2], [1, 0]), moduli="auto"), want)
    y = rt.tensordot(a, b, axes=([1, 2], [1, 0]), rtol=1e-10)
    mag = np.tensordot(np.abs(a), np.abs(b), axes=([1, 2], [1, 0]))
    assert all(abs(Fraction(float(g)) - v) <= Fraction(1e-10) * Fraction(float(m))
               for g, v, m in zip(y.ravel(), exact.ravel(), mag.ravel()))
    for axes, match in ((4, "between 0"), (([0, 0], [1, 2]), "distinct"), (([5], [0]), "within")):
        with pytest.raises(ValueError, match=match):
            rt.tensordot(a, b, axes=axes)


@pytest.mark.parametrize(
    "args,kwargs,exc,match",
    [
        (("ij,jk->ik", np.ones((2, 3))), {}, ValueError, "Number of einsum subscripts"),
        (("ij,jk->ik", np.ones((2, 3)), np.ones((4, 2))), {}, ValueError, "index 'j' has size"),
        (("ij,jk->ik", np.ones((2, 3, 1)), np.ones((3, 2))), {}, ValueError, "dimensions"),
        (("i1,jk->ik", np.ones((2, 3)), np.ones((3, 2))), {}, ValueError, "invalid subscript"),
        (("ij,jk->ix", np.ones((2, 3)), np.ones((3, 2))), {}, ValueError, "'x'"),
        (("ij,jk->ik", np.ones((2, 3), np.longdouble), np.ones((3, 2))), {}, TypeError, "float64 or complex128"),
        (("ij,jk->ik", np.array([[2**53 + 1, 0, 0]] * 2), np.ones((3, 2))), {}, ValueError, r"only up to 2\^53"),
        (("ij->ij", np.array([[1.0, np.nan]])), {"nonfinite": "raise"}, ValueError, "inf or NaN"),
        (("ij->ij", np.ones((2, 2))), {"nonfinite": "ignore"}, ValueError, "nonfinite must be one of"),
        (("ij->ij", np.ones((2, 2))), {"method": "rescale"}, ValueError, "method must be one of"),
        (("ij->ij", np.ones((2, 2))), {"decode": "fast"}, ValueError, "decode must be one of"),
        (("ij->ij", np.ones((2, 2))), {"moduli": 60}, ValueError, r"moduli must be a number of INT8 moduli, an integer in 1\.\.49"),
        (("ij->ij", np.ones((2, 2))), {"bits": 0}, ValueError, "bits must be"),
        (("ii->i", np.ones((2, 3))), {}, ValueError, "repeated index"),
    ],
)
def test_bad_input_is_rejected_with_a_clear_message(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        rt.einsum(*args, **kwargs)


def test_inputs_float64_holds_exactly_are_accepted():
    # bool, integers up to 2^53, float16/32 and complex64 convert exactly; the result is float64 / complex128
    a = np.array([[3, -2**53], [1, 0]], dtype=np.int64)
    b = np.array([[True, False], [True, True]])
    want = a.astype(np.float64) @ b.astype(np.float64)  # exact: every product and sum is representable
    got = rt.einsum("ij,jk->ik", a, b)
    assert got.dtype == np.float64 and np.array_equal(got, want)
    h = np.array([0.1, 3.0], dtype=np.float32)
    assert rt.einsum("i,i->i", h, np.array([1, 2], np.uint8)).tolist() == [float(h[0]), 6.0]
    z = np.array([1 + 2j], dtype=np.complex64)
    assert rt.einsum("i->", z) == complex(z[0])
    expr = rt.contract_expression("ij,j->i", (2, 2), np.array([1, 2], np.int16), constants=[1])
    assert expr(np.eye(2)).tolist() == [1.0, 2.0]


def test_contract_expression_bad_calls():
    expr = rt.contract_expression("ij,jk->ik", (2, 3), (3, 4))
    with pytest.raises(ValueError, match="takes 2 operand"):
        expr(np.ones((2, 3)))
    with pytest.raises(ValueError, match="was built for"):
        expr(np.ones((2, 3)), np.ones((3, 5)))
    with pytest.raises(ValueError, match="constants"):
        rt.contract_expression("ij,jk->ik", (2, 3), (3, 4), constants=[5])
    with pytest.raises(TypeError, match="must be a shape"):
        rt.contract_expression("ij,jk->ik", (2, 3), 7)


def test_an_explicit_narrow_width_is_honoured():
    r = np.random.default_rng(12)
    a, b = r.uniform(-1, 1, (3, 4)), r.uniform(-1, 1, (4, 5))
    got = rt.einsum("ij,jk", a, b, bits=20)
    re, _, e = _exact("ij,jk", [a, b])
    bound = rt.contract_expression("ij,jk", a.shape, b.shape, bits=20).error_bound(a, b)
    assert (_abs_err(got, re, e) <= bound).all() and (bound > 2.0**-30).any()


def test_too_small_basis_is_a_plan_error_not_a_wrong_answer():
    with pytest.raises(rt.PlanError, match="more moduli"):
        rt.einsum("ij,jk->ik", np.ones((2, 4096)), np.ones((4096, 2)), moduli=2)


def _random_expression(r: np.random.Generator):
    """2-6 operands over up to 6 indices of size 1..12, with repeats inside operands and broadcasting 1s."""
    while True:
        nlab = int(r.integers(1, 7))
        labels = "abcdefghij"[:nlab]
        sizes = {c: int(r.integers(1, 13)) for c in labels}
        if math.prod(sizes.values()) > 3000:
            continue
        nops = int(r.integers(2, 7))
        terms = []
        for _ in range(nops):
            k = int(r.integers(0, min(nlab, 4) + 1))
            term = "".join(r.choice(list(labels), size=k, replace=True)) if k else ""
            terms.append(term)
        used = sorted(set("".join(terms)))
        out = "".join(c for c in used if r.random() < 0.5)
        shapes = []
        for t in terms:
            shapes.append(tuple(1 if (sizes[c] > 1 and r.random() < 0.1 and t.count(c) == 1) else sizes[c] for c in t))
        return ",".join(terms) + "->" + out, shapes


@pytest.mark.parametrize("seed", range(40))
def test_random_expressions_within_the_error_bound(seed):
    r = np.random.default_rng(1000 + seed)
    eq, shapes = _random_expression(r)
    cplx = [False, True, "mixed"][seed % 3]
    ops = _operands(shapes, cplx, seed)
    cplx = any(np.iscomplexobj(o) for o in ops)
    ref = np.einsum(eq, *ops)
    got = np.asarray(rt.einsum(eq, *ops))
    assert got.shape == np.shape(ref) and got.dtype == np.asarray(ref).dtype
    re, im, e = _exact(eq, ops)
    bound = rt.contract_expression(eq, *shapes).error_bound(*ops)
    err = _abs_err(got.real, re, e) + (_abs_err(got.imag, im, e) if cplx else 0)
    assert (err <= bound).all(), (eq, shapes)


# ----- error_bound on every finite input ---------------------------------------------------------------------


_BOUND_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 2)]),
    ("ij,jk,kl->il", [(2, 3), (3, 3), (3, 2)]),
    ("i,i->", [(5,)] * 2),
    ("ij,j->i", [(3, 4), (4,)]),
    ("ijk,jk->i", [(2, 3, 3), (3, 3)]),
    ("i,j->ij", [(3,), (2,)]),
    ("ij,ij->i", [(2, 3)] * 2),
]


def _wide(rng, shape, kind):
    """Entries across the float64 range: mixed, huge (2^300..2^380), subnormal, moderate, or a +-1 mantissa."""
    lo, hi = {0: (-1074, 1000), 1: (300, 380), 2: (-1074, -1000), 3: (-60, 60), 4: (0, 1)}[kind]
    return np.ldexp(rng.uniform(-1, 1, shape), rng.integers(lo, hi, shape).astype(np.int32))


def _assert_bound_holds(expr, ops, moduli, method="rescale_be"):
    e = rt.contract_expression(expr, *[o.shape for o in ops], moduli=moduli, method=method, min_bits=0)
    with np.errstate(over="ignore", invalid="ignore"):
        y, bound = e(*ops), e.error_bound(*ops)
    assert not np.isnan(bound).any(), (expr, moduli)
    re, _, ex = _exact(expr, ops)
    finite = np.isfinite(y) & np.isfinite(bound)
    assert (bound[~np.isfinite(y)] == np.inf).all()  # an overflowing result is reported as such
    err = _abs_err(np.where(finite, y, 0.0), np.where(finite, re, 0), ex)
    assert (err[finite] <= bound[finite]).all(), (expr, moduli, err, bound)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), case=st.integers(0, len(_BOUND_CASES) - 1),
       kinds=st.lists(st.integers(0, 4), min_size=3, max_size=3), moduli=st.integers(2, 30))
def test_error_bound_holds_across_the_float64_range(seed, case, kinds, moduli):
    """Huge, tiny and subnormal entries, mixed magnitudes, 2-30 moduli: every entry within its bound, no NaN."""
    rng = np.random.default_rng(seed)
    expr, shapes = _BOUND_CASES[case]
    _assert_bound_holds(expr, [_wide(rng, s, k) for s, k in zip(shapes, kinds)], moduli)


def test_error_bound_known_counterexamples():
    """Inputs on which the bound was NaN or too small (a fuzzer's finds): units underflowed or overflowed."""
    nan_case = [  # two operands near 2^360 and a subnormal one: inf * 0 in the bound
        np.array([[-3.878080862201386e-172, 2.63228626e-316, 4.2392133075430514e+105],
                  [6.672434528153415e-109, -1.943187616154419e+280, 1.7319380992335155e+236]]),
        np.array([[3.165016528452747e+96, -6.765018604845954e+107, 1.7241434124950475e+100],
                  [-2.774010052174755e+92, 9.244334289007565e+108, -6.966963339951502e+105],
                  [6.517480528150408e+90, 3.3531120327274305e+112, -4.0230544852528435e+107]]),
        np.array([[3.66e-322, 2.5992452554837435e-305], [-6e-323, -9.051111478648563e-306],
                  [-2.9488914665973e-311, 4.3423562812483e-311]]),
    ]
    _assert_bound_holds("ij,jk,kl->il", nan_case, 14)
    # subnormal operands: half a unit below 2^-1074 flushed to zero in the bound
    _assert_bound_holds("i,j->ij", [np.array([-6.07464e-319, 2.2659903505e-313, 6.864755097e-315]),
                                    np.array([3959468.6242709905, -1882346.0800806424])], 22)
    a = np.array([[-14301751.718114689, 0.0022027331510654103, 2.943056259878994e-09, -2.227136643341353e-16],
                  [-8.199773298705714e-12, 22372922154773.68, -2.7099733319412103, 2.8230064158535972e-18],
                  [10107261733527.96, -25715683.044300064, -1034032464935079.8, 2.3548478663672743]])
    b = np.array([[4.56313075378e-313, 1.5e-323], [1.53e-322, 2.3804e-319], [1e-323, 2.87321162e-315],
                  [1.5e-323, -5e-324]])
    _assert_bound_holds("ij,jk->ik", [a, b], 29)


# ----- inf and NaN operands follow numpy ----------------------------------------------------------------------


@pytest.mark.parametrize("expr, shapes", [("ij,jk->ik", [(4, 5), (5, 3)]), ("ij,ij->i", [(3, 4)] * 2),
                                          ("i,j->ij", [(4,), (3,)]), ("ijk,kl->ijl", [(2, 3, 4), (4, 2)])])
def test_nonfinite_operands_follow_numpy(expr, shapes):
    """Outputs that meet an inf or NaN are numpy's; the others are the exact computation of the finite entries."""
    rng = np.random.default_rng(21)
    ops = [rng.uniform(-1, 1, s) for s in shapes]
    for x, val in zip(ops, (np.inf, np.nan)):
        x.reshape(-1)[rng.integers(0, x.size)] = val
    ops[0].reshape(-1)[-1] = -np.inf
    with np.errstate(invalid="ignore"):
        want = np.einsum(expr, *ops)
    got = rt.einsum(expr, *ops, decode="exact")
    bad = ~np.isfinite(want)
    assert bad.any() and (~bad).any()
    np.testing.assert_array_equal(got[bad], want[bad])  # NaN where numpy has NaN, the same infinities
    finite = [np.where(np.isfinite(x), x, 0.0) for x in ops]
    re, _, e = _exact(expr, finite)
    assert np.array_equal(got[~bad], _round(re, e)[~bad])  # correctly rounded, as for finite operands
    expr_ = rt.contract_expression(expr, *shapes)
    bound = expr_.error_bound(*ops)
    assert (bound[bad] == np.inf).all() and np.isfinite(bound[~bad]).all() and not np.isnan(bound).any()
    with pytest.raises(ValueError, match="nonfinite='raise'"):
        rt.einsum(expr, *ops, nonfinite="raise")
    with pytest.raises(ValueError, match="constant"):
        rt.contract_expression(expr, shapes[0], ops[1], constants=[1])


def test_ellipsis_that_does_not_broadcast_is_named_as_such():
    with pytest.raises(ValueError, match=r"'\.\.\.' stands for do not broadcast: operand 0 \(2,\), operand 1 \(4,\)"):
        rt.einsum("...i,...i", np.ones((2, 3)), np.ones((4, 3)))
    a, b = np.arange(6.0).reshape(2, 1, 3), np.arange(12.0).reshape(4, 3)
    assert np.array_equal(rt.einsum("...i,...i", a, b), np.einsum("...i,...i", a, b))  # integers: exact in both


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_fused_einsum_matches_the_steps_on_any_mode_chain(data):
    # random chains of mode products (operands or constants, any output order, a batch label or none): where the
    # fused interpreter takes them, bit for bit the step-by-step run
    ndim = data.draw(st.integers(1, 3), label="ndim")
    batch = data.draw(st.booleans(), label="batch")
    sizes = data.draw(st.lists(st.integers(1, 7), min_size=ndim, max_size=ndim), label="sizes")
    outs = data.draw(st.lists(st.integers(1, 7), min_size=ndim, max_size=ndim), label="outs")
    order = data.draw(st.permutations(range(ndim)), label="order")
    letters = "ijk"[:ndim]
    new = "abc"[:ndim]
    x_term = ("e" if batch else "") + letters
    terms = [x_term] + [new[a] + letters[a] for a in order]
    out = list(("e" if batch else "") + new)
    perm = data.draw(st.permutations(out), label="output")
    eq = ",".join(terms) + "->" + "".join(perm)
    r = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    X = r.uniform(-1, 1, ((5,) if batch else ()) + tuple(sizes))
    if data.draw(st.booleans(), label="wide"):
        X = np.ldexp(X, r.integers(-20, 20, X.shape).astype(np.int32))
    ops = [r.uniform(-1, 1, (outs[a], sizes[a])) for a in order]
    moduli = data.draw(st.sampled_from([None, 15, 22]), label="moduli")
    as_constants = data.draw(st.booleans(), label="constants")

    def make():
        if as_constants:
            return rt.contract_expression(eq, X.shape, *ops, constants=list(range(1, ndim + 1)), moduli=moduli)
        shapes = [X.shape] + [o.shape for o in ops]
        expr = rt.contract_expression(eq, *shapes, moduli=moduli)
        return lambda x: expr(x, *ops)

    got = make()(X)
    old = rt.contract.ContractExpression._fused
    try:
        rt.contract.ContractExpression._fused = lambda *a, **k: None
        want = make()(X)
    finally:
        rt.contract.ContractExpression._fused = old
    assert np.array_equal(np.asarray(got).view(np.int64), np.asarray(want).view(np.int64)), eq


def test_order_takes_numpys_spellings_in_any_case():
    a = np.asfortranarray(np.random.default_rng(5).standard_normal((2, 3, 5)))
    b = np.asfortranarray(np.random.default_rng(6).standard_normal((4, 3)))
    want = rt.einsum("...ft,mf->...mt", a, b, order="C")  # the layout changes no value
    for order, check in (("a", "f_contiguous"), ("F", "f_contiguous"), ("c", "c_contiguous")):
        got = rt.einsum("...ft,mf->...mt", a, b, order=order)
        assert getattr(got.flags, check) and np.array_equal(got, want)
    k = rt.einsum("...ft,mf->...mt", a, b, order="k")
    assert k.strides == np.einsum("...ft,mf->...mt", a, b, order="K").strides
    with pytest.raises(ValueError, match="any case"):
        rt.einsum("ij->ji", a[0], order="X")
