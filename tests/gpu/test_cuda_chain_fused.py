"""The fused chain kernel on the GPU: bitwise plan.run on the CPU backend, CuPy in and out, its errors."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import rnstensor as rt
from rnstensor.kernels import fused

from cuda_support import cupy_or_skip  # noqa: E402

cp = cupy_or_skip()

from test_kernels_chain import CASES, _ops, plan_any  # noqa: E402  (the same plans the host run checks, any width)


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), np.argwhere(a != b)[:5]


def _case_plan(shape, opshapes, axes, method):
    rng = np.random.default_rng(sum(shape) + len(axes))
    return plan_any(_ops(rng, opshapes, "wide"), axes, ndim=len(shape), method=method, moduli=15), rng


def _cube_plan(seed, n):
    rng = np.random.default_rng(seed)
    return rt.plan_chain([rng.uniform(-1, 1, (n, n)) for _ in range(3)], (0, 1, 2)), rng


FEM_CASES = [(2, 3), (4, 3), (8, 3), (6, 2)]


def _fem_operator(kind, P, dim, backend):
    from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

    basis = TensorBasis(P, dim=dim)
    mesh = box_mesh(basis, shape=(3, 2, 2)[:dim], curved=0.1)
    op = MassOperator(basis, mesh.qdata, backend=backend) if kind == "mass" else PoissonOperator(
        basis, mesh.G, backend=backend)
    return op, mesh


def _certified_plans(plan, X) -> list:
    """The plans the default (``moduli=None``) runs ``X``'s tensors on (each tensor on the narrowest certified)."""
    shape = X.shape[1:]
    return [(p, shape) for p, _, _ in plan._classical_groups(np.asarray(X, np.float64).reshape((-1,) + shape), np)
            if p is not None]


def spec_programs():
    """The fused programs this module runs (tests/gpu/conftest.py builds their kernels side by side first): the
    plans, and the wider ones the certified default takes on the tests' data."""
    plans = [(_case_plan(*case[:4])[0], case[0]) for case in CASES]
    plans += [(_cube_plan(seed, n)[0], (n, n, n)) for seed, n in ((4, 4), (8, 8), (16, 16), (2, 8))]
    plans.append((_same_operator_plan()[0], (8, 8, 8)))
    plan, rng = _cube_plan(2, 8)
    plans += _certified_plans(plan, _float32_input(rng))
    plan, _, rng = _same_operator_plan()
    plans += _certified_plans(plan, np.nan_to_num(_errors_input(rng)))
    out = [fused.compile_request(plan.fusion_request(shape)) for plan, shape in dict.fromkeys(plans)]
    out += [fused.compile_request(_fem_operator(kind, P, dim, "cpu")[0].fusion_request())
            for kind in ("mass", "poisson") for P, dim in FEM_CASES]
    return out


def slow_spec_programs():
    """The fused programs of the slow tests: the large batches' data escalates the default to wider plans."""
    plans = [p for n in LARGE_N for p in _certified_plans(*_large_batch_case(n))]
    return [fused.compile_request(plan.fusion_request(shape)) for plan, shape in dict.fromkeys(plans)]


def _inputs(rng, batch, shape):
    X = rng.uniform(-1, 1, batch + shape)
    X[(0,) * len(batch)] *= 2.0**-1060  # subnormal tensor
    X.reshape(-1)[-1] = -0.0
    X.reshape(-1)[-2] *= 1e300
    return X


@pytest.mark.parametrize("shape, opshapes, axes, method, batch", CASES)
@pytest.mark.parametrize("decode", ["fp64", "exact"])
def test_fused_equals_cpu(shape, opshapes, axes, method, batch, decode):
    plan, rng = _case_plan(shape, opshapes, axes, method)
    X = _inputs(rng, batch, shape)
    want = plan.run(X, decode, backend="cpu")
    same(plan.run(X, decode, backend="cuda", fused=True), want)
    got = plan.run(cp.asarray(X), decode, fused=True)  # CuPy in: the cuda backend, CuPy out
    assert isinstance(got, cp.ndarray)
    same(cp.asnumpy(got), want)


LARGE_N = (4, 8, 16)


@functools.lru_cache(maxsize=None)
def _large_batch_case(n):
    plan, rng = _cube_plan(n, n)
    return plan, rng.standard_normal((3001, n, n, n)) * np.exp2(rng.integers(-40, 40, (3001, 1, 1, 1)))


@pytest.mark.slow  # thousands of tensors a launch: minutes on the stand-in's CPU threads, left out of the CI dry run
@pytest.mark.parametrize("n", LARGE_N)
def test_fused_large_batches(n):
    plan, X = _large_batch_case(n)
    same(plan.run(cp.asarray(X), backend="cuda").get(), plan.run(X, backend="cpu"))


def _float32_input(rng):
    return rng.standard_normal((5, 8, 8, 8)).astype(np.float32)


def test_fused_float32_cupy_input_is_widened():
    plan, rng = _cube_plan(2, 8)
    X = _float32_input(rng)
    same(plan.run(cp.asarray(X)).get(), plan.run(X, backend="cpu"))


def _same_operator_plan():
    rng = np.random.default_rng(3)
    A = rng.uniform(-1, 1, (8, 8))
    return rt.plan_chain([A, A, A], (0, 1, 2)), A, rng


def _errors_input(rng):
    X = rng.standard_normal((4, 8, 8, 8))
    X[1, 2, 3, 4] = np.nan
    return X


def test_fused_errors():
    plan, A, rng = _same_operator_plan()
    X = cp.asarray(_errors_input(rng))
    with pytest.raises(ValueError, match="non-finite"):
        plan.run(X, nonfinite="raise")
    # numpy's rule by default: the NaN's tensor is NaN where the NaN reaches, as on the CPU
    same(plan.run(X).get(), plan.run(X.get(), backend="cpu"))
    with pytest.raises(ValueError, match="CuPy array"):
        plan.run(X, backend="cpu")
    twice = rt.plan_chain([A, A], (0, 0), ndim=2)
    with pytest.raises(ValueError, match="cannot run as one kernel"):
        twice.run(np.ones((2, 8, 3)), backend="cuda", fused=True)
    # not fusable, not required: the step-by-step kernels, the same numbers
    same(twice.run(np.ones((2, 8, 3)), backend="cuda"), twice.run(np.ones((2, 8, 3)), backend="cpu"))
    assert fused.reason(plan.fusion_request()) is None


@pytest.mark.parametrize("kind", ["mass", "poisson"])
@pytest.mark.parametrize("P, dim", FEM_CASES)
def test_fused_fem_operator(kind, P, dim):
    cpu, mesh = _fem_operator(kind, P, dim, "cpu")
    gpu, _ = _fem_operator(kind, P, dim, "cuda")
    u = np.random.default_rng(P).standard_normal((mesh.nelem,) + (P,) * dim)
    for decode in ("fp64", "exact"):
        want = cpu.apply(u, decode)
        same(gpu.apply(u, decode, fused=True), want)
        same(gpu.apply(u, decode, fused=False), want)
