"""Errors: RNSRangeError at the exact range edge, and clear exceptions for bad input.

The dtype rule (documented in ``encode``): real floating arrays only — float64,
float32 and float16 (widened exactly). Integers, booleans, complex numbers and
objects raise ``TypeError``: integers above 2^53 would round on the way to
float64, complex values need their real and imaginary parts encoded separately.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from oracle import centered, drop_int, max_abs, residues

import rnstensor as rt

FIG2 = rt.Basis((7, 5, 3))  # P = 105 (odd)
EVEN = rt.Basis((8, 7, 5, 3))  # P = 840 (even)


def make(vals, basis, bound=None, active=None, scale=None):
    vals = np.asarray(vals, dtype=object)
    active = basis.moduli if active is None else tuple(active)
    bound = max_abs(vals) if bound is None else bound
    scale = rt.Scale.unit(vals.ndim) if scale is None else scale
    return rt.RNSTensor(residues(vals, active), basis, active, bound, scale)


def check_holds(T, vals):
    vals = np.asarray(vals, dtype=object)
    np.testing.assert_array_equal(T.residues, residues(vals, T.active))
    assert max(abs(int(v)) for v in vals.reshape(-1)) <= T.bound
    assert 2 * T.bound < math.prod(T.active)


def test_hierarchy():
    assert issubclass(rt.RNSRangeError, ValueError)
    assert issubclass(rt.PlanError, ValueError)
    assert not issubclass(rt.RNSRangeError, rt.PlanError)


# ----- RNSRangeError exactly at the limit -----------------------------------------------------------


@pytest.mark.parametrize(
    "moduli, bits, ok",
    [
        ((8,), 2, False),  # 2 * 2^2 = 8 = P
        ((9,), 2, True),  # 8 = P - 1
        ((10,), 2, True),  # 8 = P - 2
        ((8,), 1, True),
        ((16, 3), 4, True),  # 32 < 48
        ((16, 3), 5, False),  # 64 > 48
        ((256, 255), 14, True),  # 2^15 < 65280
        ((256, 255), 15, False),
        ((4,), 1, False),  # 4 = P
    ],
)
def test_encode_range_edge(moduli, bits, ok):
    B = rt.Basis(moduli)
    x = np.array([1.0, -0.5, 0.75])
    if ok:
        T = rt.encode(x, B, bits=bits)
        assert T.bound == 2**bits and 2 * T.bound < B.product
    else:
        with pytest.raises(rt.RNSRangeError, match="bits"):
            rt.encode(x, B, bits=bits)


def test_encode_absurd_bits_fails_fast():
    with pytest.raises(rt.RNSRangeError):
        rt.encode(np.array([1.0]), 15, bits=10**12)


def test_mode_product_range_edge_even_P():
    op2 = make([[2]], EVEN)  # rho = 2
    T = make([[210, -210, 0]], EVEN, bound=210)
    with pytest.raises(rt.RNSRangeError) as ei:
        rt.mode_product(T, op2, 0)  # 2 * 420 = P
    msg = str(ei.value)
    assert "2^" in msg and "moduli" in msg
    R = rt.mode_product(make([[209, -209, 3]], EVEN, bound=209), op2, 0)  # 2 * 418 = P - 4
    check_holds(R, [[418, -418, 6]])
    op1 = make([[1]], EVEN)
    R = rt.mode_product(make([[419, -419, 0]], EVEN, bound=419), op1, 0)  # 2 * 419 = P - 2
    check_holds(R, [[419, -419, 0]])
    assert R.bound == 419
    # a row sum, not the largest entry, decides
    T = make([200, -10], EVEN, bound=210)
    with pytest.raises(rt.RNSRangeError):
        rt.mode_product(T, make([[1, 1]], EVEN), 0)  # rho 2 -> 420
    R = rt.mode_product(make([200, -9], EVEN, bound=209), make([[1, -1], [0, 1]], EVEN), 0)
    check_holds(R, [209, -9])


def test_mode_product_range_edge_odd_P():
    op = make([[1, 1]], FIG2)  # rho = 2
    R = rt.mode_product(make([26, 26], FIG2, bound=26), op, 0)  # 2 * 52 = 104 = P - 1
    check_holds(R, [52])
    assert R.bound == 52
    R = rt.mode_product(make([-26, -26], FIG2, bound=26), op, 0)
    check_holds(R, [-52])
    with pytest.raises(rt.RNSRangeError):
        rt.mode_product(make([27, 0], FIG2, bound=27), op, 0)  # 108 > 105: raised from the bound, not the value


def test_mode_product_range_realistic():
    B = rt.Basis.int8(15)
    x = np.random.default_rng(0).standard_normal((3, 4))
    X = rt.encode(x, B, bits=53)
    op = rt.encode(np.random.default_rng(1).standard_normal((4, 4)), B, bits=53, shared_axes=(1,))
    Y = rt.mode_product(X, op, 1)
    A_eff, Y0 = rt.fold_pending(Y, np.eye(4), 1)
    with pytest.raises(rt.RNSRangeError, match="short by"):
        rt.mode_product(Y0, rt.encode(A_eff, B, bits=53, shared_axes=(1,)), 1)


def test_hadamard_range_edge():
    with pytest.raises(rt.RNSRangeError):
        rt.hadamard(make([210, 1], EVEN, bound=210), make([2], EVEN, bound=2))  # 420: 2B = P
    R = rt.hadamard(make([419, -419], EVEN, bound=419), make([1], EVEN, bound=1))  # P - 2
    check_holds(R, [419, -419])
    R = rt.hadamard(make([13, -13], FIG2, bound=13), make([4, -4], FIG2, bound=4))  # 104 = P - 1
    check_holds(R, [52, 52])
    with pytest.raises(rt.RNSRangeError):
        rt.hadamard(make([1, 1], FIG2, bound=53 // 2 + 1), make([1, 1], FIG2, bound=2))  # 27 * 2 = 54 > 52


def test_add_sub_range_edge():
    for f in (rt.add, rt.sub):
        with pytest.raises(rt.RNSRangeError):
            f(make([210], EVEN, bound=210), make([-210], EVEN, bound=210))  # 2 * 420 = P
        R = f(make([210], EVEN, bound=210), make([-209], EVEN, bound=209))  # 2 * 419 = P - 2
        check_holds(R, [1 if f is rt.add else 419])
        R = f(make([26], FIG2, bound=26), make([-26], FIG2, bound=26))  # 104 = P - 1
        check_holds(R, [0 if f is rt.add else 52])
        with pytest.raises(rt.RNSRangeError):
            f(make([26], FIG2, bound=26), make([0], FIG2, bound=27))


def test_drop_range_edge():
    B = rt.Basis((4, 3))  # P = 12; drop 3 -> P' = 4, range [-2, 1]
    with pytest.raises(rt.RNSRangeError):
        rt.drop(make([3, -3, 5], B, bound=5))  # B' = 5 // 3 + 1 = 2: 2 B' = 4 = P'
    with pytest.raises(rt.RNSRangeError):
        rt.drop(make([0], B, bound=3))  # B' = 2 as well: the bound decides, not the value
    D = rt.drop(make([2, -2, 1, 0], B, bound=2))  # B' = 1: 2 = P' - 2
    assert D.active == (4,) and D.bound == 1
    check_holds(D, [drop_int(t, 3) for t in (2, -2, 1, 0)])
    C = rt.Basis((5, 2))  # P = 10; drop 2 -> P' = 5
    D = rt.drop(make([2, -2, 1, -1], C, bound=2))  # B' = 2: 4 = P' - 1
    assert D.bound == 2
    check_holds(D, [drop_int(t, 2) for t in (2, -2, 1, -1)])
    with pytest.raises(rt.RNSRangeError):
        rt.drop(make([4], C, bound=4))  # B' = 3: 6 > 5
    # the check covers every step of a multi-drop
    E = rt.Basis((16, 5, 3))  # P = 240; drops 3 then 5
    D = rt.drop(make([100, -100], E, bound=100), 2)  # B' = 34 (68 < 80), B'' = 7 (14 = P'' - 2)
    assert D.active == (16,) and D.bound == 7 and D.scale.factor == 15
    check_holds(D, [drop_int(drop_int(t, 3), 5) for t in (100, -100)])
    rt.drop(make([110], E, bound=110), 1)  # B' = 37: 74 < 80
    with pytest.raises(rt.RNSRangeError, match="drop 2 of 2"):
        rt.drop(make([110], E, bound=110), 2)  # B'' = 37 // 5 + 1 = 8: 16 = P''


# ----- bad input: encode --------------------------------------------------------------------------------


def test_non_finite_count_and_first_index():
    x = np.ones((3, 4))
    x[1, 2] = np.nan
    x[2, 0] = np.inf
    x[2, 3] = -np.inf
    with pytest.raises(ValueError) as ei:
        rt.encode(x, 15)
    msg = str(ei.value)
    assert "3 non-finite" in msg and "(1, 2)" in msg
    y = np.zeros(5)
    y[3] = -np.inf
    with pytest.raises(ValueError) as ei:
        rt.encode(y, 15, shared_axes=())
    msg = str(ei.value)
    assert "1 non-finite" in msg and "(3,)" in msg
    with pytest.raises(ValueError, match="non-finite"):
        rt.encode(np.array([[1.0, np.nan]]), 15, shared_axes=(1,))
    with pytest.raises(ValueError, match="non-finite"):
        rt.encode(np.float32(np.inf), 15)
    assert not isinstance(ValueError("x"), rt.RNSRangeError)


@pytest.mark.parametrize(
    "x",
    [
        np.array([1 + 2j, 3.0]),
        np.array([1.0, 2.0], dtype=np.complex64),
        np.array([1.0, 2.0], dtype=object),
        np.array([1, 2], dtype=np.int64),
        np.array([1, 2], dtype=np.int8),
        np.array([1, 2], dtype=np.uint64),
        np.array([True, False]),
        [1, 2, 3],
        np.array(["1.0"]),
    ],
    ids=["complex128", "complex64", "object", "int64", "int8", "uint64", "bool", "list-of-int", "str"],
)
def test_wrong_dtype(x):
    with pytest.raises(TypeError) as ei:
        rt.encode(x, 15)
    assert "float" in str(ei.value)


def test_complex_hint():
    with pytest.raises(TypeError, match="real and imaginary"):
        rt.encode(np.array([1j]), 15)


@pytest.mark.skipif(np.dtype(np.longdouble).itemsize <= 8, reason="longdouble is float64 here")
def test_longdouble_refused():
    with pytest.raises(TypeError):
        rt.encode(np.ones(2, dtype=np.longdouble), 15)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_float_dtypes_accepted(dtype):
    T = rt.encode(np.array([1.5, -2.0], dtype=dtype), 15, bits=10)
    assert rt.decode(T, mode="exact").tolist() == [1.5, -2.0]


@pytest.mark.parametrize("x", [np.zeros((0,)), np.zeros((2, 0)), np.zeros((0, 3, 1)), []])
def test_empty(x):
    with pytest.raises(ValueError, match="empty"):
        rt.encode(x, 15)


@pytest.mark.parametrize("bits", [0, -1, True, 2.5, "8", None])
def test_bad_bits(bits):
    with pytest.raises((ValueError, TypeError), match="bits"):
        rt.encode(np.array([1.0]), 15, bits=bits)


@pytest.mark.parametrize("shared", [(2,), (-3,), (0, 0), (1, -1)])
def test_bad_shared_axes(shared):
    with pytest.raises(ValueError, match="shared_axes"):
        rt.encode(np.ones((2, 3)), 15, shared_axes=shared)


def test_bad_shared_axes_type():
    with pytest.raises(TypeError, match="shared_axes"):
        rt.encode(np.ones((2, 3)), 15, shared_axes=(0.5,))


@pytest.mark.parametrize("basis, exc", [("abc", TypeError), (2.5, TypeError), (None, TypeError), (0, ValueError),
                                        (50, ValueError), ((6, 4), ValueError), ((7, 7), ValueError)])
def test_bad_basis(basis, exc):
    with pytest.raises(exc):
        rt.encode(np.ones(2), basis, bits=1)


# ----- bad input: primitives -----------------------------------------------------------------------------


@pytest.fixture
def X():
    return rt.encode(np.arange(12.0).reshape(3, 4), 15, bits=20)


@pytest.fixture
def op():
    return rt.encode(np.ones((2, 4)), 15, bits=10, shared_axes=(1,))


@pytest.mark.parametrize("axis", [2, -3, 100])
def test_axis_out_of_range(X, op, axis):
    with pytest.raises(ValueError, match="out of range"):
        rt.mode_product(X, op, axis)


def test_axis_not_integer(X, op):
    with pytest.raises(TypeError, match="axis"):
        rt.mode_product(X, op, 1.0)


def test_operator_axis_size_mismatch(X, op):
    with pytest.raises(ValueError) as ei:
        rt.mode_product(X, op, 0)  # op has 4 columns, axis 0 has length 3
    assert "4" in str(ei.value) and "3" in str(ei.value)


def test_operator_not_2d(X):
    for shape in [(4,), (1, 2, 4)]:
        bad = rt.encode(np.ones(shape), 15, bits=10)
        with pytest.raises(ValueError, match="2-D"):
            rt.mode_product(X, bad, 1)


def test_operator_with_varying_column_exponents(X):
    bad = rt.encode(np.array([[1.0, 2.0**-20, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]), 15, bits=10, shared_axes=())
    with pytest.raises(ValueError, match="row"):
        rt.mode_product(X, bad, 1)
    cols = rt.encode(np.array([[1.0, 2.0**-20, 1.0, 1.0], [3.0, 1.0, 1.0, 1.0]]), 15, bits=10, shared_axes=(0,))
    with pytest.raises(ValueError, match="row"):
        rt.mode_product(X, cols, 1)


def test_tensor_exponents_varying_along_axis(op):
    T = rt.encode(np.arange(1.0, 13.0).reshape(3, 4), 15, bits=20, shared_axes=())
    with pytest.raises(ValueError, match="axis 1"):
        rt.mode_product(T, op, 1)
    T = rt.encode(np.arange(1.0, 13.0).reshape(3, 4) * [1, 2, 4, 1e3], 15, bits=20, shared_axes=(0,))
    with pytest.raises(ValueError):
        rt.mode_product(T, op, 1)  # per-column exponents = a pending scale on axis 1


def test_zero_d_tensor(op):
    with pytest.raises(ValueError, match="0-d"):
        rt.mode_product(rt.encode(1.0, 15), op, 0)


def test_different_bases(X):
    op_other = rt.encode(np.ones((2, 4)), 16, bits=10, shared_axes=(1,))
    with pytest.raises(ValueError, match="different bases"):
        rt.mode_product(X, op_other, 1)
    with pytest.raises(ValueError, match="different bases"):
        rt.hadamard(X, rt.encode(np.ones(4), 16, bits=10))
    Y = rt.encode(np.arange(12.0).reshape(3, 4), 16, bits=20)
    with pytest.raises(ValueError, match="different bases"):
        rt.add(X, Y)
    with pytest.raises(ValueError, match="different bases"):
        rt.sub(X, Y)
    Z = rt.encode(np.arange(12.0).reshape(3, 4), (7, 5, 3, 11, 13, 17, 19, 23, 29, 31), bits=20)
    with pytest.raises(ValueError, match="different bases"):
        rt.add(X, Z)


def test_not_tensors(X, op):
    arr = np.ones((2, 4))
    with pytest.raises(TypeError, match="RNSTensor"):
        rt.mode_product(arr, op, 1)
    with pytest.raises(TypeError, match="RNSTensor"):
        rt.mode_product(X, arr, 1)
    with pytest.raises(TypeError, match="RNSTensor"):
        rt.hadamard(X, arr)
    with pytest.raises(TypeError, match="RNSTensor"):
        rt.add(arr, X)
    with pytest.raises(TypeError, match="RNSTensor"):
        rt.drop(arr)
    with pytest.raises(TypeError, match="RNSTensor"):
        rt.base_extend(arr)
    with pytest.raises(TypeError, match="RNSTensor"):
        rt.decode(arr)


def test_hadamard_shapes(X):
    for shape in [(3,), (2, 4), (4, 3), (1, 3, 4), (3, 4, 1)]:
        F = rt.encode(np.ones(shape), 15, bits=4)
        with pytest.raises(ValueError, match="broadcast"):
            rt.hadamard(X, F)
    for shape in [(4,), (1, 4), (3, 1), (3, 4), (1,)]:
        rt.hadamard(X, rt.encode(np.ones(shape), 15, bits=4))


def test_hadamard_field_lacking_moduli(X):
    F = rt.drop(rt.encode(np.ones(4), 15, bits=4), 2)
    with pytest.raises(ValueError, match="base_extend"):
        rt.hadamard(X, F)


def test_add_mismatches(X):
    with pytest.raises(ValueError, match="same scale"):
        rt.add(X, rt.encode(np.arange(12.0).reshape(3, 4) * 4, 15, bits=20))
    with pytest.raises(ValueError, match="same scale"):
        rt.sub(X, rt.encode(np.arange(12.0).reshape(3, 4), 15, bits=21))
    with pytest.raises(ValueError, match="same scale"):
        rt.add(X, rt.encode(np.arange(12.0).reshape(3, 4), 15, bits=20, shared_axes=(1,)))
    with pytest.raises(ValueError, match="shape"):
        rt.add(X, rt.encode(np.arange(12.0).reshape(4, 3), 15, bits=20))
    with pytest.raises(ValueError, match="base_extend"):
        rt.add(X, rt.drop(X))
    D = rt.drop(X)
    with pytest.raises(ValueError, match="same scale"):
        rt.add(rt.base_extend(D), X)  # factor differs


@pytest.mark.parametrize("mode", ["exact64", "FP64", "Exact", None, 1, ""])
def test_decode_bad_mode(X, mode):
    with pytest.raises(ValueError, match="mode"):
        rt.decode(X, mode=mode)


@pytest.mark.parametrize("count", [15, 16, -1, True, 1.0, "1", None])
def test_drop_bad_count(X, count):
    with pytest.raises(ValueError, match="count"):
        rt.drop(X, count)


@pytest.mark.parametrize("moduli", [(7,), (256, 256), (255, 7), tuple(rt.int8_pool()[:15])])
def test_drop_bad_moduli(X, moduli):
    with pytest.raises(ValueError, match="moduli"):
        rt.drop(X, moduli=moduli)


def test_drop_count_limit_after_drops(X):
    D = rt.drop(X, 10)
    assert len(D.active) == 5
    with pytest.raises(ValueError, match="count"):
        rt.drop(D, 5)
    rt.drop(D, 4)


def test_fold_pending_bad_operator(X, op):
    Y = rt.mode_product(X, op, 1)
    with pytest.raises(ValueError, match="columns"):
        rt.fold_pending(Y, np.ones((2, 3)), 1)
    with pytest.raises(ValueError, match="columns"):
        rt.fold_pending(Y, np.ones(2), 1)
    with pytest.raises(ValueError, match="out of range"):
        rt.fold_pending(Y, np.ones((2, 2)), 2)


def test_errors_do_not_mutate_inputs(X, op):
    before = X.residues.copy()
    with pytest.raises(ValueError):
        rt.mode_product(X, op, 0)
    with pytest.raises(rt.RNSRangeError):
        rt.hadamard(X, rt.encode(np.ones(4), 15, bits=100))
    np.testing.assert_array_equal(X.residues, before)
    assert X.bound == 2**20 and X.active == rt.Basis.int8(15).moduli
    assert centered(5, 3) == -1
