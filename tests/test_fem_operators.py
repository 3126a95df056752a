"""TensorBasis chains, mass and Poisson operators, box meshes: vs float64 Kronecker matrices and exact references."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import rnstensor as rt
from rnstensor.fem import (
    InvertedElementError,
    MassOperator,
    PoissonOperator,
    TensorBasis,
    box_mesh,
    element_geometry,
)
from rnstensor.fem.program import voigt_index

EPS = 2.0**-52


# ----- exact references (Fractions in object arrays, sum-factorized) ---------------------------


def frac(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    out = np.empty(a.shape, dtype=object)
    out.reshape(-1)[:] = [Fraction(v) for v in a.reshape(-1).tolist()]
    return out


def exact_product(x: np.ndarray, A: np.ndarray, axis: int) -> np.ndarray:
    """Mode product of the object array ``x`` (batch axis 0) along tensor axis ``axis`` with object ``A``."""
    y = np.tensordot(x, A, axes=([axis + 1], [1]))
    return np.moveaxis(y, -1, axis + 1)


def exact_apply(kind: str, basis: TensorBasis, field, u) -> np.ndarray:
    d = basis.dim
    B, D, x = frac(basis.B), frac(basis.D), frac(u)
    if kind == "mass":
        for a in range(d):
            x = exact_product(x, B, a)
        x = x * frac(field)
        for a in range(d):
            x = exact_product(x, B.T, a)
        return x
    G = frac(field)
    grads = []
    for i in range(d):
        g = x
        for a in range(d):
            g = exact_product(g, D if a == i else B, a)
        grads.append(g)
    out = 0
    for i in range(d):
        f = sum(G[:, voigt_index(i, j, d)] * grads[j] for j in range(d))
        for a in range(d):
            f = exact_product(f, (D if a == i else B).T, a)
        out = out + f
    return out


def max_err(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per element ``max |y - ref|`` exactly (as Fractions)."""
    diff = np.abs(frac(y) - ref)
    return np.array([max(diff[e].reshape(-1)) for e in range(y.shape[0])], dtype=object)


def ops_for(mesh, **kw):
    return MassOperator(mesh.basis, mesh.qdata, **kw), PoissonOperator(mesh.basis, mesh.G, **kw)


# ----- TensorBasis -----------------------------------------------------------------------------


@pytest.mark.parametrize("dim,P,quad", [(2, 2, "gauss"), (2, 5, "gll"), (3, 3, "gauss"), (3, 4, "gll")])
def test_interp_and_grad_reproduce_polynomials(dim, P, quad):
    b = TensorBasis(P, dim=dim, quadrature=quad)
    assert b.Q == (P + 1 if quad == "gauss" else P)
    p = P - 1
    rng = np.random.default_rng(P)
    coef = rng.uniform(-1, 1, (3, P))  # u = prod_c sum_k coef[c, k] x_c^k: degree p in every variable

    def field(pts, deriv=-1):
        vals = []
        for c in range(dim):
            v = sum(coef[c, k] * pts**k for k in range(P))
            if c == deriv:
                v = sum(k * coef[c, k] * pts ** (k - 1) for k in range(1, P))
            vals.append(v)
        out = vals[0]
        for v in vals[1:]:
            out = np.multiply.outer(out, v)
        return out

    u = np.stack([field(b.nodes), 2 * field(b.nodes)])
    uq = np.stack([field(b.points), 2 * field(b.points)])
    assert np.max(np.abs(b.interp(u) - uq)) <= 1e-13
    g = b.grad(u)
    assert g.shape == (2, dim) + (b.Q,) * dim
    for i in range(dim):
        assert np.max(np.abs(g[:, i] - np.stack([field(b.points, i), 2 * field(b.points, i)]))) <= 1e-12
    assert p >= 1 and np.max(np.abs(b.interp(u[0]) - uq[0])) <= 1e-13  # a single element without batch axis


