"""``rt.matmul`` against numpy's own matmul tests (``numpy/_core/tests/test_multiarray.py``) and exact oracles.

numpy's ``MatmulCommon`` / ``TestMatmul`` methods run unchanged, with
``self.matmul`` and the module's ``np.matmul`` both routed to ``rt.matmul``
(``np.dot`` and the rest stay numpy's: they are the tests' oracles). The
dtypes are numpy's list less those float64 cannot hold exactly (longdouble,
clongdouble, object), which ``rt.matmul`` refuses, as tested below.
"""

from __future__ import annotations

import importlib
import itertools
import types
import warnings
from fractions import Fraction

import numpy as np
import pytest

import rnstensor as rt
from rnstensor.errors import RNSRangeError



def _numpy_test_module(name: str):
    """numpy's own test module (numpy >= 2 under ``numpy._core``, before under ``numpy.core``), or None."""
    for package in ("numpy._core.tests", "numpy.core.tests"):
        with warnings.catch_warnings():  # its marks are registered by numpy's conftest, not ours
            warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
            try:
                return importlib.import_module(f"{package}.{name}")
            except ImportError:
                continue
    return None


_np_tests = _numpy_test_module("test_multiarray")

#: numpy's cases that do not apply, with the reason (each is covered by a test of rt's own behaviour below).
NOT_APPLICABLE = {
    "test_matmul_object": "object arrays (Fractions): not float64, refused with TypeError",
    "test_matmul_object_type_scalar": "object arrays (Fractions): not float64, refused with TypeError",
    "test_matmul_empty": "object arrays: not float64, refused with TypeError",
    "test_matmul_exception_multiply": "object arrays of user classes: refused with TypeError",
    "test_matmul_exception_add": "object arrays of user classes: refused with TypeError",
}

CALLS = {"n": 0}


def _counted_matmul(*args, **kwargs):
    CALLS["n"] += 1
    return rt.matmul(*args, **kwargs)


class _NumpyWithRtMatmul(types.ModuleType):
    """numpy, except ``matmul``: what numpy's test functions see as ``np``."""

    matmul = staticmethod(_counted_matmul)

    def __getattr__(self, name):
        return getattr(np, name)


def _rebound(fn, namespace):
    """``fn`` with its globals replaced by ``namespace`` (pytest marks and parametrization kept)."""
    new = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__dict__.update(fn.__dict__)
    new.__qualname__ = fn.__qualname__
    return new


def _numpy_cases() -> dict:
    if _np_tests is None:
        return {}
    namespace = dict(vars(_np_tests), np=_NumpyWithRtMatmul("numpy"))
    cases = {}
    for cls in (_np_tests.MatmulCommon, _np_tests.TestMatmul):
        for name, member in vars(cls).items():
            if name.startswith("test_") and callable(member):
                fn = _rebound(member, namespace)
                if name in NOT_APPLICABLE:
                    fn = pytest.mark.skip(reason=NOT_APPLICABLE[name])(fn)
                cases[name] = fn
            elif not name.startswith("_") and isinstance(member, np.ndarray):
                cases[name] = member  # class-level operands of the parametrized cases
    return cases


@pytest.mark.skipif(_np_tests is None, reason="this numpy ships without its test files")
class TestNumpyMatmul:
    matmul = staticmethod(_counted_matmul)
    types = "?bhilqBHILQefdFD"  # numpy's "?bhilqBHILQefdgFDGO" less longdouble, clongdouble, object
    locals().update(_numpy_cases())

    @pytest.fixture(autouse=True)
    def _routed_to_rt(self):
        before = CALLS["n"]
        yield
        assert CALLS["n"] > before, "numpy's test never reached rt.matmul"


def test_numpy_cases_found():
    if _np_tests is None:
        pytest.skip("this numpy ships without its test files")
    ran = [n for n in _numpy_cases() if n.startswith("test_") and n not in NOT_APPLICABLE]
    assert len(ran) >= 12, ran  # the harness must not silently lose numpy's cases


@pytest.mark.parametrize("dt", [np.longdouble, np.clongdouble, object])
def test_refuses_what_float64_cannot_hold(dt):
    a = np.ones((2, 2), dtype=dt)
    with pytest.raises(TypeError, match="holds exactly"):
        rt.matmul(a, a)


# ----- against exact oracles --------------------------------------------------------------------------------


