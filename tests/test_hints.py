"""Every error that names a fix names one that works: each hint below is followed as written and the call then runs.

The cases come from a held-out audit that followed every hint literally (issue 32: "Every error that names a fix
names one that works when followed"); the fixes that are numbers (a moduli count, a width, a ``min_bits``) are read
from the message itself.
"""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pytest

import rnstensor as rt


def _refused(call, exc=ValueError) -> str:
    with pytest.raises(exc) as info:
        call()
    return str(info.value)


def _number(msg: str, pattern: str) -> int:
    found = re.search(pattern, msg)
    assert found, f"no {pattern!r} in: {msg}"
    return int(found.group(1))


@pytest.fixture
def rng():
    return np.random.default_rng(1)


def test_einsum_plans_that_keep_too_few_bits(rng):
    A = rng.uniform(-1, 1, (8, 8))
    sub = "ij,jk,kl,lm->im"
    msg = _refused(lambda: rt.einsum(sub, A, A, A, A, moduli=5), rt.PlanError)
    s, kept = _number(msg, r"moduli=(\d+) plans it"), _number(msg, r"min_bits=(\d+) to accept")
    assert rt.einsum(sub, A, A, A, A, moduli=s).shape == (8, 8)
    assert rt.einsum(sub, A, A, A, A, moduli=5, min_bits=kept).shape == (8, 8)
    # an exact decode needs the data's every bit: lowering min_bits is no fix there, 'auto' or the fp64 decode are
    msg = _refused(lambda: rt.einsum(sub, A, A, A, A, decode="exact"), rt.PlanError)
    assert "min_bits=" not in msg.split("; ", 1)[1] and "moduli='auto'" in msg and "decode='fp64'" in msg
    y = rt.einsum(sub, A, A, A, A, decode="exact", moduli="auto")
    F = [[Fraction(v) for v in row] for row in A]
    M = F
    for _ in range(3):
        M = [[sum(M[i][p] * F[p][j] for p in range(8)) for j in range(8)] for i in range(8)]
    assert all(y[i, j] == float(M[i][j]) for i in range(8) for j in range(8))
    assert rt.einsum(sub, A, A, A, A, decode="fp64").shape == (8, 8)


def test_exact_decode_on_few_moduli_names_an_fp64_decode_that_plans(rng):
    # on 3 moduli the fp64 decode is refused too (it keeps min_bits): the hint names the moduli it takes
    A, B = rng.standard_normal((20, 30)), rng.standard_normal((30, 10))
    msg = _refused(lambda: rt.einsum("ij,jk->ik", A, B, moduli=3, decode="exact"), rt.PlanError)
    s = _number(msg, r"decode='fp64' with moduli=(\d+)")
    _refused(lambda: rt.einsum("ij,jk->ik", A, B, moduli=s - 1, decode="fp64"), rt.PlanError)
    y = rt.einsum("ij,jk->ik", A, B, moduli=s, decode="fp64")
    assert np.max(np.abs(y - A @ B)) <= 2.0**-28 * np.max(np.abs(A) @ np.abs(B))  # min_bits=32 kept
    assert rt.einsum("ij,jk->ik", A, B, moduli="auto", decode="exact").shape == (20, 10)


def test_chain_plans_name_what_plans(rng):
    ops = [rng.uniform(-1, 1, (8, 8)) for _ in range(3)]
    X = rng.uniform(-1, 1, (2, 8, 8, 8))
    msg = _refused(lambda: rt.plan_chain(ops, [0, 1, 2], moduli=5, method="norescale"), rt.PlanError)
    s, kept = _number(msg, r"moduli=(\d+) plans it"), _number(msg, r"min_bits=(\d+) to accept")
    assert rt.plan_chain(ops, [0, 1, 2], moduli=s, method="norescale")(X).shape == X.shape
    assert rt.plan_chain(ops, [0, 1, 2], moduli=5, method="norescale", min_bits=kept)(X).shape == X.shape
    msg = _refused(lambda: rt.plan_chain(ops, [0, 1, 2], moduli=15, bits=200), rt.PlanError)
    assert "leave bits unset" in msg and "more moduli" not in msg  # (no count up to 49 holds b = 200)
    assert rt.plan_chain(ops, [0, 1, 2], moduli=15)(X).shape == X.shape
    msg = _refused(lambda: rt.plan_chain(ops, [0, 1, 2], moduli=50))
    assert msg.startswith("moduli must be") and "1..49" in msg
    composed = rt.plan_chain(ops, [0, 1, 2], method="composed")  # (it decodes after every product: never one kernel)
    assert "pass fused=None or False" in _refused(lambda: composed.run(X, fused=True))
    assert np.array_equal(composed.run(X, fused=False), composed.run(X))


