"""Chain plans on device arrays (strict CuPy stand-in): fused and step by step, CuPy in, CuPy out, the CPU bits."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import rnstensor as rt
from device import same_bits


# the papers' methods at any width: these tests check plans that keep fewer than min_bits bits
plan_any = functools.partial(rt.plan_chain, min_bits=0)

METHODS = ["rescale_be", "rescale", "norescale", "composed"]


def _plan(method, n=4):
    rng = np.random.default_rng(1)
    ops = [rng.uniform(-1, 1, (n, n)) for _ in range(3)]
    return plan_any(ops, [0, 1, 2], method=method), rng


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("fused", [None, False])
def test_run(device, method, fused):
    plan, rng = _plan(method)
    X = rng.uniform(-1, 1, (2, 3, 4, 4, 4))
    X[0, 1] *= 2.0**-600
    Xd = device.put(X)
    for decode in ("fp64", "exact"):
        got = device.resident(lambda: plan.run(Xd, decode, fused=fused))
        same_bits(got, plan.run(X, decode, backend="cpu"))
    if fused is None and method != "composed":
        assert device.launches[-1].startswith("rns_chain_fused")  # the whole chain as one kernel
    if fused is False:
        assert not any(k.startswith("rns_chain_fused") for k in device.launches[-4:])


def test_apply_and_error_bound(device):
    plan, rng = _plan("rescale_be")
    X = rng.uniform(-1, 1, (5, 4, 4, 4))
    Xd = device.put(X)
    T = device.resident(lambda: plan.apply(plan.encode_input(Xd)).residues)
    same_bits(T, plan.apply(plan.encode_input(X)).residues)
    Td, Th = plan.apply(plan.encode_input(Xd)), plan.apply(plan.encode_input(X))
    assert (Td.bound, Td.active) == (Th.bound, Th.active)
    same_bits(rt.decode(Td, "exact"), rt.decode(Th, "exact"))
    for decode in ("fp64", "exact"):  # the bound's reductions on the device: a few scalars read back
        assert plan.error_bound(Xd, decode) == plan.error_bound(X, decode)
    assert rt.mode_chain(Xd, plan.operators, plan.axes).get().shape == (5, 4, 4, 4)


def test_backend_mismatch(device):
    plan, rng = _plan("rescale_be")
    with pytest.raises(ValueError, match="backend"):
        plan.run(device.put(rng.uniform(-1, 1, (4, 4, 4))), backend="cpu")


def test_nonfinite_input_on_the_device(device):
    plan, rng = _plan("rescale_be")
    X = rng.uniform(-1, 1, (3, 4, 4, 4))
    X[1, 0, 2, 3] = np.nan
    want = plan(X)
    same_bits(plan.run(device.put(X), fused=False), want)
    same_bits(plan.run(device.put(X)), want)


@pytest.mark.parametrize("tiny, path", [(2.0**-40, "residues on 15 moduli (2 of 4 tensors); residues on 16 moduli, "
                                                   "71-bit input (2 of 4 tensors)"),
                                        (2.0**-200, "composed classical GEMMs")])
def test_revisiting_default_chain(device, tiny, path):
    # a chain that comes back to an axis (a Fold in its program) is certified on the device as on the CPU: the same
    # path per tensor (the residues, or the classical GEMMs where its rows span 200 binades), the same bits and bound
    A1 = np.diag([1.0, tiny, 3.0])
    A2 = np.array([[1.0, 1 / tiny, 1.0], [0.5, 1.0, -1.0]])
    plan = rt.plan_chain([A1, A2, A1[:2, :2]], [0, 0, 1], ndim=2)
    X = np.random.default_rng(6).uniform(-1, 1, (4, 3, 2))
    Xd = device.put(X)
    got = device.resident(lambda: plan(Xd))
    on_device = plan.last_evaluation
    same_bits(got, plan(X))
    assert plan.last_evaluation == on_device == path
    assert plan.error_bound(Xd) == plan.error_bound(X)


def test_correctly_rounded_fallback_on_the_device(device):
    # the chain whose only certified result is its exact value rounded once: the same on the device
    A, B = np.array([[1.0, 2.0**-200], [0.5, 1.0]]), np.array([[0.0, 1.0], [1.0, 3.0]])
    X = np.array([[0.0, 1.0], [1.0, -1.0]])
    plan = rt.plan_chain([A, B], [0, 0], ndim=1, min_bits=0)
    want = plan(X[:1])  # the first tensor's only certified result
    assert plan.last_evaluation.startswith("correctly rounded")
    Xd = device.put(X[:1])
    same_bits(device.resident(lambda: plan(Xd)), want)
    assert plan.last_evaluation.startswith("correctly rounded")
    same_bits(plan(device.put(X)), plan(X))  # per tensor on the device as on the CPU
    assert plan.last_evaluation == "correctly rounded (27 moduli, exact)"
