"""The planner: DropPlan ([2610.05059] Alg. 2), effective operators, the method planners and Table 2.

Every expectation is either worked by hand in a comment or computed by the
independent oracles of ``chain_oracle`` (Alg. 2 and the row encoding written
out again with Python ints).
"""

from __future__ import annotations

import functools

import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rnstensor as rt
from rnstensor.planner import drop_plan, prepare_operators

from chain_oracle import alg2, alg2_trace, effective_rhos, encode_rows, dyadic, first_visit_rho, hand_plan


# the papers' methods at any width: these tests check plans that keep fewer than min_bits bits
# this module reproduces [2610.05059] Alg. 2 and Table 2: its plans are the greedy planner's unless a test asks
# for another (a later keyword wins over a partial's)
plan_greedy = functools.partial(rt.plan_chain, planner="greedy")
plan_any = functools.partial(rt.plan_chain, min_bits=0, planner="greedy")

S15 = rt.Basis.int8(15)


def table2_ops(d: int, seed: int = 0, n: int = 8):
    rng = np.random.default_rng(seed)  # a fresh generator per depth, as in [2610.05059] Sec. 6.2.1
    return [rng.uniform(-1, 1, (n, n)) for _ in range(d)]


def cycling(d: int):
    return [i % 3 for i in range(d)]


# ----- DropPlan (Alg. 2) on small bases, worked by hand --------------------------------------

# (b, rhos, moduli, restore, expected)
HAND_CASES = [
    # B = 16 -> 48 (96 < 105); 48 // 3 = 16 >= 16: B' = 17, 34 < 35: drop 3; 17 // 5 = 3 < 16: stop.
    # restored: 17 * 2 = 34, 68 < 105.
    (4, [3, 2], (7, 5, 3), True, (1, 0)),
    # B = 4 -> 28; 28 // 3 = 9 >= 4: B' = 10 (20 < 35); 10 // 5 = 2 < 4. Restored: 10 * 7 = 70, 140 >= 105: fail.
    (2, [7, 7], (7, 5, 3), True, None),
    # same without restoration: 70 against P_L = 35 fails as well
    (2, [7, 7], (7, 5, 3), False, None),
    # B = 2 -> 52 (104 < 105); 52 // 3 = 17 >= 2 but B' = 18, 36 >= 105 / 3 = 35: the drop check fails
    (1, [26, 1], (7, 5, 3), True, None),
    # B = 2 -> 40; drop 3: B' = 14 (28 < 35); drop 5: 14 // 5 = 2 >= 2, B' = 3 (6 < 7); one modulus left: stop
    (1, [20, 1], (7, 5, 3), True, (2, 0)),
    (1, [20, 1], (7, 5, 3), False, (2, 0)),  # 3 * 1 = 3, 6 < 7 on the one modulus left
    # P = 1155. B = 8 -> 80; drop 3: 80 // 3 = 26, B' = 27 (54 < 385); 27 // 5 = 5 < 8.
    # restored: 27 * 4 = 108; drop 3: B' = 37 (74 < 385); 37 // 5 = 7 < 8. Last: 37 * 6 = 222, 444 < 1155.
    (3, [10, 4, 6], (11, 7, 5, 3), True, (1, 1, 0)),
    # not restored: 108 (216 < 385); drop 5: 108 // 5 = 21, B' = 22 (44 < 77); 22 // 7 = 3 < 8.
    # last: 22 * 6 = 132, 264 >= 77: fail
    (3, [10, 4, 6], (11, 7, 5, 3), False, None),
    (3, [10, 4, 1], (11, 7, 5, 3), False, (1, 1, 0)),  # last: 22, 44 < 77
    # a single product never drops: 2 * 32 * 18 = 1152 < 1155
    (5, [18], (11, 7, 5, 3), True, (0,)),
    (5, [19], (11, 7, 5, 3), True, None),  # 1216 >= 1155
    # the product check alone: 2 * 2**3 * 73 = 1168 >= 1155
    (3, [73], (11, 7, 5, 3), True, None),
    # Basis.int8(4) = (256, 255, 253, 251): B = 2**28; drop 251: 1069463 >= 256, B' = 1069464;
    # drop 253: 4227 >= 256, B' = 4228; 4228 // 255 = 16 < 256: stop. 4228 * 1024 fits.
    (8, [2**20, 2**10], (256, 255, 253, 251), True, (2, 0)),
]


