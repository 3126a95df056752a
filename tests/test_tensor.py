"""RNSTensor and Scale: fields, invariants checked at construction, repr, the exact exponent."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from oracle import residues

import rnstensor as rt

FIG2 = rt.Basis((7, 5, 3))


def unit(nd):
    return rt.Scale.unit(nd)


# ----- Scale ----------------------------------------------------------------------------------


def test_scale_unit():
    s = rt.Scale.unit(3)
    assert s.exp2 == 0 and s.factor == 1 and s.axes == (None, None, None) and s.field is None
    assert s.exponent().shape == (1, 1, 1) and int(s.exponent().reshape(-1)[0]) == 0


def test_scale_exponent_combines_all_parts():
    s = rt.Scale(5, 3, (np.array([1, 2]), None, np.array([10, 20, 30, 40])), np.arange(6).reshape(1, 3, 2)[:, :, :1])
    e = np.broadcast_to(s.exponent(), (2, 3, 4))
    for i in range(2):
        for j in range(3):
            for k in range(4):
                assert e[i, j, k] == 5 + [1, 2][i] + [10, 20, 30, 40][k] + [0, 2, 4][j]


def test_scale_exact_python_ints():
    s = rt.Scale(np.int64(-7), np.int64(12))
    assert type(s.exp2) is int and type(s.factor) is int
    big = 3**200  # a product of dropped moduli may exceed int64
    s = rt.Scale(0, big, ())
    assert s.factor == big


@pytest.mark.parametrize("factor", [0, -3])
def test_scale_bad_factor(factor):
    with pytest.raises(ValueError, match="factor"):
        rt.Scale(0, factor, ())


def test_scale_frozen_and_arrays_read_only():
    vec = np.array([1, 2, 3])
    s = rt.Scale(0, 1, (vec,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.exp2 = 4
    with pytest.raises(ValueError):
        s.axes[0][0] = 7
    vec[0] = 99  # the Scale holds its own copy
    assert s.axes[0].tolist() == [1, 2, 3]
    assert s.axes[0].dtype == np.int64


def test_scale_replace_and_same_as():
    a = rt.Scale(2, 3, (np.array([1, 2]), None))
    b = a.replace(factor=15)
    assert b.factor == 15 and b.exp2 == 2 and b.axes[0].tolist() == [1, 2] and a.factor == 3
    assert a.same_as(rt.Scale(2, 3, (np.array([1, 2]), None)))
    assert not a.same_as(b)
    assert not a.same_as(a.replace(exp2=3))
    assert not a.same_as(rt.Scale(2, 3, (np.array([1, 3]), None)))
    assert not a.same_as(rt.Scale(2, 3, (None, None)))
    assert not a.same_as(rt.Scale(2, 3, (np.array([1, 2]), None, None)))
    f = np.zeros((1, 2), dtype=np.int64)
    assert not a.same_as(a.replace(field=f))
    assert a.replace(field=f).same_as(a.replace(field=f.copy()))
    assert not a.replace(field=f).same_as(a.replace(field=f + 1))


def test_scale_repr():
    r = repr(rt.Scale(-3, 7, (np.array([1]), None)))
    assert "2^-3" in r and "pending axes [0]" in r


# ----- RNSTensor --------------------------------------------------------------------------------


def test_fields_and_shape():
    v = np.array([[12, -5, 0], [52, -52, 1]], dtype=object)
    R = residues(v, FIG2.moduli)
    T = rt.RNSTensor(R, FIG2, (7, 5, 3), 52, unit(2))
    assert T.residues is R
    assert T.basis == FIG2 and T.active == (7, 5, 3) and T.bound == 52
    assert T.shape == (2, 3) and T.ndim == 2 and T.size == 6
    assert T.active_product == 105
    assert T.log2_bound == pytest.approx(math.log2(52))
    assert T.log2_range == pytest.approx(math.log2(105 / 2))
    np.testing.assert_array_equal(T.plane(5), R[1])
    T.validate()


def test_repr_mentions_s_shape_bound_range():
    T = rt.encode(np.ones((2, 3)), 15, bits=53)
    r = repr(T)
    assert "s=15" in r and "(2, 3)" in r and "53.0" in r and f"{math.log2(rt.Basis.int8(15).product) - 1:.1f}" in r
    D = rt.drop(T, 2)
    assert "s=13" in repr(D)


def test_active_subset_in_basis_order():
    R = residues(np.array([3, -4], dtype=object), (7, 3))
    T = rt.RNSTensor(R, FIG2, (7, 3), 4, unit(1))
    assert T.active == (7, 3) and T.active_product == 21
    with pytest.raises(ValueError, match="basis order"):
        rt.RNSTensor(R, FIG2, (3, 7), 4, unit(1))
    with pytest.raises(ValueError, match="members of the basis"):
        rt.RNSTensor(R, FIG2, (7, 11), 4, unit(1))
    with pytest.raises(ValueError):
        rt.RNSTensor(residues(np.array([1], dtype=object), (7, 7)), FIG2, (7, 7), 1, unit(1))


def test_bound_limit_at_construction():
    R = np.zeros((3, 2), dtype=np.int8)
    rt.RNSTensor(R, FIG2, FIG2.moduli, 52, unit(1))  # 2*52 = 104 = P - 1
    with pytest.raises(rt.RNSRangeError):
        rt.RNSTensor(R, FIG2, FIG2.moduli, 53, unit(1))  # 106 > 105
    B = rt.Basis((8, 5, 3))  # P = 120
    rt.RNSTensor(R, B, B.moduli, 59, unit(1))  # 118 = P - 2
    with pytest.raises(rt.RNSRangeError):
        rt.RNSTensor(R, B, B.moduli, 60, unit(1))  # 120 = P
    with pytest.raises(ValueError, match=">= 0"):
        rt.RNSTensor(R, B, B.moduli, -1, unit(1))


def test_constructor_type_checks():
    R = np.zeros((3, 2), dtype=np.int8)
    with pytest.raises(TypeError, match="Basis"):
        rt.RNSTensor(R, (7, 5, 3), (7, 5, 3), 1, unit(1))
    with pytest.raises(TypeError, match="int8"):
        rt.RNSTensor(R.astype(np.int16), FIG2, (7, 5, 3), 1, unit(1))
    with pytest.raises(TypeError, match="int8"):
        rt.RNSTensor(R.tolist(), FIG2, (7, 5, 3), 1, unit(1))
    with pytest.raises(ValueError, match="plane"):
        rt.RNSTensor(R[:2], FIG2, (7, 5, 3), 1, unit(1))
    with pytest.raises(ValueError, match="axes"):
        rt.RNSTensor(R, FIG2, (7, 5, 3), 1, unit(2))


def test_validate_catches_out_of_range_residues():
    R = np.zeros((3, 2), dtype=np.int8)
    R[2, 1] = 2  # modulus 3: centered range [-1, 1]
    T = rt.RNSTensor(R, FIG2, (7, 5, 3), 1, unit(1))
    with pytest.raises(ValueError, match="modulus 3"):
        T.validate()
    R[2, 1] = -1
    R[0, 0] = -4  # modulus 7: [-3, 3]
    with pytest.raises(ValueError, match="modulus 7"):
        rt.RNSTensor(R, FIG2, (7, 5, 3), 1, unit(1)).validate()
    R[0, 0] = 3
    R[1, 0] = -2  # modulus 5: [-2, 2]
    rt.RNSTensor(R, FIG2, (7, 5, 3), 1, unit(1)).validate()


@pytest.mark.parametrize("s", [1, 2, 15, 49])
def test_centered_interval_of_every_modulus(s):
    """Encoded residues stay in [-floor(p/2), ceil(p/2) - 1] and fit int8, for all moduli."""
    B = rt.Basis.int8(s)
    x = np.linspace(-1, 1, 257)
    T = rt.encode(x, B, bits=min(40, B.product.bit_length() - 3), shared_axes=())
    T.validate()
    for i, p in enumerate(B.moduli):
        assert T.residues[i].min() >= -(p // 2) and T.residues[i].max() <= (p + 1) // 2 - 1