@pytest.mark.parametrize("dim", [2, 3])
def test_transposes_are_adjoints(dim):
    b = TensorBasis(4, dim=dim)
    rng = np.random.default_rng(dim)
    u = rng.uniform(-1, 1, (3,) + (4,) * dim)
    v = rng.uniform(-1, 1, (3,) + (5,) * dim)
    vg = rng.uniform(-1, 1, (3, dim) + (5,) * dim)
    assert abs(np.vdot(b.interp(u), v) - np.vdot(u, b.interp(v, transpose=True))) <= 1e-13 * np.abs(v).sum()
    assert abs(np.vdot(b.grad(u), vg) - np.vdot(u, b.grad(vg, transpose=True))) <= 1e-12 * np.abs(vg).sum()
    # the chain agrees with float64 Kronecker products
    K = b.B
    for _ in range(dim - 1):
        K = np.kron(K, b.B)
    ref = (K @ u.reshape(3, -1).T).T.reshape(b.interp(u).shape)
    assert np.max(np.abs(b.interp(u) - ref)) <= 8 * EPS * np.abs(u).max() * np.abs(K).sum(1).max()


def test_tensorbasis_plans_cached_and_bad_input():
    b = TensorBasis(3, dim=2)
    assert b.chain() is TensorBasis(3, dim=2).chain()
    assert b == TensorBasis(3, 4, 2) and hash(b) == hash(TensorBasis(3, 4, 2))
    with pytest.raises(ValueError, match=r"u must have shape \(nelem, 3, 3\)"):
        b.interp(np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match=r"shape \(nelem, 2, 4, 4\)"):
        b.grad(np.ones((2, 3, 4, 4)), transpose=True)
    with pytest.raises(TypeError, match="transpose"):
        b.interp(np.ones((1, 3, 3)), transpose="yes")
    with pytest.raises(ValueError, match="quadrature"):
        TensorBasis(3, quadrature="lobatto")
    with pytest.raises(ValueError, match="P=1"):
        TensorBasis(1)
    with pytest.raises(ValueError, match="dim=4"):
        TensorBasis(3, dim=4)
    with pytest.raises(TypeError, match="real floating"):
        b.interp(np.ones((1, 3, 3), dtype=np.int64))


# ----- operators -------------------------------------------------------------------------------

CASES = [  # (dim, P, quadrature, shape, curved)
    (2, 2, "gauss", (2, 1), 0.0),
    (2, 4, "gll", (2, 2), 0.2),
    (3, 2, "gauss", (1, 2, 1), 0.15),
    (3, 3, "gauss", (2, 1, 1), 0.2),
    (3, 4, "gll", (1, 1, 2), 0.0),
]


@pytest.mark.parametrize("dim,P,quad,shape,curved", CASES)
def test_operators_against_exact_and_dense(dim, P, quad, shape, curved):
    b = TensorBasis(P, dim=dim, quadrature=quad)
    mesh = box_mesh(b, shape=shape, upper=(1.0, 2.0, 0.5)[:dim], curved=curved)
    rng = np.random.default_rng(P + dim)
    u = rng.uniform(-1, 1, mesh.dofs.shape)
    u[0] *= 1e-3  # elements of different magnitudes keep their own exponents
    for op, kind, field in ((MassOperator, "mass", mesh.qdata), (PoissonOperator, "poisson", mesh.G)):
        A = op(b, field)
        assert A.method == "rescale_be" and A.bits == 72  # the default width on the default 20 moduli
        ref = exact_apply(kind, b, field, u)
        scale = np.array([float(max(abs(ref[e]).reshape(-1))) for e in range(mesh.nelem)])
        for decode in ("fp64", "exact"):
            y = A.apply(u, decode=decode)
            err = max_err(y, ref)
            bound = A.error_bound(u, decode=decode)
            assert all(Fraction(bd) >= er for bd, er in zip(bound.tolist(), err)), (kind, decode)
            assert np.all(bound <= 1e-11 * scale)  # and the bound says something
            # float64 accuracy, element by element (relative to that element's result)
            assert all(float(er) <= 4 * EPS * s for er, s in zip(err, scale)), (kind, decode, err, scale)
        # float64 dense Kronecker element matrices agree to float64 rounding of the dense products
        dense = np.stack([A.dense(e) @ u[e].reshape(-1) for e in range(mesh.nelem)]).reshape(u.shape)
        assert np.max(np.abs(dense - y) / scale.reshape((-1,) + (1,) * dim)) <= 64 * EPS
        for method in ("composed", "float64"):
            yc = op(b, field, method=method).apply(u)
            assert np.max(np.abs(yc - y) / scale.reshape((-1,) + (1,) * dim)) <= 64 * EPS