def test_gemm_moduli_counts_that_hold_no_width():
    a, b = np.ones((1, 16384)), np.ones((16384, 1))
    msg = _refused(lambda: rt.dgemm(a, b, moduli=1), rt.RNSRangeError)
    keeps = _number(msg, r"use moduli >= (\d+) \(width >= min_bits")
    least = _number(msg, r"or moduli >= (\d+) with min_bits=0")
    assert rt.dgemm(a, b, moduli=keeps)[0, 0] == 16384.0
    assert rt.dgemm(a, b, moduli=least, min_bits=0)[0, 0] == 16384.0
    assert rt.dgemm(a, b, moduli="fast")[0, 0] == 16384.0


def test_renamed_errors_keep_their_cause():
    from rnstensor.errors import renamed as _renamed

    inner = KeyError("table")
    try:
        try:
            raise inner
        except KeyError as cause:
            raise rt.PlanError("dgemm: no plan") from cause
    except rt.PlanError as exc:
        renamed = _renamed(exc, "matmul", ("dgemm", "zgemm"))
    assert str(renamed) == "matmul: no plan" and renamed.__cause__ is inner and renamed.__suppress_context__


def test_tensordot_and_mode_chain_errors_name_what_was_called():
    # (their bodies are einsum's and plan_chain's: the messages name the function the user called, and the
    # fixes they give work there)
    a, b = np.ones((3, 4)), np.ones((4, 2))
    msg = _refused(lambda: rt.tensordot(a, b, 1, rtol=1e-17))
    assert msg.startswith("tensordot: ") and "moduli='auto'" in msg
    assert np.array_equal(rt.tensordot(a, b, 1, moduli="auto"), a @ b)
    X, ops = np.ones((2, 4, 4)), [np.eye(4)]
    msg = _refused(lambda: rt.mode_chain(X, ops, [1], rtol=1e-17))
    assert msg.startswith("mode_chain: ") and "moduli='auto'" in msg
    assert np.array_equal(rt.mode_chain(X, ops, [1], moduli="auto"), X)


def test_matmul_errors_name_matmul_and_the_argument_at_fault():
    A = np.ones((8, 8))
    for call in (lambda: rt.matmul(A, A, moduli=6), lambda: rt.matmul(np.stack([A, A]), np.stack([A, A]), moduli=6)):
        assert _refused(call, rt.PlanError).startswith("matmul: ")
    Ai, Bi = np.arange(6).reshape(2, 3), np.arange(6).reshape(3, 2)
    assert "drop rtol" in _refused(lambda: rt.matmul(Ai, Bi, rtol=1e-10))
    assert np.array_equal(rt.matmul(Ai, Bi), Ai @ Bi)
    t = np.ones((2, 300), bool)
    msg = _refused(lambda: rt.matmul(t, t.T, out=np.empty((2, 2), np.int8), casting="unsafe"), rt.RNSRangeError)
    assert "out of a wider integer dtype such as int64" in msg
    out = np.empty((2, 2), np.int64)
    assert rt.matmul(t, t.T, out=out, casting="unsafe") is out and (out == 300).all()
    T = rt.encode(A, 15)
    for call in (lambda: rt.dgemm(T, A), lambda: rt.matmul(T, A)):
        assert "decode it first (rt.decode(a, 'exact')" in _refused(call, TypeError)
    assert np.array_equal(rt.dgemm(rt.decode(T, "exact"), A), A @ A)


