"""The fused CPU interpreter (backends/cpu_fused.py) against the step-by-step execution, bit for bit.

The step-by-step run (``fused=False``) is the oracle here: every primitive
of it is checked against exact integer references elsewhere (test_backend_cpu,
test_chain), and the fused run must give the same float64 bits for every
plan, shape, batch size (across block boundaries), decode and input (zeros,
subnormals, entries spanning many binades, huge values).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rnstensor as rt
from rnstensor.backends import get_backend
from rnstensor.backends.cpu import fused as cpu_fused
from rnstensor.encode import group_exponents
from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh
from rnstensor.fem.fused import operator_field

from oracle import assert_bits_equal


def _ops(rng, shape, axes, outs, span: int = 0):
    cur, ops = list(shape), []
    for ax, n_out in zip(axes, outs):
        A = rng.uniform(-1, 1, (n_out, cur[ax]))
        if span:
            A = np.ldexp(A, rng.integers(-span, span + 1, A.shape).astype(np.int32))
        ops.append(A)
        cur[ax] = n_out
    return ops


def _tensors(rng, B, shape, kind: str):
    X = rng.uniform(-1, 1, (B,) + tuple(shape))
    if kind == "wide":
        X = np.ldexp(X, rng.integers(-300, 300, X.shape).astype(np.int32))
    elif kind == "per-tensor":
        X = X * np.ldexp(1.0, rng.integers(-1060, 1000, (B,) + (1,) * len(shape)).astype(np.int32))
    elif kind == "sparse":
        X = np.where(rng.random(X.shape) < 0.7, 0.0, X)
        X[0] = 0.0  # a tensor of zeros: exponent 0
    elif kind == "subnormal":
        X = X * 2.0**-1070
    return X


def _same(plan, X, decode, fused=True):
    steps = plan.run(X, decode, fused=False)
    assert_bits_equal(plan.run(X, decode, fused=fused), steps)


@pytest.mark.parametrize("kind", ["uniform", "wide", "per-tensor", "sparse", "subnormal"])
@pytest.mark.parametrize("decode", ["fp64", "exact"])
def test_fused_chain_matches_the_steps(kind, decode):
    rng = np.random.default_rng(abs(hash((kind, decode))) % 2**32)
    shape, axes = (8, 8, 8), [0, 1, 2]
    plan = rt.plan_chain(_ops(rng, shape, axes, [8, 8, 8]), axes, moduli=15)
    prog = cpu_fused.cpu_compile(plan.fusion_request(shape))
    for B in (1, prog.nb - 1, prog.nb, prog.nb + 1, 3 * prog.nb + 2):
        _same(plan, _tensors(rng, max(B, 1), shape, kind), decode)


@settings(max_examples=25, deadline=None)
@given(
    dims=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    data=st.data(),
)
def test_fused_chains_of_any_shape_match_the_steps(dims, data):
    ndim = len(dims)
    axes = data.draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=4), label="axes")
    axes = axes if set(axes) == set(range(ndim)) else axes + [a for a in range(ndim) if a not in axes]
    outs = data.draw(st.lists(st.integers(1, 9), min_size=len(axes), max_size=len(axes)), label="outs")
    method = data.draw(st.sampled_from(["rescale_be", "rescale", "norescale"]), label="method")
    s = data.draw(st.sampled_from([12, 15, 22]), label="s")
    B = data.draw(st.integers(1, 40), label="B")
    kind = data.draw(st.sampled_from(["uniform", "wide", "sparse"]), label="kind")
    decode = data.draw(st.sampled_from(["fp64", "exact"]), label="decode")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    ops = _ops(rng, dims, axes, outs, span=data.draw(st.sampled_from([0, 20]), label="span"))
    try:
        plan = rt.plan_chain(ops, axes, moduli=s, method=method, min_bits=0)
    except (rt.PlanError, rt.RNSRangeError):
        return  # too deep for this basis: nothing to run
    prog, why = get_backend("cpu").compile_program(plan.fusion_request(tuple(dims)), decode)
    # the one shape of program the interpreter refuses here: a revisit without a fold (method='rescale')
    assert prog is not None or "exponents vary" in why
    _same(plan, _tensors(rng, B, dims, kind), decode, fused=None if prog is None else True)


def test_the_default_runs_fused_on_the_cpu(monkeypatch):
    rng = np.random.default_rng(3)
    ops = _ops(rng, (5, 6, 7), [0, 1, 2], [4, 6, 3])
    X = rng.uniform(-1, 1, (11, 5, 6, 7))
    calls = []
    real = cpu_fused.run_chain
    monkeypatch.setattr(cpu_fused, "run_chain", lambda *a, **k: calls.append(a) or real(*a, **k))
    for plan in (rt.plan_chain(ops, [0, 1, 2]), rt.plan_chain(ops, [0, 1, 2], moduli=15)):
        y = plan(X)
        assert len(calls) == 1, "the CPU backend's default runs the fused interpreter"
        calls.clear()
        assert_bits_equal(y, plan.run(X, fused=False))
        assert not calls


def test_batch_axes_and_revisits():
    rng = np.random.default_rng(4)
    ops = _ops(rng, (4, 5), [0, 1, 0], [3, 5, 6])
    plan = rt.plan_chain(ops, [0, 1, 0], moduli=15)
    X = rng.uniform(-1, 1, (3, 7, 4, 5))
    _same(plan, X, "fp64")
    assert plan.run(X, fused=True).shape == (3, 7, 6, 5)


def _numpy_exponents(x, bits, shared):
    # group_exponents' definition in numpy: bits - E, 2**(E-1) <= max|G| < 2**E, 0 for an all-zero group
    amax = np.max(np.abs(x), axis=shared, keepdims=True)
    with np.errstate(invalid="ignore"):
        return np.where(amax > 0, bits - np.frexp(amax)[1].astype(np.int64), 0)


def test_tensor_exponents_are_group_exponents():
    rng = np.random.default_rng(5)
    X = rng.uniform(-1, 1, (11, 17)) * np.ldexp(1.0, rng.integers(-1074, 1000, (11, 1)).astype(np.int32))
    X[2] = 0.0
    X[3] = 0.0
    X[3, 4] = 5e-324  # the smallest subnormal
    X[4, :] = 2.0**-1050  # subnormal maxima
    X[5, 3] = -np.finfo(np.float64).max
    X[6, 2] = -np.inf  # numpy: frexp(inf) has exponent 0
    X[7, 5] = np.nan  # numpy: the maximum is NaN, exponent 0
    X[8, 1], X[8, 6] = np.inf, np.nan
    X[9, 0] = -0.0
    X[9, 1:] = 0.0
    for bits in (1, 30, 53, 80):
        et = np.empty(X.shape[0], np.int64)
        cpu_fused._tensor_exponents(X.view(np.int64), 0, X.shape[0], bits, et)
        assert et.tolist() == _numpy_exponents(X, bits, (1,)).reshape(-1).tolist()
        finite = np.isfinite(X).all(axis=1)
        frexp = [bits - math.frexp(float(np.abs(r).max()))[1] if np.any(r) else 0 for r in X[finite]]
        assert et[finite].tolist() == frexp
    # group_exponents takes this path for trailing shared axes, any number of leading ones
    Y = X[:10].reshape(2, 5, 17)
    for shared in ((2,), (1, 2)):
        got, want = group_exponents(Y, 53, shared), _numpy_exponents(Y, 53, shared)
        assert got.dtype == np.int64 and got.shape == want.shape and (got == want).all()


def test_fused_errors():
    rng = np.random.default_rng(6)
    ops = _ops(rng, (4, 4), [0, 1], [4, 4])
    plan = rt.plan_chain(ops, [0, 1], moduli=15)
    X = rng.uniform(-1, 1, (2, 4, 4))
    with pytest.raises(ValueError, match="fused=True runs on the 'cpu' and 'cuda' backends"):
        plan.run(X, backend="numpy", fused=True)
    composed = rt.plan_chain(ops, [0, 1], moduli=15, method="composed")
    with pytest.raises(ValueError, match="composed method decodes after every product"):
        cpu_fused.cpu_compile(composed.fusion_request((4, 4)))
    wide = rt.plan_chain([rng.uniform(-1, 1, (3, 200))], [0], moduli=15)
    with pytest.raises(ValueError, match="fused=True: .*more than 192 columns"):
        wide.run(rng.uniform(-1, 1, (2, 200)), fused=True)
    assert_bits_equal(wide.run(rng.uniform(-1, 1, (2, 200)) * 0 + 1), wide.run(np.ones((2, 200)), fused=False))
    with pytest.raises(ValueError, match="decode must be"):
        cpu_fused.run_chain(cpu_fused.cpu_compile(plan.fusion_request((4, 4))), X, "fp32")


def test_each_front_end_compiles_once_per_shape(monkeypatch):
    # a chain plan compiles its program once per tensor shape and decode; a FEM operator and its element slices
    # once per plan; einsum's expression once per plan: every one through the backend's one door
    from rnstensor.backends.cpu import backend as cpu_backend

    calls = []
    real = cpu_backend.CpuBackend.compile_program
    monkeypatch.setattr(cpu_backend.CpuBackend, "compile_program",
                        lambda self, request, decode: calls.append((request.in_shape, decode)) or real(self, request, decode))
    rng = np.random.default_rng(4)
    ops = _ops(rng, (4, 5, 6), [0, 1, 2], [4, 5, 6])
    plan = rt.plan_chain(ops, [0, 1, 2], moduli=15)
    for _ in range(2):
        plan.run(rng.uniform(-1, 1, (3, 4, 5, 6)), fused=True)
    assert calls == [((4, 5, 6), "fp64")]
    plan.run(rng.uniform(-1, 1, (3, 4, 5, 6)), "exact", fused=True)
    assert calls[1:] == [((4, 5, 6), "exact")]
    calls.clear()
    import weakref

    from rnstensor.fem import operators as fem_operators

    monkeypatch.setattr(fem_operators, "_FUSED", weakref.WeakKeyDictionary())  # (operators share programs)
    b = TensorBasis(2, dim=3)
    op = MassOperator.on(box_mesh(b, shape=2)).op
    u = rng.uniform(-1, 1, (op.nelem, 2, 2, 2))
    op.apply(u, fused=True)
    op.elements(1, 3).apply(u[1:3], fused=True)
    assert calls == [((2, 2, 2), "fp64")]
    calls.clear()
    expr = rt.contract_expression("zijk,ai,bj,ck->zabc", (16, 4, 5, 6), *ops, constants=[1, 2, 3], moduli=15)
    for _ in range(2):
        expr(rng.uniform(-1, 1, (16, 4, 5, 6)))
    assert calls == [((4, 5, 6), "fp64")]


def test_scratch_bytes_covers_the_slots():
    rng = np.random.default_rng(7)
    plan = rt.plan_chain(_ops(rng, (8, 8, 8), [0, 1, 2], [8, 8, 8]), [0, 1, 2], moduli=15)
    prog = cpu_fused.cpu_compile(plan.fusion_request((8, 8, 8)))
    assert cpu_fused.scratch_bytes(prog) >= prog.nslots * prog.lmax * prog.emax * prog.nb > 0


def test_strided_and_float32_inputs():
    rng = np.random.default_rng(8)
    plan = rt.plan_chain(_ops(rng, (4, 6), [1, 0], [5, 3]), [1, 0], moduli=15)
    big = rng.uniform(-1, 1, (9, 8, 12))
    X = big[:, ::2, ::2]  # a strided view
    assert not X.flags.c_contiguous
    _same(plan, X, "fp64")
    _same(plan, X.astype(np.float32), "exact")


# ----- FEM operators: Hadamard products with per-element fields, sums of mode products ---------------------


def _fem_data(rng, nelem: int, P: int, dim: int, kind: str):
    u = rng.uniform(-1, 1, (nelem,) + (P,) * dim)
    if kind == "scaled":  # every element its own binade, one of them zero
        u *= np.ldexp(1.0, rng.integers(-900, 900, (nelem,) + (1,) * dim).astype(np.int32))
        u[nelem // 2] = 0.0
    elif kind == "subnormal":
        u *= 2.0**-1060
    return u


@pytest.mark.parametrize("cls", [MassOperator, PoissonOperator])
@pytest.mark.parametrize("dim,degree,quadrature", [(3, 1, "gauss"), (3, 2, "gauss"), (3, 4, "gauss"), (2, 3, "gll"),
                                                   (3, 3, "gll")])
def test_fused_fem_operators_match_the_steps(cls, dim, degree, quadrature):
    rng = np.random.default_rng(degree * 10 + dim)
    b = TensorBasis(degree + 1, dim=dim, quadrature=quadrature)
    mesh = box_mesh(b, shape=(4, 3, 3)[:dim], curved=0.15)
    op = cls.on(mesh).op
    prog = cpu_fused.cpu_compile(op.fusion_request())
    kinds = {int(r[0]) for r in prog.rec}
    assert cpu_fused._HADAMARD in kinds and (cls is MassOperator or cpu_fused._STACK in kinds)
    for kind in ("uniform", "scaled", "subnormal"):
        u = _fem_data(rng, op.nelem, b.P, dim, kind)
        for decode in ("fp64", "exact"):
            assert_bits_equal(op.apply(u, decode, fused=True), op.apply(u, decode, fused=False))
    # element slices: batches across the block boundaries, each element's bits independent of the others
    u = _fem_data(rng, op.nelem, b.P, dim, "scaled")
    whole = op.apply(u, fused=False)
    for lo, hi in ((0, 1), (1, min(op.nelem, prog.nb + 1)), (2, op.nelem)):
        assert_bits_equal(op.elements(lo, hi).apply(u[lo:hi], fused=True), whole[lo:hi])


def test_fem_default_runs_fused_on_the_cpu(monkeypatch):
    b = TensorBasis(3, dim=3)
    mesh = box_mesh(b, shape=2, curved=0.1)
    u = np.random.default_rng(9).uniform(-1, 1, (mesh.nelem,) + (b.P,) * 3)
    calls = []
    real = cpu_fused.run_chain
    monkeypatch.setattr(cpu_fused, "run_chain", lambda *a, **k: calls.append(k) or real(*a, **k))
    for cls in (MassOperator, PoissonOperator):
        op = cls.on(mesh).op
        y = op.apply(u)
        assert len(calls) == 1 and calls[0]["field"].shape[1:] == (mesh.nelem, 1 if cls is MassOperator else 6, b.Q**3)
        calls.clear()
        assert_bits_equal(y, op.apply(u, fused=False))
        assert not calls
        one = op.elements(0, 1)
        assert_bits_equal(one.apply(u[0]), one.apply(u[:1], fused=False)[0])  # one element without the batch axis
        calls.clear()


def test_fused_fem_errors():
    b = TensorBasis(3, dim=3)
    mesh = box_mesh(b, shape=2)
    op = PoissonOperator.on(mesh).op
    prog = cpu_fused.cpu_compile(op.fusion_request())
    u = np.ones((mesh.nelem, 3, 3, 3))
    with pytest.raises(ValueError, match="multiplies by a field: pass field= and fexp="):
        cpu_fused.run_chain(prog, u, "fp64")
    field, fexp = operator_field(op)
    with pytest.raises(ValueError, match=r"field must be \(planes, 8, 6, 64\)"):
        cpu_fused.run_chain(prog, u, "fp64", field=field[:, :3], fexp=fexp)
    with pytest.raises(ValueError, match=r"x must be \(B, 3, 3, 3\)"):
        cpu_fused.run_chain(prog, u[..., :2], "fp64", field=field, fexp=fexp)
    composed = PoissonOperator(b, mesh.G, method="composed")
    with pytest.raises(ValueError, match="only method='rescale_be'"):
        composed.fusion_request()
    with pytest.raises(ValueError, match="fused=True: .*only method='rescale_be'"):
        composed.apply(u, fused=True)
    big = TensorBasis(63, dim=2)  # Q = 64, the most points a basis takes: sums of 3 x 64 terms are exact in float32
    assert get_backend("cpu").compile_program(PoissonOperator(big, box_mesh(big, 1).G).fusion_request(), "fp64")[1] is None


def test_one_large_tensor_runs_step_by_step(monkeypatch):
    # fewer tensors than threads, each past the caches: the step-by-step passes (threaded inside the tensor) are
    # faster than the fused interpreter (a tensor per thread), so the default takes them; fused=True still fuses
    from rnstensor.backends.cpu import backend as cpu_backend
    from rnstensor.backends.cpu.common import _nthreads

    rng = np.random.default_rng(2)
    ops = [rng.uniform(-1, 1, (8, 8)) for _ in range(3)]
    X = rng.uniform(-1, 1, (64, 8, 8, 8))  # one tensor of 32768 entries (its leading axis is not contracted)
    plan = rt.plan_chain(ops, [1, 2, 3], moduli=15)
    be = rt.backends.get_backend("cpu")
    prog, _ = be.compile_program(plan.fusion_request(X.shape), "fp64")
    assert (be.fuses(prog, 1) is not None) == (_nthreads() > 1)
    assert be.fuses(prog, _nthreads()) is None
    small, _ = be.compile_program(rt.plan_chain(ops, [0, 1, 2], moduli=15).fusion_request((8, 8, 8)), "fp64")
    assert be.fuses(small, 1) is None  # a tensor within the caches: fused, even alone
    fused = plan.run(X, "fp64", fused=True)
    calls = []
    real = cpu_backend.CpuBackend.chain
    monkeypatch.setattr(cpu_backend.CpuBackend, "chain", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    y = plan.run(X, "fp64")
    assert np.array_equal(y, fused) and len(calls) == (0 if _nthreads() > 1 else 1)
