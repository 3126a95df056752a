"""rnstensor.run.exact_path: exact integer GEMMs of limbs and exact einsums pairwise, against Python ints and Fractions."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from rnstensor.backends import get_backend
from rnstensor.run import exact_path


def _ints(rng: random.Random, shape, bits: int, zero_rows: bool = False) -> np.ndarray:
    """Python ints of up to ``bits`` bits, signs and sizes mixed, some zeros (and an all-zero first row)."""
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        b = rng.randrange(0, bits + 1)
        v = rng.getrandbits(b) << rng.randrange(0, 40) if rng.random() > 0.15 else 0
        out[idx] = -v if rng.random() < 0.5 else v
    if zero_rows:
        out[:, 0, :] = 0
    return out


def _matmul(a, b):
    B, M, K = a.shape
    N = b.shape[2]
    out = np.empty((B, M, N), dtype=object)
    for t in range(B):
        for i in range(M):
            for j in range(N):
                out[t, i, j] = sum(int(a[t, i, k]) * int(b[t, k, j]) for k in range(K))
    return out


@pytest.mark.parametrize("shape, bits", [((2, 3, 40, 4), 300), ((1, 5, 70, 3), 60), ((3, 2, 2, 2), 500),
                                         ((1, 4, 1, 5), 130), ((2, 3, 9, 2), 1)])
@pytest.mark.parametrize("route", ["residues", "objects"])
def test_exact_int_matmul_is_exact(shape, bits, route, monkeypatch):
    monkeypatch.setattr(exact_path, "RESIDUE_GEMM_TERMS", 0 if route == "residues" else 1 << 40)
    B, M, K, N = shape
    rng = random.Random(sum(shape) + bits)
    a, b = _ints(rng, (B, M, K), bits, zero_rows=True), _ints(rng, (B, K, N), bits)
    z, e = exact_path.exact_int_matmul(a, b, get_backend("cpu"))
    want = _matmul(a, b)
    got = np.vectorize(lambda v: Fraction(int(v)) * Fraction(2) ** e, otypes=[object])(z)
    assert got.shape == want.shape and all(g == w for g, w in zip(got.ravel(), want.ravel()))


def test_exact_int_matmul_takes_the_residue_gemm_where_it_is_fewer_operations(monkeypatch):
    # K = 40 against 1 x 1 limbs: the residue GEMM (counted); K = 1 against 5 x 5 limbs: the objects' own product
    assert 1 <= exact_path.RESIDUE_GEMM_TERMS < 40
    calls = []
    be = get_backend("cpu")
    real = be.matmul
    monkeypatch.setattr(be, "matmul", lambda *a: calls.append(1) or real(*a))
    rng = random.Random(3)
    exact_path.exact_int_matmul(_ints(rng, (1, 3, 40), 50), _ints(rng, (1, 40, 2), 50), be)
    assert calls == [1]
    exact_path.exact_int_matmul(_ints(rng, (1, 3, 1), 300), _ints(rng, (1, 1, 2), 300), be)
    assert calls == [1]


def _F(x):
    return np.vectorize(Fraction, otypes=[object])(x)


@pytest.mark.parametrize("terms, output, shapes", [
    (["ab", "bc", "cd"], "da", [(3, 4), (4, 2), (2, 5)]),  # a chain, the output transposed
    (["abc", "b"], "", [(2, 3, 4), (3,)]),  # labels summed out alone, a scalar
    (["ab", "ab", "b"], "a", [(3, 4), (3, 4), (4,)]),  # a batch label, then a contraction
    (["a", "b"], "ba", [(3,), (2,)]),  # an outer product
    (["abc"], "ca", [(2, 3, 4)]),  # one operand
])
@pytest.mark.parametrize("cplx", [False, True])
def test_exact_einsum_is_exact(terms, output, shapes, cplx):
    import opt_einsum

    rng = np.random.default_rng(len(terms) + len(output))
    ops = [rng.standard_normal(s) * np.exp2(rng.integers(-400, 400, s)) for s in shapes]
    if cplx:
        ops[0] = ops[0] + 1j * rng.standard_normal(shapes[0]) * np.exp2(rng.integers(-300, 300, shapes[0]))
    sub = ",".join(terms) + "->" + output
    path = opt_einsum.contract_path(sub, *ops)[0]
    leaves = [[x.real, x.imag] if np.iscomplexobj(x) else [x] for x in ops]
    parts, e = exact_path.exact_einsum(terms, output, path, leaves, get_backend("cpu"))
    scale = Fraction(2) ** e
    want_re = np.einsum(sub, *[_F(x.real) for x in ops]) if not cplx else \
        np.einsum(sub, _F(ops[0].real), *[_F(x) for x in ops[1:]])
    got_re = np.vectorize(lambda v: Fraction(int(v)) * scale, otypes=[object])(parts[0])
    assert np.shape(got_re) == np.shape(want_re) and (np.asarray(got_re == want_re)).all()
    assert len(parts) == (2 if cplx else 1)
    if cplx:
        want_im = np.einsum(sub, _F(ops[0].imag), *[_F(x) for x in ops[1:]])
        assert (np.asarray(np.vectorize(lambda v: Fraction(int(v)) * scale, otypes=[object])(parts[1]) == want_im)).all()