def test_primitive_ranges(rng):
    A = rng.uniform(-1, 1, (8, 8))
    T, O = rt.encode(A[None], 3, bits=20), rt.encode(A, 3, bits=10, shared_axes=(1,))
    msg = _refused(lambda: rt.mode_product(T, O, axis=1), rt.RNSRangeError)
    n = _number(msg, r"rt\.drop\(T, (\d+), extend=True\)")
    assert rt.mode_product(rt.drop(T, n, extend=True), O, axis=1).shape == (1, 8, 8)
    # moduli far below 128 (a custom basis): the drop it names counts their own bits
    small = rt.Basis((251, 241, 239, 233, 229, 227, 3, 5, 7, 11, 13))
    T, O = rt.encode(A[None], small, bits=40), rt.encode(A, small, bits=25, shared_axes=(1,))
    msg = _refused(lambda: rt.mode_product(T, O, axis=1), rt.RNSRangeError)
    n = _number(msg, r"rt\.drop\(T, (\d+), extend=True\)")
    assert rt.mode_product(rt.drop(T, n, extend=True), O, axis=1).shape == (1, 8, 8)
    msg = _refused(lambda: rt.encode(A, (7,)), rt.RNSRangeError)
    assert rt.encode(A, (7,), bits=_number(msg, r"use at most bits=(\d+)")).shape == A.shape
    assert "holds no width" in _refused(lambda: rt.encode(A, (2,)), rt.RNSRangeError)


def test_einsum_casting_fixes_hold_for_every_operand(rng):
    A = rng.uniform(-1, 1, (4, 4))
    a32 = A.astype(np.float32)
    msg = _refused(lambda: rt.einsum("ij,jk->ik", a32, A, dtype=np.float64, casting="no"), TypeError)
    assert "dtype=complex128" not in msg  # (float32 to complex128 is no more 'no' than to float64)
    assert rt.einsum("ij,jk->ik", a32, A, dtype=None, casting="no").dtype == np.float64
    assert rt.einsum("ij,jk->ik", a32, A, dtype=np.float64, casting="safe").dtype == np.float64
    z = A + 1j * A
    msg = _refused(lambda: rt.einsum("ij,jk->ik", z, A, dtype=np.float64), TypeError)
    assert "casting='unsafe'" in msg
    assert rt.einsum("ij,jk->ik", z, A, dtype=np.float64, casting="unsafe").dtype == np.float64


def test_composed_overflow_names_methods_that_run():
    B = np.zeros((4, 4))
    B[0, 0] = B[1, 1] = 1e300
    C = 1e-300 * np.eye(4)
    kw = dict(optimize=[(0, 1), (0, 1)])
    msg = _refused(lambda: rt.einsum("ij,jk,kl->il", B, B, C, method="composed", moduli=15, **kw), rt.RNSRangeError)
    assert "method='rescale_be'" in msg and "leave method and moduli unset" in msg
    big = float(Fraction(1e300) ** 2 * Fraction(1e-300))  # (the exact value, rounded once)
    want = np.diag([big, big, 0, 0])
    assert np.array_equal(rt.einsum("ij,jk,kl->il", B, B, C, method="rescale_be", moduli=15, **kw), want)
    assert np.array_equal(rt.einsum("ij,jk,kl->il", B, B, C, **kw), want)


def test_fem_operators_name_the_tensor_basis_moduli():
    from rnstensor.fem import MassOperator, TensorBasis, box_mesh

    mesh = box_mesh(TensorBasis(3), shape=1, curved=0.1)
    msg = _refused(lambda: MassOperator(TensorBasis(3, moduli=8), mesh.qdata), rt.PlanError)
    assert "method='composed'" not in msg
    s, kept = _number(msg, r"TensorBasis\(\.\.\., moduli=(\d+)\) plans it"), _number(msg, r"min_bits=(\d+) to accept")
    assert MassOperator(TensorBasis(3, moduli=s), mesh.qdata) is not None
    assert MassOperator(TensorBasis(3, moduli=8), mesh.qdata, min_bits=kept) is not None
    msg = _refused(lambda: MassOperator(TensorBasis(3), mesh.qdata, bits=200), rt.PlanError)
    assert "leave bits unset" in msg
    msg = _refused(lambda: TensorBasis(100))
    assert TensorBasis(_number(msg, r"P <= (\d+)")).P == 63