@pytest.mark.parametrize("b, rhos, moduli, restore, expected", HAND_CASES)
def test_drop_plan_hand_cases(b, rhos, moduli, restore, expected):
    assert alg2(b, rhos, moduli, 1 if restore else 0) == expected  # the oracle agrees with the hand work
    got = drop_plan(b, rhos, rt.Basis(moduli), restore=restore)
    assert got == expected
    if got is not None:
        assert isinstance(got, tuple) and got[-1] == 0


def test_drop_plan_basis_order_is_irrelevant():
    # Alg. 2 drops the smallest modulus whatever the plane order of the basis
    for moduli in [(3, 5, 7), (5, 7, 3), (7, 5, 3)]:
        assert drop_plan(1, [20, 1], rt.Basis(moduli), restore=True) == (2, 0)
    assert drop_plan(8, [2**20, 2**10], rt.Basis.int8(4), restore=True) == (2, 0)


SMALL_BASES = [(7, 5, 3), (11, 7, 5, 3), (13, 11, 7, 5, 3), rt.Basis.int8(4).moduli, rt.Basis.int8(6).moduli]


@given(
    basis=st.sampled_from(SMALL_BASES),
    data=st.data(),
    restore=st.booleans(),
)
def test_drop_plan_matches_alg2(basis, data, restore):
    logp = math.log2(math.prod(basis))
    b = data.draw(st.integers(1, max(1, int(logp) - 2)), label="b")
    d = data.draw(st.integers(1, 6), label="d")
    top = max(2, int(2 ** min(logp - b, 40)))
    rhos = data.draw(st.lists(st.integers(1, top), min_size=d, max_size=d), label="rhos")
    want = alg2(b, rhos, basis, 1 if restore else 0)
    got = drop_plan(b, rhos, rt.Basis(basis), restore=restore)
    assert got == want
    if got is not None:
        assert len(got) == d and got[-1] == 0


def test_drop_plan_feasible_and_infeasible_are_both_exercised():
    # guard against a vacuous property test: the random space has both outcomes
    outs = [alg2(b, [r] * 3, (11, 7, 5, 3), t) for b in (1, 2, 3) for r in (2, 5, 9, 20) for t in (0, 1)]
    assert any(o is None for o in outs) and any(o is not None and sum(o) > 0 for o in outs)


# ----- effective operators (Sec. 5.2) and rho(b) -----------------------------------------------


def _wide_operator(rng, shape, span=30):
    A = rng.uniform(-1, 1, shape)
    rows = rng.integers(-span, span + 1, shape[0])
    cols = rng.integers(-span, span + 1, shape[1])
    return np.ldexp(np.ldexp(A, rows[:, None].astype(np.int32)), cols[None, :].astype(np.int32))


@pytest.mark.parametrize("bits", [3, 20, 53, 60])
def test_prepared_operators_match_hand_encoding(bits):
    rng = np.random.default_rng(7)
    ops = [
        _wide_operator(rng, (5, 8)),
        rng.uniform(-1, 1, (6, 4)),
        _wide_operator(rng, (8, 5)),  # revisits axis 0: folds the pending scales of ops[0]
        _wide_operator(rng, (3, 8)),  # and again
        rng.uniform(-1, 1, (6, 6)),  # revisits axis 1
    ]
    ops[2][1, :] = 0.0  # an all-zero row encodes as zeros with exponent 0
    axes = [0, 1, 0, 0, 1]
    prepared = prepare_operators(ops, axes, bits)
    assert [p.rho for p in prepared] == effective_rhos(ops, axes, bits)
    # the integers and row exponents, step by step (first visits only need no folding)
    pending: dict = {}
    for A, ax, p in zip(ops, axes, prepared):
        pend = pending.get(ax)
        rows = []
        for j in range(A.shape[0]):
            row = []
            for k in range(A.shape[1]):
                n, t = dyadic(A[j, k])
                if pend is not None:
                    t -= pend[k] - max(pend)
                row.append((n, t))
            rows.append(row)
        ints, exps = encode_rows(rows, bits)
        assert [[int(v) for v in r] for r in p.ints] == ints
        assert [int(e) for e in np.ravel(p.row_exponents)] == exps
        assert p.axis == ax
        pending[ax] = [-e for e in exps]
        assert max(sum(abs(v) for v in r) for r in ints) <= A.shape[1] * 2**bits


