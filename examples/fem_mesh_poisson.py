"""Poisson on a curved hexahedral mesh file with SciPy's conjugate gradients and a Jacobi preconditioner.

-Laplace u = f on the quarter shell of examples/data/quarter_shell.msh (216
triquadratic hexahedra, shuffled and re-oriented cells), u = u* on the whole
boundary, with the manufactured solution u* = exp(x/2) sin(1.3 y) cos(0.7 z).
Every matrix-vector product of CG runs the residue-domain stiffness operator
(one encode, one decode per product). The mesh and its uniform refinement
(1728 cells) give the error at two mesh sizes and the observed order, which
should be about p + 1 for degree p.

Run: python examples/fem_mesh_poisson.py [degree ...]     (default: 2; "2 3" adds p = 3, about 1.5 min)
"""

import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse.linalg as sla

from rnstensor.fem import read_mesh

A_, B_, C_ = 0.5, 1.3, 0.7
MESH = Path(__file__).with_name("data") / "quarter_shell.msh"


def exact(x):
    return np.exp(A_ * x[..., 0]) * np.sin(B_ * x[..., 1]) * np.cos(C_ * x[..., 2])


def load(x):  # -Laplace u* = (b^2 + c^2 - a^2) u*
    return (B_**2 + C_**2 - A_**2) * exact(x)


def solve(mesh):
    """(max nodal error, L2 error, CG iterations) of the Dirichlet problem on ``mesh``."""
    A = mesh.poisson()  # method='rescale_be': the residue-domain operator
    fixed = mesh.boundary_dofs()  # the topological boundary (faces of one cell)
    L = A.as_linear_operator(dirichlet=fixed)
    b = A.dirichlet_rhs(mesh.load_vector(load), fixed, values=exact)
    its = []
    u, info = sla.cg(L, b, rtol=1e-9, maxiter=2000, M=A.jacobi(fixed), callback=lambda _: its.append(1))
    if info != 0:
        raise RuntimeError(f"CG did not converge (info={info})")
    err_max = np.abs(u - exact(mesh.coords)).max()
    err_l2 = np.sqrt(np.sum(mesh.qdata * (mesh.at_quadrature(u) - exact(mesh.xq)) ** 2))  # by the quadrature
    return err_max, err_l2, len(its)


degrees = [int(a) for a in sys.argv[1:]] or [2]
print(f"mesh {MESH.name}")
for p in degrees:
    t0 = time.perf_counter()
    coarse = read_mesh(MESH, degree=p)
    rows = []
    for mesh in (coarse, coarse.refine()):
        rows.append((mesh,) + solve(mesh))
    (m0, e0, l0, i0), (m1, e1, l1, i1) = rows
    for m, e, l2, its in rows:
        print(f"p={p}: {m.nelem:5d} cells, {m.ndof:6d} nodes, {its:4d} CG iterations, "
              f"max nodal error {e:.3e}, L2 error {l2:.3e}")
    print(f"p={p}: observed order: max nodal {np.log2(e0 / e1):.2f}, L2 {np.log2(l0 / l1):.2f} "
          f"(expected about {p + 1}); {time.perf_counter() - t0:.1f} s")
