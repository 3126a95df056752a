"""A Dirichlet Poisson solve by conjugate gradients with the residue-domain operator as the matrix-vector product."""

from __future__ import annotations

import numpy as np
import pytest

from rnstensor.fem import PoissonOperator, TensorBasis, box_mesh


def cg(apply, b, rtol=1e-10, maxiter=1000):
    """Plain conjugate gradients from x = 0; stops when ||r|| <= rtol ||b||. Returns (x, iterations)."""
    x = np.zeros_like(b)
    r = b.copy()
    p = r.copy()
    rr = np.vdot(r, r)
    stop = rtol**2 * rr
    for it in range(1, maxiter + 1):
        Ap = apply(p)
        alpha = rr / np.vdot(p, Ap)
        x += alpha * p
        r -= alpha * Ap
        rr_new = np.vdot(r, r)
        if rr_new <= stop:
            return x, it
        p = r + (rr_new / rr) * p
        rr = rr_new
    raise AssertionError(f"CG did not converge in {maxiter} iterations")


def solve(mesh, method):
    """-Laplace u = f on the unit box, u = 0 on its boundary: (max nodal error, iterations, solution).

    u* = prod_c sin(pi x_c) exp(a_c x_c): smooth, no symmetry for CG to exploit.
    """
    d = mesh.basis.dim
    a = np.array([0.5, -0.3, 0.2])[:d]

    def factors(x):
        return np.sin(np.pi * x) * np.exp(a * x)

    def exact(x):
        return np.prod(factors(x), axis=-1)

    def load(x):  # -Laplace u*: -sum_c f_c'' prod_{k != c} f_k
        fx = factors(x)
        d2 = np.exp(a * x) * ((a**2 - np.pi**2) * np.sin(np.pi * x) + 2 * a * np.pi * np.cos(np.pi * x))
        return -sum(d2[..., c] * np.prod(np.delete(fx, c, axis=-1), axis=-1) for c in range(d))

    f = load(mesh.xq)
    b = mesh.basis
    # load vector: B^T (w detJ f) per element, in float64 (data preparation)
    rhs_q = mesh.qdata * f
    for ax in range(1, d + 1):
        rhs_q = np.moveaxis(np.tensordot(b.B.T, rhs_q, axes=([1], [ax])), 0, ax)
    interior = ~mesh.boundary
    rhs = mesh.scatter(rhs_q) * interior
    A = PoissonOperator(b, mesh.G, method=method)

    def matvec(v):
        return mesh.scatter(A.apply(mesh.gather(v * interior))) * interior

    u, its = cg(matvec, rhs)
    return np.max(np.abs(u - exact(mesh.coords))), its, u


@pytest.mark.parametrize(
    "dim,P,shape,curved",
    [(3, 3, 2, 0.0), (3, 4, (2, 1, 2), 0.15), (3, 5, 1, 0.1), (3, 6, 1, 0.0), (3, 7, 1, 0.1), (3, 8, 1, 0.0),
     (3, 9, 1, 0.1), (2, 3, 3, 0.2), (2, 6, 2, 0.1), (2, 9, 2, 0.2)],
)
def test_cg_poisson_matches_float64(dim, P, shape, curved):
    mesh = box_mesh(TensorBasis(P, dim=dim), shape=shape, curved=curved)
    err64, its64, u64 = solve(mesh, "float64")
    err, its, u = solve(mesh, "rescale_be")
    assert abs(its - its64) <= 1, (its, its64)
    # the same discretisation error, and the same discrete solution to the solver tolerance
    assert abs(err - err64) <= 1e-3 * err64 + 1e-12, (err, err64)
    assert np.max(np.abs(u - u64)) <= 1e-8 * np.max(np.abs(u64))
    assert err < 0.1  # the discretisation converges at all (p >= 2 on these meshes)