def test_effective_operator_differs_from_plain_encoding_on_revisit():
    # a revisit with very different pending row scales changes the integers: the folding is real
    rng = np.random.default_rng(3)
    A1 = np.ldexp(rng.uniform(0.5, 1, (4, 4)), np.array([[0], [10], [20], [30]], dtype=np.int32))
    A2 = rng.uniform(-1, 1, (4, 4))
    prepared = prepare_operators([A1, A2], [0, 0], 20)
    assert prepared[1].rho == effective_rhos([A1, A2], [0, 0], 20)[1]
    assert prepared[1].rho != first_visit_rho(A2, 20)


# ----- the method planners: [2610.05059] Table 2 --------------------------------------------------

TABLE2_B = {3: 27, 4: 21, 5: 17, 6: 14, 7: 12, 8: 10}


@pytest.mark.parametrize("d", range(3, 9))
def test_table2_seed0(d):
    ops, axes = table2_ops(d), cycling(d)
    nr = plan_any(ops, axes, moduli=15, method="norescale")
    rs = plan_any(ops, axes, moduli=15, method="rescale")
    be = plan_any(ops, axes, moduli=15, method="rescale_be")
    co = plan_any(ops, axes, moduli=15, method="composed")
    assert nr.bits == TABLE2_B[d] and nr.drops == (0,) * d
    assert rs.bits == TABLE2_B[d]
    assert co.bits == 53 and co.drops == (0,) * d
    assert be.bits == 53
    want = (7,) * (d - 1) + (0,) if d <= 7 else (7, 7, 7, 7, 7, 7, 8, 0)
    assert be.drops == want
    # default method is rescale_be on 15 moduli
    default = plan_any(ops, axes)
    assert (default.method, default.bits, default.drops) == ("rescale_be", 53, want)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_table2_against_hand_planner(seed):
    moduli = S15.moduli
    for d in range(3, 9):
        ops, axes = table2_ops(d, seed), cycling(d)
        cache: dict = {}
        for method in ("norescale", "rescale", "rescale_be", "composed"):
            plan = plan_any(ops, axes, method=method)
            want_b, want_g = hand_plan(method, ops, axes, moduli, cache)
            assert (plan.bits, plan.drops) == (want_b, want_g), (seed, d, method)
            # the paper's b values are robust to the operator draw
            if method in ("norescale", "rescale"):
                assert plan.bits == TABLE2_B[d]
            else:
                assert plan.bits == 53


def test_table2_drop_count_depends_on_draw_at_depth_8():
    # the (7,...,7,8,0) at d = 8 is a property of the draw: seed 3 gives seven everywhere, and Alg. 2 says so
    ops = table2_ops(8, 3)
    rhos = effective_rhos(ops, cycling(8), 53)
    assert alg2(53, rhos, S15.moduli, 1) == (7,) * 7 + (0,)
    assert plan_greedy(ops, cycling(8)).drops == (7,) * 7 + (0,)


