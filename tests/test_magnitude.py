"""The default GEMM width's measured magnitudes: a rigorous lower bound, and one choice of moduli on every device.

Exact oracle: the ratio of the shared float32 inputs in Fractions. The float32
GEMM is replaced by other summation orders (and a flush of subnormal results)
to stand for other devices, thread counts and Dask chunkings.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import rnstensor as rt
from rnstensor import gemm as G
from rnstensor import gemm_accuracy as GA
from rnstensor import magnitude as M
from rnstensor.backends import cpu_gemm
from rnstensor.encode import _NONE
from rnstensor.run.policy import default_target


def _stats(A, B):
    return G.group_stats(A, 1, False), G.group_stats(B, 0, False)


def _exact_ratio(A, Ea, B, Eb, k):
    """min_ij of sum_p low32_ip low32_pj / (rA_i + cB_j) in Fractions, from the inputs measure_ratio forms."""
    a32, a_up, _ = M._scaled(A.copy(), Ea, 1, k, np)
    b32, b_up, _ = M._scaled(B.copy(), Eb, 0, k, np)
    best = None
    for i in range(A.shape[0]):
        if Ea[i] == _NONE:
            continue
        ra = sum(Fraction(float(v)) for v in a_up[i])
        for j in range(B.shape[1]):
            if Eb[j] == _NONE:
                continue
            num = sum(Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a32[i], b32[:, j]))
            r = num / (ra + sum(Fraction(float(v)) for v in b_up[:, j]))
            best = r if best is None else min(best, r)
    return best


def _other_order(a, b):
    """Another device's SGEMM: the contraction summed backwards in four blocks, subnormal results flushed."""
    parts = np.array_split(np.arange(a.shape[1])[::-1], 4)
    r = sum(a[:, p] @ b[p, :] for p in parts)
    r[np.abs(r) < np.finfo(np.float32).tiny] = 0
    return r.astype(np.float32)


@pytest.mark.parametrize("data", ["phi4", "phi2"])
def test_measured_and_settled_ratios_are_rigorous_and_close(data):
    A, B = GA.gemm_dataset(data, 6, 200, 5, seed=3)
    (_, Ea, _, _), (_, Eb, _, _) = _stats(A, B)
    m = M.measure_ratio(A.copy(), Ea, B.copy(), Eb)
    exact = _exact_ratio(A, Ea, B, Eb, 200)
    settled = m.settle()
    assert Fraction(m.value) <= exact and Fraction(settled) <= exact
    assert abs(m.value / float(exact) - 1) < 2 * m.spread
    assert 1 - 2.0**-45 < settled / float(exact) <= 1


def test_settled_ratio_does_not_depend_on_the_summation_order(monkeypatch):
    rng = np.random.default_rng(2)  # many terms of like size in every entry: their float32 sums round by order
    A, B = rng.uniform(0.5, 1, (9, 333)) / 3, rng.uniform(0.5, 1, (333, 7)) / 3
    (_, Ea, _, _), (_, Eb, _, _) = _stats(A, B)
    here = M.measure_ratio(A.copy(), Ea, B.copy(), Eb)
    monkeypatch.setattr(cpu_gemm, "threaded_matmul", _other_order)
    there = M.measure_ratio(A.copy(), Ea, B.copy(), Eb)
    assert here.value != there.value  # the measurement's last bits follow the order ...
    assert here.settle() == there.settle()  # ... the settled value does not
    assert abs(here.value / there.value - 1) < 2 * here.spread


def test_subnormal_magnitudes_are_flushed_alike():
    # entries 2**-140 below their row's largest: subnormal in float32, zero on every device
    A = np.array([[1.0, 2.0**-140, 2.0**-140], [0.5, 0.25, 2.0**-141]])
    B = np.array([[1.0, 2.0**-139], [1.0, 1.0], [2.0**-130, 1.0]])
    (_, Ea, _, _), (_, Eb, _, _) = _stats(A, B)
    a32, _, _ = M._scaled(A.copy(), Ea, 1, 3, np)
    assert a32[0, 1] == 0 and a32[0, 2] == 0 and a32[1, 0] > 0
    m = M.measure_ratio(A.copy(), Ea, B.copy(), Eb)
    assert Fraction(m.value) <= _exact_ratio(A, Ea, B, Eb, 3)


def _threshold(k, t):
    """The least float ratio that _measured_fits accepts at width t under the default's target (bisection on the float
    line)."""
    budget = G.encoding_budget(k, False, default_target(k))
    lo, hi = 0.0, 1.0
    assert G._measured_fits(k, t, False, hi, budget)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if G._measured_fits(k, t, False, mid, budget) else (mid, hi)
    return hi


def test_devices_near_a_threshold_agree_on_the_moduli():
    # two devices measure the same data a few ulps apart, on either side of the ratio a width needs: each alone
    # would choose differently; both take the settled ratio, so the same moduli
    k = 256
    A, B = GA.gemm_dataset("phi4", 8, k, 6, seed=2)
    sa, sb = _stats(A, B)
    s_data = rt.gemm_moduli(A, B)
    t = G.gemm_width(s_data, k)
    need = _threshold(k, t)
    spread = 2.0**-20
    settled = need * (1 - 2.0**-30)  # what every device settles on: just below, so one modulus more
    low = M.MeasuredRatio(need * (1 - spread / 4), spread, lambda: settled)
    high = M.MeasuredRatio(need * (1 + spread / 4), spread, lambda: settled)
    alone = [G.classical_moduli(k, False, sa, sb, magnitudes_of=lambda r=r: M.MeasuredRatio(r.value, 0.0, r.settle))
             for r in (low, high)]
    assert alone[0] != alone[1]  # without the agreement, the last bits would decide
    agreed = [G.classical_moduli(k, False, sa, sb, magnitudes_of=lambda r=r: r) for r in (low, high)]
    assert agreed[0] == agreed[1] == alone[0]
    # far from every threshold the measurement decides alone, and settle() is never asked
    def refuse():
        raise AssertionError("settle() asked away from a threshold")

    far = M.MeasuredRatio(need * 1.5, spread, refuse)
    assert G.classical_moduli(k, False, sa, sb, magnitudes_of=lambda: far) == alone[1]


def test_too_many_near_minimal_entries_leave_the_choice_to_the_spreads(monkeypatch):
    A = np.ones((12, 40))  # every entry of |A||B| ties
    A[:, ::2] = 2.0**-60
    B = np.ones((40, 12))
    (_, Ea, _, _), (_, Eb, _, _) = _stats(A, B)
    m = M.measure_ratio(A.copy(), Ea, B.copy(), Eb)
    monkeypatch.setattr(M, "SETTLE_MAX_ENTRIES", 143)
    assert m.settle() is None  # 144 tied entries
    monkeypatch.setattr(M, "SETTLE_MAX_ENTRIES", 144)
    assert Fraction(m.settle()) <= _exact_ratio(A, Ea, B, Eb, 40)