def test_residue_result_bound_is_the_planned_one():
    b = TensorBasis(5)
    mesh = box_mesh(b, shape=(1, 1, 2), curved=0.1)
    u = np.random.default_rng(1).uniform(-1, 1, mesh.dofs.shape)
    for A in ops_for(mesh):
        T = A.apply_rns(u)
        assert isinstance(T, rt.RNSTensor) and T.shape == u.shape
        assert T.bound == A.plan.final_bound and 2 * T.bound < T.active_product
        assert any(A.plan.drops) and "stage" in A.plan.describe()
        assert np.array_equal(rt.decode(T), A.apply(u))


@pytest.mark.parametrize("dim,P", [(2, 3), (2, 7), (3, 2), (3, 5)])
def test_mass_volume_poisson_kernel_symmetry(dim, P):
    b = TensorBasis(P, dim=dim)
    upper = (2.0, 1.5, 0.75)[:dim]
    for curved in (0.0, 0.2):
        mesh = box_mesh(b, shape=(2, 1, 2)[:dim], upper=upper, curved=curved)
        M, A = ops_for(mesh)
        one = np.ones(mesh.dofs.shape)
        vol = M.apply(one).sum()
        # box_mesh keeps detJ of degree <= 2p per variable: Gauss with Q = P + 1 integrates it exactly
        assert abs(vol - mesh.volume) <= 64 * EPS * mesh.volume
        assert abs(mesh.qdata.sum() - mesh.volume) <= 64 * EPS * mesh.volume
        assert np.max(np.abs(A.apply(3.5 * one))) <= 64 * EPS * np.abs(A.G).max() * 3.5 * b.P ** (2 * dim)
        rng = np.random.default_rng(P)
        gu, gv = rng.uniform(-1, 1, (2, mesh.ndof))
        u, v = mesh.gather(gu), mesh.gather(gv)
        for op in (M, A):
            uMv, vMu = np.vdot(gu, mesh.scatter(op.apply(v))), np.vdot(gv, mesh.scatter(op.apply(u)))
            assert abs(uMv - vMu) <= 64 * EPS * (abs(uMv) + np.abs(op.apply(u)).sum())
        assert np.vdot(gu, mesh.scatter(A.apply(u))) > 0  # positive semi-definite, nonzero off constants


def test_kernel_fails_for_a_wrong_field():
    """The kernel check is not vacuous: a non-symmetric field breaks the symmetry test."""
    b = TensorBasis(3, dim=2)
    mesh = box_mesh(b, shape=2)
    G = mesh.G.copy()
    G[:, 2] = 0.3 * G[:, 0]  # an xy coupling that is not a metric (still positive diagonal)
    A = PoissonOperator(b, G)
    assert np.max(np.abs(A.apply(np.ones(mesh.dofs.shape)))) < 1e-13  # constants still in the kernel
    rng = np.random.default_rng(0)
    u = rng.uniform(-1, 1, mesh.dofs.shape)
    y = A.apply(u)
    assert np.max(np.abs(y - PoissonOperator(b, mesh.G).apply(u))) > 1e-3