@pytest.mark.parametrize("moduli", [rt.Basis.int8(3), rt.Basis.int8(5), rt.Basis((13, 11, 7, 5, 3, 2)), 8])
@pytest.mark.parametrize("method", ["norescale", "rescale", "rescale_be", "composed"])
def test_plan_bits_on_small_bases(moduli, method):
    rng = np.random.default_rng(11)
    ops = [rng.uniform(-1, 1, (4, 4)) for _ in range(4)]
    axes = [0, 1, 0, 1]
    basis = moduli if isinstance(moduli, rt.Basis) else rt.Basis.int8(moduli)
    want = hand_plan(method, ops, axes, basis.moduli)
    plan = plan_any(ops, axes, moduli=moduli, method=method)
    assert plan.basis == basis
    assert (plan.bits, plan.drops) == want


# ----- plan attributes and describe() --------------------------------------------------------------


def _numbers(line: str) -> list[float]:
    return [float(t) for t in re.findall(r"-?\d+(?:\.\d+)?", line)]


@pytest.mark.parametrize("method", ["rescale_be", "rescale", "norescale"])
def test_plan_attributes_and_describe(method, capsys):
    d = 8
    ops, axes = table2_ops(d), cycling(d)
    plan = plan_any(ops, axes, method=method)
    assert plan.method == method and plan.planner == "greedy"
    assert isinstance(plan.bits, int) and isinstance(plan.drops, tuple)
    assert len(plan.drops) == d and plan.drops[-1] == 0
    assert all(isinstance(g, int) for g in plan.drops)
    assert plan.axes == tuple(axes) and plan.ndim == 3 and plan.input_bits == plan.bits
    rhos = effective_rhos(ops, axes, plan.bits)
    tau = 1 if method == "rescale_be" else 0
    if method == "norescale":
        trace, B, P = [], 1 << plan.bits, S15.product
        for r in rhos:
            trace.append((B, B * r, 0, B * r, P, P))
            B *= r
    else:
        trace = alg2_trace(plan.bits, rhos, S15.moduli, tau)
    text = plan.describe()
    assert capsys.readouterr().out == ""  # it returns the text (a REPL shows it once); it prints nothing
    lines = [ln for ln in text.splitlines() if re.match(r"^\s*\d+\s", ln)]
    assert len(lines) == d  # one line per step
    assert str(plan.bits) in text.splitlines()[0]
    for i, (ln, (before, prod, g, after, pl_prod, pl_after)) in enumerate(zip(lines, trace)):
        nums = _numbers(ln)
        assert nums[0] == i + 1 and nums[1] == axes[i]
        assert g == plan.drops[i]

        def has(v, tol=0.006):
            return any(abs(x - v) <= tol for x in nums)

        assert has(math.log2(before)), (ln, math.log2(before))
        assert has(math.log2(prod)), (ln, math.log2(prod))
        assert has(math.log2(after)), (ln, math.log2(after))
        assert any(x == g and float(x).is_integer() for x in nums)
        # the range: log2 P_L (or the half range P_L / 2 that the bound must stay below)
        assert has(math.log2(pl_prod)) or has(math.log2(pl_prod) - 1), ln
        assert has(math.log2(pl_after)) or has(math.log2(pl_after) - 1), ln
    # the bound never reaches the range
    for before, prod, g, after, pl_prod, pl_after in trace:
        assert 2 * prod < pl_prod and 2 * after < pl_after


def test_describe_rectangular_shapes_and_file():
    import io

    rng = np.random.default_rng(0)
    ops = [rng.uniform(-1, 1, (5, 8)), rng.uniform(-1, 1, (8, 5)), rng.uniform(-1, 1, (3, 4))]
    plan = plan_greedy(ops, [0, 0, 1])
    buf = io.StringIO()
    text = plan.describe(file=buf)
    assert buf.getvalue().strip() == text.strip()
    assert "5 x 8" in text and "8 x 5" in text and "3 x 4" in text


def test_schedule_steps_follow_alg2():
    d = 8
    ops, axes = table2_ops(d), cycling(d)
    plan = plan_greedy(ops, axes)
    trace = alg2_trace(53, effective_rhos(ops, axes, 53), S15.moduli, 1)
    steps = plan.schedule.steps
    assert len(steps) == d
    for st_, (before, prod, g, after, pl_prod, pl_after) in zip(steps, trace):
        assert (st_.before, st_.product, st_.drops, st_.after) == (before, prod, g, after)
        assert (st_.range_product, st_.range_after) == (pl_prod, pl_after)
        # greedy drops are the smallest moduli, smallest first
        assert st_.dropped == tuple(sorted(S15.moduli)[:g])


