"""Basis: the INT8 moduli pool, Basis.int8(s), custom bases, validation, equality."""

from __future__ import annotations

import math

import numpy as np
import pytest
from oracle import pairs

import rnstensor as rt

DESIGN_FIRST_15 = (256, 255, 253, 251, 247, 241, 239, 233, 229, 227, 223, 217, 211, 199, 197)


# ----- the pool -------------------------------------------------------------------------------


def test_pool_is_greedy_descending_coprime():
    pool = rt.int8_pool()
    assert isinstance(pool, tuple) and all(type(p) is int for p in pool)
    assert len(pool) == 49
    assert pool[0] == 256
    assert all(2 <= p <= 256 for p in pool)
    assert all(pool[i] > pool[i + 1] for i in range(len(pool) - 1)), "strictly descending"
    for a, b in pairs(pool):
        assert math.gcd(a, b) == 1, (a, b)
    kept = set(pool)
    # greedy: every number left out shares a factor with a kept *larger* number
    for n in range(2, 257):
        if n not in kept:
            assert any(m > n and math.gcd(m, n) > 1 for m in pool), n
    # ... and every kept number is coprime to all larger kept ones (so greedy would keep it)
    for i, m in enumerate(pool):
        assert all(math.gcd(m, k) == 1 for k in pool[:i])


def test_pool_first_values_and_products():
    pool = rt.int8_pool()
    assert pool[:15] == DESIGN_FIRST_15
    assert math.log2(math.prod(pool[:15])) == pytest.approx(117.8, abs=0.05)
    log2_all = math.log2(math.prod(pool))
    assert 341.5 < log2_all < 342.5
    # exactly one even modulus: 256 (all others must be odd to be coprime to it)
    assert [p for p in pool if p % 2 == 0] == [256]


def test_pool_contains_all_primes_up_to_256_but_2():
    pool = set(rt.int8_pool())
    primes = [n for n in range(3, 257) if all(n % d for d in range(2, int(n**0.5) + 1))]
    # a prime is left out only if a larger kept number is a multiple of it
    for p in primes:
        if p not in pool:
            assert any(m % p == 0 for m in pool if m > p), p


@pytest.mark.parametrize("s", range(1, 50))
def test_int8_s(s):
    B = rt.Basis.int8(s)
    pool = rt.int8_pool()
    assert B.moduli == pool[:s]
    assert len(B) == s
    assert B.product == math.prod(pool[:s])
    assert type(B.product) is int
    assert B.log2_product == pytest.approx(math.log2(math.prod(pool[:s])), rel=1e-12)
    assert tuple(iter(B)) == B.moduli
    assert rt.Basis.int8(np.int64(s)) == B


def test_int8_cached_and_equal():
    assert rt.Basis.int8(15) is rt.Basis.int8(15)
    assert rt.Basis.int8(15) == rt.Basis(DESIGN_FIRST_15)
    assert hash(rt.Basis.int8(15)) == hash(rt.Basis(DESIGN_FIRST_15))


@pytest.mark.parametrize("s", [0, 50, -1, 100, 1.0, 15.0, "15", None, True, False])
def test_int8_bad_s(s):
    with pytest.raises(ValueError, match="1..49"):
        rt.Basis.int8(s)


# ----- custom bases ---------------------------------------------------------------------------


def test_custom_basis_fig2():
    B = rt.Basis((7, 5, 3))
    assert B.moduli == (7, 5, 3)
    assert B.product == 105
    assert len(B) == 3
    assert rt.Basis([7, 5, 3]) == B
    assert rt.Basis(iter([7, 5, 3])) == B
    assert rt.Basis((np.int64(7), np.int32(5), np.uint8(3))).moduli == (7, 5, 3)
    assert all(type(p) is int for p in rt.Basis((np.int64(7), np.int32(5))).moduli)


def test_custom_basis_order_matters():
    assert rt.Basis((7, 5, 3)) != rt.Basis((3, 5, 7))
    assert rt.Basis((3, 5, 7)).moduli == (3, 5, 7)


def test_single_modulus_and_extremes():
    assert rt.Basis((2,)).product == 2
    assert rt.Basis((256,)).product == 256
    assert rt.Basis((256, 255)).product == 256 * 255


def test_equality_and_hash():
    a, b, c = rt.Basis((7, 5, 3)), rt.Basis((7, 5, 3)), rt.Basis((7, 5))
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert a != (7, 5, 3)
    assert len({a, b, c}) == 2
    d = {a: 1}
    assert d[b] == 1


def test_immutable():
    B = rt.Basis((7, 5, 3))
    with pytest.raises(AttributeError):
        B.moduli = (2, 3)
    with pytest.raises(AttributeError):
        B.product = 6