def test_full_G_and_skipped_components():
    b = TensorBasis(3)
    mesh = box_mesh(b, shape=1)  # affine: off-diagonal components are exactly zero and skipped
    A = PoissonOperator(b, mesh.G)
    assert A._skip == frozenset({3, 4, 5})
    full = np.zeros((1, 3, 3) + (b.Q,) * 3)
    for i in range(3):
        for j in range(3):
            full[:, i, j] = mesh.G[:, voigt_index(i, j, 3)]
    u = np.random.default_rng(2).uniform(-1, 1, mesh.dofs.shape)
    assert np.array_equal(PoissonOperator(b, full).apply(u), A.apply(u))


def test_small_basis_plans_or_fails_cleanly():
    b8 = TensorBasis(3, dim=2, moduli=8)
    mesh = box_mesh(b8, shape=2, curved=0.1)
    M = MassOperator(b8, mesh.qdata, min_bits=0)  # narrower encoding, still every step in range
    assert M.bits < 53
    with pytest.raises(rt.PlanError, match=rf"MassOperator: .* keeps only {M.bits}\.0 bits .*min_bits=32"):
        MassOperator(b8, mesh.qdata)  # by default a plan below 32 kept bits is refused, as einsum's
    assert MassOperator(b8, mesh.qdata, min_bits=M.bits).bits == M.bits
    with pytest.raises(rt.PlanError, match="PoissonOperator: .*min_bits=32"):
        PoissonOperator(b8, mesh.G)
    u = np.random.default_rng(3).uniform(-1, 1, mesh.dofs.shape)
    ref = MassOperator(b8, mesh.qdata, method="float64", min_bits=0).apply(u)
    assert np.max(np.abs(M.apply(u) - ref)) <= 1e-6 * np.abs(ref).max()
    b3 = TensorBasis(3, dim=2, moduli=2)
    with pytest.raises(rt.PlanError, match="more moduli"):
        MassOperator(b3, box_mesh(b3, shape=1).qdata)


def test_operator_bad_input():
    b = TensorBasis(3)
    mesh = box_mesh(b, shape=(2, 1, 1))
    M, A = ops_for(mesh)
    with pytest.raises(ValueError, match=r"u must have shape \(nelem, 3, 3, 3\)"):
        M.apply(np.ones((2, 3, 3)))
    with pytest.raises(ValueError, match="u has 3 elements"):
        A.apply(np.ones((3, 3, 3, 3)))
    with pytest.raises(ValueError, match="decode"):
        M.apply(np.ones((2, 3, 3, 3)), decode="round")
    with pytest.raises(ValueError, match="method"):
        MassOperator(b, mesh.qdata, method="fast")
    with pytest.raises(TypeError, match="TensorBasis"):
        MassOperator(3, mesh.qdata)
    bad = mesh.qdata.copy()
    bad[1, 0, 2, 1] = -1e-3
    with pytest.raises(InvertedElementError, match=r"element 1 at quadrature point \(0, 2, 1\)"):
        MassOperator(b, bad)
    badG = mesh.G.copy()
    badG[0, 1] *= -1
    with pytest.raises(InvertedElementError, match="element 0"):
        PoissonOperator(b, badG)
    with pytest.raises(ValueError, match=r"G must have shape \(nelem, 6, 4, 4, 4\)"):
        PoissonOperator(b, mesh.G[:, :3])
    with pytest.raises(ValueError, match="non-finite"):
        MassOperator(b, np.full_like(mesh.qdata, np.nan))
    assert issubclass(InvertedElementError, ValueError)