def test_plan_depends_only_on_operators():
    ops, axes = table2_ops(5, 1), cycling(5)
    p1 = plan_greedy(ops, axes)
    p2 = plan_greedy([A.copy() for A in ops], tuple(axes))
    assert (p1.bits, p1.drops) == (p2.bits, p2.drops)


# ----- the error-optimal planner -----------------------------------------------------------------


def _check_schedule(start: int, rhos, dropped, moduli, restore: bool):
    """Re-run the bound recurrence of a given schedule of dropped moduli with every range check."""
    full = sorted(moduli)
    L, PL, P, B = list(full), math.prod(full), math.prod(full), start
    for i, (r, qs) in enumerate(zip(rhos, dropped)):
        B *= r
        assert 2 * B < PL, f"product {i}"
        assert len(set(qs)) == len(qs) and all(q in L for q in qs) and len(qs) < len(L)
        for q in qs:
            B = B // q + 1
            L.remove(q)
            PL //= q
            assert 2 * B < PL, f"drop after product {i}"
        if restore:
            L, PL = list(full), P
    assert dropped[-1] == ()


@pytest.mark.parametrize("method", ["rescale_be", "rescale"])
@pytest.mark.parametrize("d", [3, 5, 8])
def test_optimal_planner_schedule_is_feasible(method, d):
    ops, axes = table2_ops(d), cycling(d)
    greedy = plan_any(ops, axes, method=method)
    opt = plan_any(ops, axes, method=method, planner="optimal")
    assert opt.planner == "optimal" and opt.method == method
    assert opt.bits == greedy.bits  # the width is chosen by the same range checks
    assert isinstance(opt.drops, tuple) and len(opt.drops) == d and opt.drops[-1] == 0
    dropped = [st_.dropped for st_ in opt.schedule.steps]
    assert tuple(len(q) for q in dropped) == opt.drops
    rhos = effective_rhos(ops, axes, opt.bits)
    _check_schedule(1 << opt.bits, rhos, dropped, S15.moduli, method == "rescale_be")


def test_optimal_rescale_be_divides_by_just_enough():
    # after each non-final product the optimal planner drops the subset of moduli with the smallest
    # product that still lets the next product fit (brute force over every subset, d = 3)
    import itertools

    ops, axes = table2_ops(3), cycling(3)
    opt = plan_greedy(ops, axes, planner="optimal")
    rhos = effective_rhos(ops, axes, opt.bits)
    P, full = S15.product, sorted(S15.moduli)
    B = 1 << opt.bits
    for i, st_ in enumerate(opt.schedule.steps[:-1]):
        B *= rhos[i]
        chosen = math.prod(st_.dropped)

        def fits(qs):
            b, pl = B, P
            for q in sorted(qs):
                b, pl = b // q + 1, pl // q
                if 2 * b >= pl:
                    return None
            return b if 2 * b * rhos[i + 1] < P else None

        assert fits(st_.dropped) is not None
        for r in range(0, len(full)):
            for qs in itertools.combinations(full, r):
                if math.prod(qs) < chosen:
                    assert fits(qs) is None, (i, qs)
        B = fits(st_.dropped)