def _exact_stack(a, b) -> np.ndarray:
    """numpy-semantics matmul in Fractions, each entry correctly rounded to float64 (stacks broadcast)."""
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    A, B = np.broadcast_to(a2, batch + a2.shape[-2:]), np.broadcast_to(b2, batch + b2.shape[-2:])
    res = np.empty(batch + (a2.shape[-2], b2.shape[-1]))
    for idx in itertools.product(*map(range, batch)):
        for i, j in itertools.product(range(res.shape[-2]), range(res.shape[-1])):
            exact = sum(Fraction(float(x)) * Fraction(float(y)) for x, y in zip(A[idx][i], B[idx][:, j]))
            res[idx + (i, j)] = float(exact)  # Fraction -> float rounds to nearest, ties to even
    if a.ndim == 1:
        res = res[..., 0, :]
    if b.ndim == 1:
        res = res[..., 0]
    return res


SHAPES = [((3,), (3,)), ((2, 1, 4, 5), (3, 5, 2)), ((5,), (2, 5, 3)), ((2, 3, 4), (4,)), ((1, 0, 3), (3, 2)),
          ((2, 3, 0), (0, 4))]


@pytest.mark.parametrize("sa,sb", SHAPES)
def test_correctly_rounded_stacks(sa, sb):
    rng = np.random.default_rng(len(sa) * 10 + len(sb))
    a = rng.standard_normal(sa) * 2.0 ** rng.integers(-30, 30, sa)
    b = rng.standard_normal(sb)
    got = rt.matmul(a, b, moduli="auto")
    want = _exact_stack(a, b)
    assert np.shape(got) == np.matmul(a, b).shape
    assert np.array_equal(np.asarray(got), want)


def test_two_vectors_give_a_numpy_scalar():
    got = rt.matmul(np.array([1.0, 2.0]), np.array([3.0, 4.0]))
    assert type(got) is np.float64 and got == 11.0
    got = rt.matmul(np.array([1 + 1j, 2.0]), np.array([3.0, 4j]))
    assert type(got) is np.complex128 and got == 3 + 11j


def test_out_may_overlap_and_is_returned():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 4))
    want = _exact_stack(a, a)
    out = a.copy()
    assert rt.matmul(out, out, out, moduli="auto") is out
    assert np.array_equal(out, want)
    c = np.zeros((4, 4), np.complex128)
    assert rt.matmul(a, a, out=c, moduli="auto") is c and np.array_equal(c.real, want) and not c.imag.any()


def test_out_errors():
    a = np.ones((3, 2))
    with pytest.raises(ValueError, match="non-broadcastable"):
        rt.matmul(a, a.T, out=np.empty((1, 3)))
    with pytest.raises(TypeError, match="Cannot cast ufunc 'matmul' output .* casting='safe'"):
        rt.matmul(a, a.T, out=np.empty((3, 3), np.float32), casting="safe")
    with pytest.raises(TypeError, match="Cannot cast ufunc 'matmul' output"):
        rt.matmul(a + 1j, a.T, out=np.empty((3, 3)))  # complex into real: not 'same_kind'
    with pytest.raises(TypeError, match="out must be an array"):
        rt.matmul(a, a.T, out=[[0.0] * 3] * 3)
    with pytest.raises(ValueError, match="casting must be one of"):
        rt.matmul(a, a.T, casting="sometimes")


def test_out_casting_like_numpy_ufuncs():
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((3, 7)), rng.standard_normal((7, 2))
    want = _exact_stack(a, b)
    o32 = np.empty((3, 2), np.float32)
    assert rt.matmul(a, b, out=o32, moduli="auto") is o32  # 'same_kind', numpy's default: rounded once more
    assert np.array_equal(o32, want.astype(np.float32))
    o = np.empty((3, 2))
    assert rt.matmul(a, b, (o,), moduli="auto") is o and np.array_equal(o, want)  # a 1-tuple, as ufuncs take
    i = np.array([[100, 27], [3, -4]])
    o8 = np.empty((2, 2), np.int8)
    assert rt.matmul(i, np.eye(2, dtype=np.int64), out=o8) is o8 and np.array_equal(o8, i)
    with pytest.raises(RNSRangeError, match="int8's range"):
        rt.matmul(i, i, out=o8)  # 10081 does not fit: numpy would wrap it into int8


def test_dtype_argument():
    a = np.arange(6).reshape(2, 3)
    got = rt.matmul(a, a.T, dtype=np.float64)
    assert got.dtype == np.float64 and np.array_equal(got, (a @ a.T).astype(float))
    assert rt.matmul(a, a.T, dtype=np.complex128).dtype == np.complex128
    with pytest.raises(TypeError, match="dtype=float32 is not supported"):
        rt.matmul(a, a.T, dtype=np.float32)
    with pytest.raises(TypeError, match="complex product"):
        rt.matmul(a + 1j, a.T, dtype=np.float64)