# ----- meshes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [2, 3])
def test_box_mesh_numbering_and_geometry(dim):
    b = TensorBasis(4, dim=dim)
    shape = (3, 2, 2)[:dim]
    mesh = box_mesh(b, shape=shape, lower=-1.0, upper=(2.0, 1.0, 0.0)[:dim])
    assert mesh.ndof == np.prod([3 * n + 1 for n in shape]) and mesh.nelem == np.prod(shape)
    assert np.unique(mesh.dofs).size == mesh.ndof
    inner = np.prod([3 * n - 1 for n in shape])
    assert mesh.boundary.sum() == mesh.ndof - inner
    h = (np.array((2.0, 1.0, 0.0)[:dim]) + 1) / np.array(shape)
    assert np.allclose(mesh.detJ, np.prod(h / 2), rtol=1e-14)
    # gather and scatter are adjoint; scatter counts element multiplicities
    rng = np.random.default_rng(0)
    g, v = rng.uniform(size=mesh.ndof), rng.uniform(size=mesh.dofs.shape)
    assert np.isclose(np.vdot(mesh.gather(g), v), np.vdot(g, mesh.scatter(v)), rtol=1e-14)
    mult = mesh.scatter(np.ones(mesh.dofs.shape))
    assert mult.max() == 2**dim and mult.min() == 1
    # the nodes of every element sit where the affine map puts them
    assert np.allclose(mesh.x, mesh.coords[mesh.dofs])
    with pytest.raises(ValueError, match="u must have shape"):
        mesh.gather(np.ones(mesh.ndof + 1))
    with pytest.raises(ValueError, match="v must have shape"):
        mesh.scatter(np.ones(mesh.ndof))


def test_curved_mesh_keeps_the_box_and_inverts_clearly():
    b = TensorBasis(3)
    mesh = box_mesh(b, shape=2, curved=0.2)
    affine = box_mesh(b, shape=2)
    on = mesh.boundary
    assert np.array_equal(mesh.coords[on], affine.coords[on])  # the boundary is fixed
    assert np.max(np.abs(mesh.coords[~on] - affine.coords[~on])) > 0.01  # the interior moved
    assert np.ptp(mesh.detJ) > 1e-3  # no longer affine
    with pytest.raises(InvertedElementError, match=r"detJ <= 0 .* element \d+"):
        box_mesh(b, shape=2, curved=3.0)
    x = affine.x.copy()
    x[0] = x[0][::-1]  # a mirrored element
    with pytest.raises(InvertedElementError, match="element 0"):
        element_geometry(b, x)


@pytest.mark.parametrize("kw,match", [({"shape": 0}, "shape"), ({"shape": (2, 2)}, "shape"),
                                      ({"lower": 1.0, "upper": 1.0}, "upper must exceed"),
                                      ({"curved": np.inf}, "curved"), ({"upper": (1.0, np.nan, 1.0)}, "upper")])
def test_box_mesh_bad_input(kw, match):
    with pytest.raises(ValueError, match=match):
        box_mesh(TensorBasis(2), **kw)