def test_min_product_subset_is_exact_when_the_search_ends_and_feasible_when_it_is_cut():
    import itertools

    from rnstensor.planner.bounds import min_product_subset

    r = np.random.default_rng(5)
    pool = sorted(rt.Basis.int8(49).moduli)
    for _ in range(30):
        avail = sorted(r.choice(pool, int(r.integers(3, 9)), replace=False).tolist())
        target = int(r.integers(2, math.prod(avail[1:]) + 1))
        subsets = [c for n in range(1, len(avail)) for c in itertools.combinations(avail, n) if math.prod(c) >= target]
        want = min(math.prod(c) for c in subsets)
        assert math.prod(min_product_subset(avail, target)) == want
    # 36 moduli, a target needing about a dozen: the search is cut, the answer still feasible and no worse than
    # the first subset it reaches (the smallest moduli in order)
    avail, target = pool[:36], 3**70
    first = min_product_subset(avail, target, nodes=1)
    got = min_product_subset(avail, target)
    assert math.prod(got) >= target and len(got) < len(avail) and math.prod(got) <= math.prod(first)
    assert list(first) == sorted(avail)[: len(first)] and math.prod(first) >= target


@pytest.mark.parametrize("method", ["norescale", "composed"])
def test_optimal_planner_is_a_no_op_without_drops(method):
    ops, axes = table2_ops(4), cycling(4)
    a = plan_any(ops, axes, method=method)
    b = plan_any(ops, axes, method=method, planner="optimal")
    assert (a.bits, a.drops) == (b.bits, b.drops)


# ----- input_bits and forced bits -------------------------------------------------------------------


def test_input_bits_wider_than_bits():
    ops, axes = table2_ops(3), cycling(3)
    plan = plan_greedy(ops, axes, input_bits=60)
    assert plan.input_bits == 60 and plan.bits == 53
    rhos = effective_rhos(ops, axes, 53)
    assert plan.drops == alg2(53, rhos, S15.moduli, 1, start=1 << 60)
    assert plan.schedule.steps[0].before == 1 << 60
    # the paper's threshold stays 2**b: the first product drops more than with 53-bit input
    assert plan.drops[0] >= plan_greedy(ops, axes).drops[0]


def test_input_bits_beyond_the_range_raise():
    ops, axes = table2_ops(3), cycling(3)
    P = S15.product
    too_wide = P.bit_length()  # 2 * 2**too_wide >= P: not even the encoding fits
    with pytest.raises(rt.PlanError, match="encoding"):
        plan_greedy(ops, axes, input_bits=too_wide)
    # with b forced to 53 the first product cannot hold a 63-bit input: 2 * 2**63 * rho_1 >= P
    rho1 = effective_rhos(ops, axes, 53)[0]
    assert 2 * (1 << 63) * rho1 >= P
    with pytest.raises(rt.PlanError, match=r"product 1"):
        plan_greedy(ops, axes, bits=53, input_bits=63)


def test_forced_bits():
    ops, axes = table2_ops(3), cycling(3)
    plan = plan_greedy(ops, axes, method="rescale", bits=20)
    assert plan.bits == 20
    assert plan.drops == alg2(20, effective_rhos(ops, axes, 20), S15.moduli, 0)
    with pytest.raises(rt.PlanError):
        plan_greedy(ops, axes, method="norescale", bits=53)


# ----- infeasible plans and bad arguments ------------------------------------------------------------


def _missing_bits(msg: str) -> float:
    m = re.search(r"(\d+\.\d+) bits missing", msg)
    assert m, msg
    return float(m.group(1))


@pytest.mark.parametrize("s", [8, 10, 12])
def test_plan_error_names_the_step_and_the_missing_bits(s):
    # too few moduli for a 53-bit 8x8 chain: product 1 needs 2 * 2**53 * rho_1 of range
    ops, axes = table2_ops(3), cycling(3)
    basis = rt.Basis.int8(s)
    rho1 = first_visit_rho(ops[0], 53)
    need = math.log2(2 * (1 << 53) * rho1)
    have = math.log2(basis.product)
    assert 54 < have < need
    with pytest.raises(rt.PlanError) as exc:
        plan_greedy(ops, axes, moduli=s, bits=53)
    msg = str(exc.value)
    assert "product 1" in msg and "axis 0" in msg
    assert abs(_missing_bits(msg) - (need - have)) < 0.006
    assert f"{need:.2f}" in msg and f"{have:.2f}" in msg
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize("s", [2, 3])
def test_plan_error_when_the_encoding_does_not_fit(s):
    ops, axes = table2_ops(3), cycling(3)
    have = math.log2(rt.Basis.int8(s).product)
    with pytest.raises(rt.PlanError) as exc:
        plan_greedy(ops, axes, moduli=s, bits=53)
    msg = str(exc.value)
    assert "encoding" in msg
    assert abs(_missing_bits(msg) - (54 - have)) < 0.006


