"""Mass operator on a curved hexahedral mesh, applied in the residue domain (one encode, one decode).

Run: python examples/fem_mass.py
"""

import numpy as np

from rnstensor.fem import MassOperator, TensorBasis, box_mesh

basis = TensorBasis(5, dim=3)  # degree 4, 6 Gauss points per direction
mesh = box_mesh(basis, shape=(3, 2, 2), upper=(3.0, 2.0, 1.0), curved=0.15)
M = MassOperator(basis, mesh.qdata)  # planned once: drops + base extension per stage
print(M)
print(M.plan.describe())

# the sum of M·1 is the volume of the box (the curved mesh keeps the box)
one = np.ones(mesh.dofs.shape)
print(f"volume: {M.apply(one).sum():.15f} (box: {mesh.volume})")

# u^T M u = integral of u^2 for a global u, against plain float64 and the composed method
x = mesh.coords
u = mesh.gather(np.sin(x[:, 0]) * np.cos(x[:, 1]) + x[:, 2] ** 2)
y = M.apply(u)
y64 = MassOperator(basis, mesh.qdata, method="float64").apply(u)
yc = MassOperator(basis, mesh.qdata, method="composed").apply(u)
scale = np.abs(y64).max()
print(f"max |rescale_be - float64| / max|y| = {np.abs(y - y64).max() / scale:.2e}")
print(f"max |composed   - float64| / max|y| = {np.abs(yc - y64).max() / scale:.2e}")
print(f"rigorous bound on |rescale_be - exact| / max|y| <= {M.error_bound(u).max() / scale:.2e}")
print(f"integral of u^2 over the box: {np.vdot(u, y):.12f}")