@pytest.mark.parametrize("dim,P", [(2, 2), (2, 3), (2, 5), (3, 2), (3, 3)])
def test_linear_patch_test_on_curved_meshes(dim, P):
    """x_c is in the isoparametric space and a(x_c, v) = int dv/dx_c = 0 for every interior v (exact quadrature)."""
    b = TensorBasis(P, dim=dim, Q=max(P + 1, -(-(dim * (P - 1) + 1) // 2)))
    mesh = box_mesh(b, shape=3, curved=0.2)
    A = PoissonOperator(b, mesh.G)
    interior = ~mesh.boundary
    for c in range(dim):
        r = mesh.scatter(A.apply(mesh.gather(mesh.coords[:, c])))
        assert np.max(np.abs(r[interior])) <= 1e-13, c
        assert np.max(np.abs(r[mesh.boundary])) > 1e-3  # the boundary rows carry the flux: not vacuous
    # a wrong metric (the transposed Jacobian) fails it
    g = mesh.geometry
    Jt = np.swapaxes(g.J, -1, -2)
    Jinv = np.linalg.inv(Jt)
    full = np.einsum("...ik,...jk->...ij", Jinv, Jinv) * g.qdata[..., None, None]
    G = np.stack([full[..., i, j] for i, j in ([(0, 0), (1, 1), (0, 1)] if dim == 2 else
                                              [(0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1)])], axis=1)
    r = mesh.scatter(PoissonOperator(b, G).apply(mesh.gather(mesh.coords[:, 0])))
    assert np.max(np.abs(r[interior])) > 1e-6


def test_wide_encoding_on_a_larger_basis():
    b = TensorBasis(4, moduli=20)
    mesh = box_mesh(b, shape=(2, 1, 1), curved=0.1)
    u = np.random.default_rng(4).uniform(-1, 1, mesh.dofs.shape)
    for op, field in ((MassOperator, mesh.qdata), (PoissonOperator, mesh.G)):
        A53, A64 = op(b, field, bits=53), op(b, field, bits=64)
        assert A53.bits == 53 and A64.bits == 64
        y53, y64 = A53.apply(u, decode="exact"), A64.apply(u, decode="exact")
        scale = np.abs(y53).max()
        assert np.max(np.abs(y64 - y53)) <= 8 * EPS * scale
        assert A64.error_bound(u).max() < A53.error_bound(u).max()
    with pytest.raises(rt.PlanError, match="b = 90"):
        MassOperator(b, mesh.qdata, bits=90)


def test_elements_of_extreme_magnitudes_keep_their_accuracy():
    """Each element is encoded with its own exponent: 1e-300 and 1e300 elements stay float64-accurate."""
    b = TensorBasis(3, dim=2)
    mesh = box_mesh(b, shape=(2, 2), curved=0.1)
    u = np.random.default_rng(5).uniform(-1, 1, mesh.dofs.shape)
    u[0] *= 1e-300
    u[1] *= 1e300
    for op, kind, field in ((MassOperator, "mass", mesh.qdata), (PoissonOperator, "poisson", mesh.G)):
        A = op(b, field)
        ref = exact_apply(kind, b, field, u)
        y = A.apply(u, decode="exact")
        err, bound = max_err(y, ref), A.error_bound(u, decode="exact")
        scale = [max(abs(ref[e]).reshape(-1)) for e in range(mesh.nelem)]
        assert all(Fraction(bd) >= er for bd, er in zip(bound.tolist(), err))
        assert all(er <= 4 * Fraction(EPS) * s for er, s in zip(err, scale))
        assert all(Fraction(bd) <= Fraction(1, 10**11) * s for bd, s in zip(bound.tolist(), scale))


def test_error_bound_with_huge_fields_and_tiny_fields_of_u():
    """Geometric fields near 2^1000 and u near the subnormal range: a finite bound that holds (it was inf), inf on overflow."""
    b = TensorBasis(3, dim=2)
    mesh = box_mesh(b, shape=2, curved=0.1)
    rng = np.random.default_rng(8)
    u = np.ldexp(rng.uniform(-1, 1, mesh.dofs.shape), -1040)
    for kind, op in (("mass", MassOperator(b, mesh.qdata * 2.0**1000)), ("poisson", PoissonOperator(b, mesh.G * 2.0**990))):
        field = op.qdata if kind == "mass" else op.G
        bound = op.error_bound(u)
        assert np.isfinite(bound).all()
        err = max_err(op.apply(u), exact_apply(kind, b, field, u))
        assert all(e <= Fraction(float(c)) for e, c in zip(err, bound)), (kind, err, bound)
        with np.errstate(over="ignore"):
            big = np.ones(mesh.dofs.shape) * 2.0**100
            assert np.isinf(op.apply(big)).any() and (op.error_bound(big) == np.inf).all()


def test_run_program_checks_its_input():
    """``run_program`` (public: a benchmark's step timer) checks the values as ``apply`` does: the runtime encodes
    what it is handed as it is."""
    b = TensorBasis(3)
    mesh = box_mesh(b, shape=(1, 1, 2), curved=0.1)
    M = MassOperator(b, mesh.qdata)
    u = np.random.default_rng(4).uniform(-1, 1, mesh.dofs.shape)
    assert M.run_program(u)[M.program.out].planes.shape[1:] == u.shape
    u[0, 1, 1, 1] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        M.run_program(u)
    with pytest.raises(ValueError, match="non-finite"):
        M.apply(u)
