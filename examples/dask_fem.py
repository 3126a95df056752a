"""Poisson and mass operators over a Dask array of elements: the same bits as in memory, for any chunking.

Run: python examples/dask_fem.py   (needs the 'dask' extra: pip install -e '.[dask]')
"""

import dask.array as da
import numpy as np

import rnstensor.dask as rd
from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

basis = TensorBasis(5, dim=3)  # degree 4
mesh = box_mesh(basis, shape=(6, 6, 4), curved=0.1)  # 144 curved hexahedra
M = MassOperator(basis, mesh.qdata)
A = PoissonOperator(basis, mesh.G)
u = mesh.gather(np.sin(np.pi * mesh.coords[:, 0]) * mesh.coords[:, 1])

U = da.from_array(u, chunks=(40, 5, 5, 5))  # element chunks; one chunk along every other axis
for name, op in (("mass", M), ("Poisson", A)):
    y_dask = rd.apply(op, U).compute()  # each chunk applies the operator to its own elements' geometry
    y_mem = op.apply(u)
    print(f"{name:8s}: Dask result equals the in-memory one bit for bit: {np.array_equal(y_dask, y_mem)}")

# global quantities from the element results
print(f"volume  = {mesh.scatter(rd.apply(M, da.ones_like(U)).compute()).sum():.15f}")
print(f"u^T A u = {np.vdot(u, rd.apply(A, U).compute()):.12f}  (the energy, summed over elements)")
