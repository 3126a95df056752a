"""The FEM operators on device arrays (strict CuPy stand-in): fused and step by step, CuPy in, CuPy out, the CPU bits."""

from __future__ import annotations

import numpy as np
import pytest

from device import same_bits
from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh


def _case(kind, method="rescale_be", dim=3, P=3):
    basis = TensorBasis(P, dim=dim)
    mesh = box_mesh(basis, shape=(3, 2, 1)[:dim], curved=0.1)
    Op = MassOperator if kind == "mass" else PoissonOperator
    data = mesh.qdata if kind == "mass" else mesh.G
    u = mesh.gather(np.sin(mesh.coords[:, 0]) + mesh.coords[:, 1] ** 2)
    return Op(basis, data, method=method), Op(basis, data, method=method, backend="cpu"), u


@pytest.mark.parametrize("kind", ["mass", "poisson"])
@pytest.mark.parametrize("fused", [None, False])
def test_apply(device, kind, fused):
    op, ref, u = _case(kind)
    ud = device.put(u)
    for decode in ("fp64", "exact"):
        got = device.resident(lambda: op.apply(ud, decode, fused=fused))
        same_bits(got, ref.apply(u, decode))
    if fused is None:
        assert device.launches[-1].startswith("rns_chain_fused")
    Td = op.apply_rns(ud)
    Th = ref.apply_rns(u)
    assert Td.bound == Th.bound == op.plan.final_bound
    same_bits(Td.residues, Th.residues)


@pytest.mark.parametrize("method", ["composed", "float64"])
def test_other_methods(device, method):
    op, ref, u = _case("poisson", method, dim=2, P=4)
    ud = device.put(u)
    same_bits(device.resident(lambda: op.apply(ud), kernels=method != "float64"), ref.apply(u))


def test_error_bound_and_elements(device):
    op, ref, u = _case("mass")
    ud = device.put(u)
    same_bits(op.error_bound(ud), ref.error_bound(u))
    sub = op.elements(1, 4)
    same_bits(device.resident(lambda: sub.apply(ud[1:4])), ref.apply(u)[1:4])