def test_repr():
    r = repr(rt.Basis.int8(15))
    assert "s=15" in r and "256" in r and "117.8" in r
    assert "(7, 5, 3)" in repr(rt.Basis((7, 5, 3)))


@pytest.mark.parametrize(
    "moduli, names",
    [
        ((7, 1, 3), ["1"]),
        ((7, 257, 3), ["257"]),
        ((0, 5), ["0"]),
        ((-3, 5), ["-3"]),
        ((300, 5, 1000), ["300", "1000"]),
    ],
)
def test_out_of_range(moduli, names):
    with pytest.raises(ValueError, match="2..256") as ei:
        rt.Basis(moduli)
    for n in names:
        assert n in str(ei.value)


def test_duplicates():
    with pytest.raises(ValueError, match="duplicate") as ei:
        rt.Basis((7, 5, 7, 3))
    assert "7" in str(ei.value)


@pytest.mark.parametrize(
    "moduli, pair",
    [
        ((6, 5, 4), ("6", "4")),
        ((7, 9, 15), ("9", "15")),
        ((256, 255, 254), ("256", "254")),
        ((11, 13, 143), ("11", "143")),
    ],
)
def test_not_coprime_names_pair(moduli, pair):
    with pytest.raises(ValueError, match="coprime") as ei:
        rt.Basis(moduli)
    msg = str(ei.value)
    for n in pair:
        assert n in msg


@pytest.mark.parametrize("moduli", [(7.0, 5, 3), (7, "5", 3), (7, None), (True, 3), (7, 5.5), (np.float64(7), 5)])
def test_non_integers(moduli):
    with pytest.raises(ValueError, match="integer"):
        rt.Basis(moduli)


@pytest.mark.parametrize("moduli", [(), [], iter(())])
def test_empty(moduli):
    with pytest.raises(ValueError, match="empty|at least one"):
        rt.Basis(moduli)


# ----- the exact tables ------------------------------------------------------------------------


@pytest.mark.parametrize("s", [2, 5, 15, 49])
def test_inverse_table(s):
    B = rt.Basis.int8(s)
    inv = B.inverse_table()
    for i, q in enumerate(B.moduli):
        for j, p in enumerate(B.moduli):
            if i == j:
                assert inv[i, j] == 0
            else:
                assert 0 <= inv[i, j] < p and (int(inv[i, j]) * q) % p == 1


@pytest.mark.parametrize(
    "moduli, active", [((7, 5, 3), (7, 5)), ((7, 5, 3), (5, 3)), (rt.int8_pool()[:9], rt.int8_pool()[:9])]
)
def test_mrc_tables(moduli, active):
    B = rt.Basis(moduli)
    t = B.mrc_tables(active)
    evens = [p for p in active if p % 2 == 0]
    assert t.order == tuple(evens) + tuple(p for p in active if p % 2)
    assert sorted(t.order) == sorted(active)
    assert tuple(active[i] for i in t.perm) == t.order
    w = 1
    for i, q in enumerate(t.order):
        for j in range(i + 1, len(t.order)):
            assert (int(t.inv[i, j]) * q) % t.order[j] == 1
        for k, p in enumerate(B.moduli):
            assert t.radix_mod[i, k] == w % p
        w *= q


def test_pow2_table():
    B = rt.Basis((7, 5, 3, 256))
    t = B.pow2_table(40)
    for i, p in enumerate(B.moduli):
        for k in range(41):
            assert t[i, k] == pow(2, k, p)


def test_one_accepted_range_of_moduli_counts():
    """Basis.int8, plan_chain, einsum and the GEMMs take the same counts (1..49) with the same message."""
    ops = [np.eye(2)]
    calls = [
        lambda s: rt.Basis.int8(s),
        lambda s: rt.plan_chain(ops, [0], moduli=s),
        lambda s: rt.einsum("ij,j->i", np.eye(2), np.ones(2), moduli=s),
        lambda s: rt.dgemm(np.eye(2), np.eye(2), moduli=s),
        lambda s: rt.zgemm(np.eye(2) + 0j, np.eye(2) + 0j, moduli=s),
    ]
    for call in calls:
        for bad in (0, 50, -1):
            with pytest.raises(ValueError, match=r"number of INT8 moduli.*1\.\.49"):
                call(bad)
        for bad in (True, 2.5):  # not a count at all (encode's basis says TypeError, the GEMMs ValueError)
            with pytest.raises((TypeError, ValueError), match="moduli"):
                call(bad)
        assert call(49) is not None  # the whole pool
        try:
            call(1)  # a count in range: whether one modulus holds the computation is the plan's answer
        except (rt.PlanError, rt.RNSRangeError) as e:
            assert "bits" in str(e) or "moduli" in str(e)