def test_integers_are_exact_up_to_2_53():
    big = 2**26
    a = np.array([[big, 1], [3, -big]], dtype=np.int64)
    got = rt.matmul(a, a)
    want = np.array([[int(x) for x in row] for row in (np.array(a, dtype=object) @ np.array(a, dtype=object))])
    assert got.dtype == np.int64 and np.array_equal(got, want)  # 2^52 + 3: exact, beyond float64 BLAS's care
    with pytest.raises(RNSRangeError, match="2\\^53"):
        rt.matmul(np.array([[2**27, 2**27]]), np.array([[2**26], [2**26]]))  # exact value 2^54
    with pytest.raises(ValueError, match="2\\^53"):
        rt.matmul(np.array([[2**53 + 1]]), np.array([[1]]))
    with pytest.raises(RNSRangeError, match="int8's range"):
        rt.matmul(np.full((1, 4), 100, np.int8), np.full((4, 1), 100, np.int8))  # numpy wraps it
    with pytest.raises(ValueError, match="moduli='auto'"):
        rt.matmul(a, a, moduli=3)


def test_narrow_floats_are_rounded_once_from_float64():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((6, 40)).astype(np.float32), rng.standard_normal((40, 3)).astype(np.float32)
    got = rt.matmul(a, b, moduli="auto")
    assert got.dtype == np.float32
    assert np.array_equal(got, _exact_stack(a.astype(float), b.astype(float)).astype(np.float32))
    z = (a + 1j * a).astype(np.complex64)
    assert rt.matmul(z, b).dtype == np.complex64


# ----- stacks run batched, each matrix with dgemm's bits -----------------------------------------------------------


def _stack(rng, nb, m, k, n):
    """A stack whose matrices need different moduli: uniform, phi = 4, integers, a 120-binade row, wide columns, a
    matrix holding inf and one holding NaN, an all-zero one (each kind a few times)."""
    A, B = rng.uniform(-1, 1, (nb, m, k)), rng.uniform(-1, 1, (nb, k, n))
    for i in range(nb):
        kind = i % 7
        if kind == 1:
            A[i] *= np.exp(4 * rng.standard_normal((m, k)))
            B[i] *= np.exp(4 * rng.standard_normal((k, n)))
        elif kind == 2:
            A[i], B[i] = rng.integers(-9, 9, (m, k)), rng.integers(-9, 9, (k, n))
        elif kind == 3:
            A[i, 0] *= 2.0 ** rng.integers(-120, 0, k)
        elif kind == 4:
            B[i, :, 1] *= 2.0 ** rng.integers(-400, 400, k)  # wider than 49 moduli hold: the split product
        elif kind == 5:
            A[i, 1, 2] = np.inf if i % 2 else np.nan
        elif kind == 6:
            A[i] = 0.0
    return A, B


def _complex_stack(rng, nb, m, k, n):
    """:func:`_stack`'s kinds in both parts of every matrix (a part of inf times 1j: a NaN part too)."""
    (Ar, Br), (Ai, Bi) = _stack(rng, nb, m, k, n), _stack(rng, nb, m, k, n)
    with np.errstate(invalid="ignore"):
        return Ar + 1j * Ai, Br + 1j * Bi


def _same_bits(x, y) -> bool:
    """Equal entries, NaNs in the same places and the same signs (of each part, complex)."""
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype.kind == "c":
        x, y = x.view(np.float64), y.view(np.float64)
    return bool(np.array_equal(x, y, equal_nan=True) and np.array_equal(np.signbit(x), np.signbit(y)))


@pytest.mark.parametrize("cplx", [False, True], ids=["real", "complex"])
@pytest.mark.parametrize("kw", [{}, {"moduli": "fast"}, {"moduli": "auto"}, {"moduli": 19}, {"rtol": 1e-12},
                                {"workspace_bytes": 40_000}])
def test_stack_is_each_matrix_dgemm_bit_for_bit(kw, cplx):
    rng = np.random.default_rng(21)
    A, B = (_complex_stack if cplx else _stack)(rng, 14, 5, 9, 4)
    gemm = rt.zgemm if cplx else rt.dgemm
    y = rt.matmul(A, B, **kw)
    for i in range(A.shape[0]):
        assert _same_bits(y[i], gemm(A[i], B[i], **kw)), i
    # and broadcast batch axes: a (2, 1, ...) stack against a (1, 3, ...) one
    y = rt.matmul(A[:2, None], B[None, 2:5], **kw)
    for i, j in itertools.product(range(2), range(3)):
        assert _same_bits(y[i, j], gemm(A[i], B[2 + j], **kw))