def test_plan_error_when_no_width_fits():
    # one modulus (256): even b = 1 overflows at the second product; the error names it with the numbers
    ops, axes = table2_ops(3), cycling(3)
    for method in ("rescale_be", "rescale", "norescale"):
        assert hand_plan(method, ops, axes, (256,)) is None
        with pytest.raises(rt.PlanError) as exc:
            plan_greedy(ops, axes, moduli=1, method=method)
        msg = str(exc.value)
        rhos = effective_rhos(ops, axes, 1)
        need = math.log2(2 * 2 * rhos[0] * rhos[1])
        assert "product 2" in msg, msg
        assert abs(_missing_bits(msg) - (need - 8.0)) < 0.006


def test_few_moduli_still_plan_at_small_b():
    # 2 or 3 moduli hold an 8x8 chain at a small width: with min_bits=0 that is a plan (Alg. 3 lowers b)
    ops, axes = table2_ops(3), cycling(3)
    for s in (2, 3):
        for method in ("rescale_be", "rescale", "norescale", "composed"):
            plan = plan_any(ops, axes, moduli=s, method=method)
            assert (plan.bits, plan.drops) == hand_plan(method, ops, axes, rt.Basis.int8(s).moduli)
            assert plan.bits < 53


@pytest.mark.parametrize("method", ["rescale_be", "rescale", "norescale", "composed"])
def test_plans_that_keep_too_few_bits_are_refused(method):
    """einsum's min_bits rule: a plan below 32 kept bits is a PlanError that says how to get more."""
    ops, axes = table2_ops(3), cycling(3)
    with pytest.raises(rt.PlanError, match=r"keeps only [0-9.]+ bits .*min_bits=32.*use more moduli"):
        plan_greedy(ops, axes, moduli=2, method=method)
    with pytest.raises(rt.PlanError, match="min_bits"):
        rt.mode_chain(np.ones((8, 8, 8)), ops, axes, moduli=2, method=method)
    hand = hand_plan(method, ops, axes, rt.Basis.int8(2).moduli)
    assert plan_greedy(ops, axes, moduli=2, method=method, min_bits=hand[0]).bits == hand[0]
    with pytest.raises(rt.PlanError, match=f"min_bits={hand[0] + 1}"):
        plan_greedy(ops, axes, moduli=2, method=method, min_bits=hand[0] + 1)
    # a width the caller asks for is no loss: bits=b needs only b kept bits
    assert plan_greedy(ops, axes, moduli=2, method=method, bits=hand[0]).bits == hand[0]
    with pytest.raises(ValueError, match="min_bits must be a non-negative integer"):
        plan_greedy(ops, axes, method=method, min_bits=-1)


def test_default_plans_keep_at_least_min_bits():
    ops, axes = table2_ops(3), cycling(3)
    assert plan_greedy(ops, axes).bits == 53
    plan = plan_greedy(ops, axes, moduli=15, method="norescale", min_bits=0)
    assert plan.bits < 32  # NoRescale at depth 3 keeps fewer than 32 bits on 15 moduli: refused by default
    with pytest.raises(rt.PlanError):
        plan_greedy(ops, axes, moduli=15, method="norescale")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(method="fast"), "method"),
        (dict(planner="best"), "planner"),
        (dict(method="composed", input_bits=60), "input_bits"),
        (dict(bits=0), "bits"),
        (dict(input_bits=-3), "input_bits"),
    ],
)
def test_bad_plan_arguments(kwargs, match):
    ops, axes = table2_ops(3), cycling(3)
    with pytest.raises(ValueError, match=match) as exc:
        plan_greedy(ops, axes, **kwargs)
    assert not isinstance(exc.value, rt.PlanError)