@pytest.mark.parametrize("cplx", [False, True], ids=["real", "complex"])
def test_stack_runs_batched(cplx, monkeypatch):
    # a stack of finite matrices on a few moduli counts is a few batched products, not one GEMM per matrix
    import rnstensor.gemm.api as gemm_api

    rng = np.random.default_rng(23)
    A, B = rng.uniform(-1, 1, (12, 5, 9)), rng.uniform(-1, 1, (12, 9, 4))
    if cplx:
        A, B = A + 1j * rng.uniform(-1, 1, A.shape), B - 1j * rng.uniform(-1, 1, B.shape)
    want = [rt.zgemm(A[i], B[i]) if cplx else rt.dgemm(A[i], B[i]) for i in range(12)]
    alone = []
    for name in ("dgemm", "zgemm"):
        monkeypatch.setattr(gemm_api, name, lambda *a, **k: alone.append(1))
    y = rt.matmul(A, B)
    assert alone == [] and all(_same_bits(y[i], want[i]) for i in range(12))


def test_stack_past_the_workspace_runs_matrix_by_matrix(monkeypatch):
    # the batched stack copies its operands contiguously (a broadcast one once per matrix): where that passes the
    # workspace, every matrix goes to dgemm on its views instead, with the same bits
    import rnstensor.gemm.api as gemm_api

    rng = np.random.default_rng(29)
    # (b broadcast along the first batch axis only: one b for the whole stack takes gemm_shared, no copies)
    A, b = rng.standard_normal((2, 8, 6, 40)), rng.standard_normal((1, 8, 40, 30))
    staged = (A.size + 2 * 2 * b.size) * 8  # a, and b's 16 copies with their transposes
    left, real = [], gemm_api.gemm_stack
    monkeypatch.setattr(gemm_api, "gemm_stack", lambda *a: left.append(real(*a)) or left[-1])
    As, bs = A.reshape(16, 6, 40), np.broadcast_to(b, (2, 8, 40, 30)).reshape(16, 40, 30)
    for workspace, alone in ((staged - 8, list(range(16))), (staged, [])):
        y = rt.matmul(A, b, workspace_bytes=workspace).reshape(16, 6, 30)
        assert left.pop() == alone
        assert all(_same_bits(y[i], rt.dgemm(As[i], bs[i], workspace_bytes=workspace)) for i in range(16))


@pytest.mark.parametrize("cplx", [False, True], ids=["real", "complex"])
def test_stack_moduli_are_each_matrix_own(cplx):
    # the width choice of a stack (one table of spreads, one batched GEMM of magnitudes) is each matrix's alone
    from rnstensor.gemm.scan import group_stats
    from rnstensor.gemm.split import _choose
    from rnstensor.gemm.stack import _moduli_counts

    rng = np.random.default_rng(22)
    A, B = (_complex_stack if cplx else _stack)(rng, 21, 6, 30, 5)
    keep = [i for i in range(A.shape[0]) if np.isfinite(A[i]).all()]
    A, B = A[keep], B[keep]
    nb, m, k = A.shape
    n = B.shape[2]
    A2, BT = A.reshape(nb * m, k), np.ascontiguousarray(B.transpose(0, 2, 1)).reshape(nb * n, k)
    for moduli, rtol in ((None, None), ("auto", None), (None, 1e-9)):
        sa = tuple(None if v is None else v.reshape(nb, m) for v in group_stats(A2, 1, moduli == "auto"))
        sb = tuple(None if v is None else v.reshape(nb, n) for v in group_stats(BT, 1, moduli == "auto"))
        got = _moduli_counts(moduli, k, cplx, sa, sb, A2, BT, rtol, np)
        # dgemm alone: one product on s moduli ('whole'), or rows / columns split (the stack leaves those to dgemm)
        want = [(lambda c: c[1] if c[0] == "whole" else None)(_choose(moduli, A[i], B[i], k, cplx, rtol=rtol))
                for i in range(nb)]
        assert got == want, (moduli, rtol)
        whole = [i for i in range(nb) if want[i] is not None]
        assert len(whole) > nb // 2
        assert len({want[i] for i in whole}) > 1  # the stack's matrices do need different moduli
