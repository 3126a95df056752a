"""Unstructured hexahedral meshes through meshio: against scikit-fem's assembly and solve, orientation, ordering, tags, I/O."""

from __future__ import annotations

import itertools

import meshio
import numpy as np
import pytest
import scipy.sparse.linalg as sla
from scipy.spatial import cKDTree

skfem = pytest.importorskip("skfem")
import skfem.io  # noqa: E402
from skfem.models.poisson import laplace, mass  # noqa: E402

from rnstensor.fem import (  # noqa: E402
    HEX_NODES,
    InvertedElementError,
    PoissonOperator,
    TensorBasis,
    box_mesh,
    gll,
    read_mesh,
)

AFFINE = np.array([[1.0, 0.3, 0.1], [0.0, 0.9, -0.2], [0.1, 0.0, 1.2]])


# ----- meshes -----------------------------------------------------------------------------------

def cube_symmetries(proper: bool):
    """The 24 rotations (``proper``) or 24 improper symmetries of the cube, as integer 3 x 3 matrices."""
    out = []
    for perm in itertools.permutations(range(3)):
        for signs in itertools.product((1, -1), repeat=3):
            R = np.zeros((3, 3), dtype=int)
            R[range(3), perm] = signs
            if (round(np.linalg.det(R)) == 1) == proper:
                out.append(R)
    return out


def lattice_perm(ctype: str, R) -> list:
    """Node k of the transformed cell is the old node at ``R`` applied to node k's lattice position."""
    n, L = HEX_NODES[ctype]
    moved = ((2 * L - n) @ np.asarray(R).T + n) // 2
    return [int(np.flatnonzero((L == q).all(axis=1))[0]) for q in moved]


def structured(ne, ctype="hexahedron", *, A=None, warp=0.0, seed=0, rotate=True, shape=None):
    """A grid of the unit cube (``ne`` cells a side), optionally warped (the boundary kept) and mapped by ``A``,
    with shuffled point ids, shuffled cells and every cell rotated at random: a mesh as a generator writes it."""
    shape = shape or (ne,) * 3
    n, L = HEX_NODES[ctype]
    grids = np.meshgrid(*[np.arange(k * n + 1) / (k * n) for k in shape], indexing="ij")
    pts = np.stack(grids, axis=-1).reshape(-1, 3)
    idx = np.arange(pts.shape[0]).reshape([k * n + 1 for k in shape])
    cells = np.array([[idx[ex * n + a, ey * n + b, ez * n + c] for a, b, c in L]
                      for ex, ey, ez in itertools.product(*map(range, shape))])
    if warp:  # component c moves with sin(pi x_c): zero on the faces x_c = 0, 1, so the box stays a box
        pts = pts + warp * 0.1 * np.sin(np.pi * pts[:, [1, 2, 0]]) * np.sin(np.pi * pts)
    if A is not None:
        pts = pts @ np.asarray(A).T
    rng = np.random.default_rng(seed)
    new = rng.permutation(pts.shape[0])
    shuffled = np.empty_like(pts)
    shuffled[new] = pts
    cells = new[cells][rng.permutation(len(cells))]
    if rotate:
        rots = cube_symmetries(True)
        for e in range(len(cells)):
            cells[e] = cells[e][lattice_perm(ctype, rots[rng.integers(len(rots))])]
    return meshio.Mesh(shuffled, [(ctype, cells)])


def match(coords, other):
    """``perm`` with ``other[perm] == coords`` (both sets of node coordinates, to rounding)."""
    dist, perm = cKDTree(other).query(coords)
    assert dist.max() < 1e-12
    assert len(np.unique(perm)) == len(perm)
    return perm


def skfem_system(mm, p: int, Q: int):
    """scikit-fem's own reading of the meshio mesh, its Q_p basis with the same Gauss rule (``Q`` points a side)."""
    sm = skfem.io.from_meshio(mm)
    element = {1: skfem.ElementHex1(), 2: skfem.ElementHex2()}[p]
    return skfem.Basis(sm, element, intorder=2 * Q - 1)  # ceil((intorder + 1) / 2) = Q Gauss points a side


def rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


# ----- against scikit-fem ---------------------------------------------------------------------------

@pytest.mark.parametrize("ctype,p,warp", [
    ("hexahedron", 1, 0.0), ("hexahedron", 1, 1.0), ("hexahedron", 2, 0.0), ("hexahedron", 2, 1.0),
    ("hexahedron27", 2, 0.0), ("hexahedron27", 2, 1.0), ("hexahedron27", 1, 1.0),
])
def test_operators_match_scikit_fem(ctype, p, warp):
    # affine-but-unstructured (warp=0) and curved (trilinear or triquadratic) cells; both codes use the same
    # tensor Gauss rule, so even the curved cells' rational integrands agree to rounding
    mm = structured(3 if p == 1 else 2, ctype, A=AFFINE, warp=warp, seed=p)
    mesh = read_mesh(mm, degree=p)
    sb = skfem_system(mm, p, mesh.basis.Q)
    assert mesh.ndof == sb.N
    perm = match(mesh.coords, sb.doflocs.T)
    K = laplace.assemble(sb)[perm][:, perm]
    M = mass.assemble(sb)[perm][:, perm]
    rng = np.random.default_rng(0)
    for op, S in ((mesh.poisson(), K), (mesh.mass(), M)):
        for _ in range(3):
            v = rng.standard_normal(mesh.ndof)
            y = op.as_linear_operator() @ v
            # float64 accuracy: a few units of rounding of |S| |v|
            assert np.abs(y - S @ v).max() <= 1e-14 * np.abs(abs(S) @ np.abs(v)).max() * 10
        assert rel(op.diagonal(), S.diagonal()) < 1e-14 * 10
        assert rel(op.assemble().toarray(), S.toarray()) < 1e-14 * 10
    assert abs(mesh.volume - abs(np.linalg.det(AFFINE))) < 1e-14


def test_dirichlet_solve_matches_scikit_fem():
    mm = structured(3, "hexahedron27", A=AFFINE, warp=1.0, seed=3)
    mesh = read_mesh(mm, degree=2)
    sb = skfem_system(mm, 2, mesh.basis.Q)
    perm = match(mesh.coords, sb.doflocs.T)

    def f(x):  # x: (..., 3)
        return np.sin(x[..., 0]) + x[..., 1] * x[..., 2]

    def g(x):
        return 1.0 + x[..., 0] - 2 * x[..., 2] ** 2

    @skfem.LinearForm
    def load(v, w):
        return f(np.moveaxis(np.asarray(w.x), 0, -1)) * v

    K = laplace.assemble(sb)
    b = load.assemble(sb)
    D = sb.get_dofs().all()
    x = np.zeros(sb.N)
    x[D] = g(sb.doflocs.T[D])
    ref = skfem.solve(*skfem.condense(K, b, x=x, D=D))[perm]

    A = mesh.poisson()
    fixed = mesh.boundary_dofs()
    assert np.array_equal(np.flatnonzero(fixed), np.sort(np.argsort(perm)[D]))  # the same boundary nodes
    bl = mesh.load_vector(f)
    assert rel(bl, b[perm]) < 1e-13
    rhs = A.dirichlet_rhs(bl, fixed, values=g)
    u, info = sla.cg(A.as_linear_operator(dirichlet=fixed), rhs, rtol=1e-13, maxiter=500, M=A.jacobi(fixed))
    assert info == 0
    assert rel(u, ref) < 1e-10
    assert np.abs(u[fixed] - g(mesh.coords[fixed])).max() < 1e-12


# ----- orientation, numbering, node ordering ------------------------------------------------------------

def two_cells(ctype, rot0, R1):
    """Two curved cells filling [0, 2] x [0, 1]^2 about, sharing a face; cell 0 rotated by ``rot0``, cell 1
    transformed by ``R1``."""
    mm = structured(1, ctype, shape=(2, 1, 1), rotate=False)
    cells = mm.cells[0].data.copy()
    cells[0] = cells[0][lattice_perm(ctype, rot0)]
    cells[1] = cells[1][lattice_perm(ctype, R1)]
    pts = mm.points * [2.0, 1.0, 1.0] + 0.2 * np.sin(3 * mm.points[:, [1, 2, 0]])  # curved, the face still shared
    return meshio.Mesh(pts, [(ctype, cells)])


@pytest.mark.parametrize("ctype,p", [("hexahedron", 3), ("hexahedron27", 4)])
def test_every_rotation_gives_the_same_global_operator(ctype, p):
    rots = cube_symmetries(True)
    basis = TensorBasis(p + 1)
    ref = None
    for k, R in enumerate(rots):
        mesh = read_mesh(two_cells(ctype, rots[(5 * k) % 24], R), basis=basis)
        assert mesh.ndof == (2 * p + 1) * (p + 1) ** 2  # the shared face counted once: conforming
        # every element node is the global node at the same place
        assert np.abs(mesh.coords[mesh.dofs] - mesh.x).max() < 1e-14
        A = mesh.poisson(method="float64").assemble().toarray()
        if ref is None:
            ref, ref_coords = A, mesh.coords
            continue
        perm = match(mesh.coords, ref_coords)
        assert rel(A, ref[np.ix_(perm, perm)]) < 1e-13, k


@pytest.mark.parametrize("ctype", ["hexahedron", "hexahedron27"])
@pytest.mark.parametrize("p", [2, 5])
def test_numbering_of_shuffled_rotated_grids(ctype, p):
    # a 2 x 2 x 2 grid, cells in random order and orientation: the continuous space has (2p + 1)^3 nodes
    mesh = read_mesh(structured(2, ctype, warp=1.0, seed=p), degree=p)
    m = 2 * p + 1
    assert mesh.ndof == m**3 and int(mesh.boundary.sum()) == m**3 - (m - 2) ** 3
    assert np.abs(mesh.coords[mesh.dofs] - mesh.x).max() < 1e-14
    assert len(np.unique(mesh.dofs[0])) == (p + 1) ** 3


def test_mirrored_cells_raise_or_are_reoriented():
    rots = cube_symmetries(True)
    good = read_mesh(two_cells("hexahedron27", rots[0], rots[0]), degree=3)
    for R in cube_symmetries(False)[::5]:
        mm = two_cells("hexahedron27", rots[0], R)
        with pytest.raises(InvertedElementError, match="reorient=True"):
            read_mesh(mm, degree=3)
        mesh = read_mesh(mm, degree=3, reorient=True)
        assert mesh.reoriented.tolist() == [1]
        perm = match(mesh.coords, good.coords)
        A, ref = mesh.poisson().assemble().toarray(), good.poisson().assemble().toarray()
        assert rel(A, ref[np.ix_(perm, perm)]) < 1e-13


def triquadratic(xi):
    """A fixed curved map of [-1, 1]^3, triquadratic in xi (so 27-node cells represent it exactly)."""
    x, y, z = xi[..., 0], xi[..., 1], xi[..., 2]
    return np.stack([2 + x + 0.1 * y * y + 0.05 * x * z, 1 + 0.8 * y + 0.1 * x * x * z, 0.5 * z + 0.1 * x * y * y],
                    axis=-1)


def triquadratic_jacobian(xi):
    x, y, z = xi[..., 0], xi[..., 1], xi[..., 2]
    J = np.zeros(xi.shape + (3,))
    J[..., 0, 0], J[..., 0, 1], J[..., 0, 2] = 1 + 0.05 * z, 0.2 * y, 0.05 * x
    J[..., 1, 0], J[..., 1, 1], J[..., 1, 2] = 0.2 * x * z, 0.8 + 0 * x, 0.1 * x * x
    J[..., 2, 0], J[..., 2, 1], J[..., 2, 2] = 0.1 * y * y, 0.2 * x * y, 0.5 + 0 * x
    return J


# VTK's vtkTriQuadraticHexahedron parametric coordinates (in [0, 1]^3), point by point, as VTK documents them
VTK_HEX27 = [(0, 0, 0), (1, 0, 0), (1, 1, 0), (0, 1, 0), (0, 0, 1), (1, 0, 1), (1, 1, 1), (0, 1, 1),
             (.5, 0, 0), (1, .5, 0), (.5, 1, 0), (0, .5, 0), (.5, 0, 1), (1, .5, 1), (.5, 1, 1), (0, .5, 1),
             (0, 0, .5), (1, 0, .5), (1, 1, .5), (0, 1, .5),
             (0, .5, .5), (1, .5, .5), (.5, 0, .5), (.5, 1, .5), (.5, .5, 0), (.5, .5, 1), (.5, .5, .5)]
# gmsh's 27-node hexahedron (element type 12) in its own order: corners, edges 0-1 0-3 0-4 1-2 1-5 2-3 2-6 3-7
# 4-5 4-7 5-6 6-7, faces 0321 0154 0473 1265 2376 4567, centre (gmsh manual, "Node ordering")
GMSH_HEX27 = [(0, 0, 0), (1, 0, 0), (1, 1, 0), (0, 1, 0), (0, 0, 1), (1, 0, 1), (1, 1, 1), (0, 1, 1),
              (.5, 0, 0), (0, .5, 0), (0, 0, .5), (1, .5, 0), (1, 0, .5), (.5, 1, 0), (1, 1, .5), (0, 1, .5),
              (.5, 0, 1), (0, .5, 1), (1, .5, 1), (.5, 1, 1),
              (.5, .5, 0), (.5, 0, .5), (0, .5, .5), (1, .5, .5), (.5, 1, .5), (.5, .5, 1), (.5, .5, .5)]


def check_geometry(mesh, order):
    b = mesh.basis
    q = np.stack(np.meshgrid(b.points, b.points, b.points, indexing="ij"), axis=-1)
    assert np.abs(mesh.xq[0] - triquadratic(q)).max() < 1e-14
    assert np.abs(mesh.geometry.J[0] - triquadratic_jacobian(q)).max() < 1e-14
    assert abs(mesh.volume - np.sum(b.qweights * np.linalg.det(triquadratic_jacobian(q)))) < 1e-14
    assert order == mesh.order


def test_node_ordering_conventions(tmp_path):
    # the hexahedron27 nodes at VTK's documented positions: the geometry is the map, exactly
    pts = triquadratic(2 * np.array(VTK_HEX27, dtype=float) - 1)
    check_geometry(read_mesh(meshio.Mesh(pts, [("hexahedron27", [list(range(27))])]), degree=3), 2)
    # a gmsh file written by hand in gmsh's own order (meshio permutes it to VTK's)
    gp = triquadratic(2 * np.array(GMSH_HEX27, dtype=float) - 1)
    lines = ["$MeshFormat", "2.2 0 8", "$EndMeshFormat", "$Nodes", "27"]
    lines += [f"{k + 1} {x!r} {y!r} {z!r}" for k, (x, y, z) in enumerate(gp.tolist())]
    lines += ["$EndNodes", "$Elements", "1", "1 12 2 1 1 " + " ".join(str(k + 1) for k in range(27)), "$EndElements"]
    path = tmp_path / "hex27.msh"
    path.write_text("\n".join(lines) + "\n")
    check_geometry(read_mesh(path, degree=2), 2)
    # the 8-node hexahedron: corners of a trilinear map, VTK's (= gmsh's) corner order
    corners = np.array(VTK_HEX27[:8], dtype=float)
    tri = corners + 0.1 * corners[:, [1, 2, 0]] * corners[:, [2, 0, 1]]
    mesh = read_mesh(meshio.Mesh(tri, [("hexahedron", [list(range(8))])]), degree=2)
    assert np.abs(mesh.coords[mesh.dofs[0, [0, -1]][:, [0, -1]][:, :, [0, -1]].reshape(-1)]
                  - tri[[0, 4, 3, 7, 1, 5, 2, 6]]).max() == 0  # lattice (a, b, c) in C order
    b = mesh.basis
    s = (np.stack(np.meshgrid(b.points, b.points, b.points, indexing="ij"), axis=-1) + 1) / 2
    assert np.abs(mesh.xq[0] - (s + 0.1 * s[..., [1, 2, 0]] * s[..., [2, 0, 1]])).max() < 1e-15  # the trilinear map


def test_high_degree_energy_on_affine_unstructured_mesh():
    # u^T A u = int |grad u|^2 and u^T M u = int u^2 for a degree-p polynomial u: exact for the FE space iff the
    # global numbering is conforming; the oracle integrates over the parallelepiped A [0, 1]^3 by its own rule
    mm = structured(2, "hexahedron", A=AFFINE, seed=7)
    x, w = np.polynomial.legendre.leggauss(8)
    x, w = (x + 1) / 2, w / 2
    xi = np.stack(np.meshgrid(x, x, x, indexing="ij"), axis=-1).reshape(-1, 3)
    wq = np.einsum("i,j,k->ijk", w, w, w).reshape(-1) * abs(np.linalg.det(AFFINE))
    X = xi @ AFFINE.T
    for p in (3, 4):
        c = np.arange(1, 4) / 7.0

        def u(y):
            return (y @ c) ** p + y[..., 0] * y[..., 1] ** (p - 1) - y[..., 2]

        def grad(y):
            s = p * (y @ c)[..., None] ** (p - 1) * c
            s[..., 0] += y[..., 1] ** (p - 1)
            s[..., 1] += (p - 1) * y[..., 0] * y[..., 1] ** (p - 2)
            s[..., 2] -= 1
            return s

        mesh = read_mesh(mm, degree=p)
        v = u(mesh.coords)
        energy = np.sum(wq * (grad(X) ** 2).sum(axis=-1))
        l2 = np.sum(wq * u(X) ** 2)
        assert abs(v @ mesh.poisson().apply(v) - energy) < 1e-12 * energy
        assert abs(v @ mesh.mass().apply(v) - l2) < 1e-12 * l2
        # u is in the space: its interpolant at the quadrature points is u there, its load vector M u
        assert np.abs(mesh.at_quadrature(v) - u(mesh.xq)).max() < 1e-12 * np.abs(v).max()
        assert rel(mesh.load_vector(u), mesh.mass().apply(v)) < 1e-12


def test_diagonal_is_the_assembled_diagonal():
    mm = structured(2, "hexahedron27", warp=1.0, seed=4)
    mesh = read_mesh(mm, degree=3)
    for A in (mesh.poisson(), mesh.mass()):
        L = A.as_linear_operator()
        cols = np.stack([L @ e for e in np.eye(mesh.ndof)], axis=1)  # the matrix-free operator, column by column
        assert rel(A.diagonal(), np.diag(cols)) < 1e-14
        assert rel(A.diagonal(), A.assemble().diagonal()) < 1e-15
        fixed = mesh.boundary_dofs()
        dd = A.diagonal(fixed)
        assert np.all(dd[fixed] == 1.0) and np.array_equal(dd[~fixed], A.diagonal()[~fixed])
        Ld = A.as_linear_operator(dirichlet=fixed)
        e = np.zeros(mesh.ndof)
        k = int(np.flatnonzero(fixed)[0])
        e[k] = 1.0
        assert np.array_equal(Ld @ e, e)  # identity on a constrained node, no coupling
        assert np.allclose(Ld.matvec(np.ones(mesh.ndof))[fixed], 1.0)


# ----- boundary conditions ---------------------------------------------------------------------------

def tagged_cube():
    """A 2 x 2 x 2 cube mesh with the face x = 0 as quads (physical 'left' = 7) and the edge x = y = 0 as lines."""
    mm = structured(2, "hexahedron", seed=5)
    pts = mm.points
    hexes = mm.cells[0].data
    quads, lines = [], []
    for cell in hexes:
        for f in ([0, 3, 7, 4], [1, 2, 6, 5], [0, 1, 5, 4], [3, 2, 6, 7], [0, 1, 2, 3], [4, 5, 6, 7]):
            if np.all(pts[cell[f], 0] == 0):
                quads.append(cell[f])
        for a, b in ((0, 1), (1, 2), (2, 3), (3, 0), (4, 5), (5, 6), (6, 7), (7, 4), (0, 4), (1, 5), (2, 6), (3, 7)):
            if np.all(pts[cell[[a, b]], :2] == 0):
                lines.append(cell[[a, b]])
    cells = [("hexahedron", hexes), ("quad", np.array(quads)), ("line", np.unique(np.sort(lines, axis=1), axis=0))]
    phys = [np.full(len(hexes), 1), np.full(len(quads), 7), np.full(len(cells[2][1]), 8)]
    return meshio.Mesh(pts, cells, cell_data={"gmsh:physical": phys, "gmsh:geometrical": phys},
                       field_data={"volume": np.array([1, 3]), "left": np.array([7, 2]), "edge": np.array([8, 1])})


def test_dirichlet_by_tag_predicate_and_points(tmp_path):
    path = tmp_path / "cube.msh"
    meshio.write(path, tagged_cube(), file_format="gmsh22", binary=False)
    mesh = read_mesh(path, degree=3)
    x = mesh.coords
    left = x[:, 0] == 0
    on_box = np.any((x == 0) | (x == 1), axis=1)
    assert np.array_equal(mesh.boundary, on_box) and np.array_equal(mesh.boundary_dofs(), on_box)
    assert left.sum() == 7 * 7
    assert np.array_equal(mesh.boundary_dofs("left"), left)
    assert np.array_equal(mesh.boundary_dofs(7), left)
    assert np.array_equal(mesh.boundary_dofs(lambda y: y[:, 0] < 1e-12), left)
    assert np.array_equal(mesh.boundary_dofs("edge"), left & (x[:, 1] == 0))
    assert np.array_equal(mesh.boundary_dofs(["edge", "left"]), left)
    assert np.array_equal(mesh.boundary_dofs(mesh.points[:, 0] == 0), left)  # tagged mesh points
    assert np.array_equal(mesh.boundary_dofs(np.flatnonzero(mesh.points[:, 0] == 0)), left)
    assert np.array_equal(mesh.boundary_dofs("volume"), np.ones(mesh.ndof, bool))  # the closure of all cells
    # cell sets of a meshio.Mesh (as other readers give them)
    m = tagged_cube()
    m.cell_sets = {"left": [np.array([], dtype=int), np.arange(len(m.cells[1].data)), np.array([], dtype=int)]}
    m.point_data = {"wall": (m.points[:, 0] == 0).astype(np.int32)}  # tagged points as point data
    again = read_mesh(m, degree=3)
    assert np.array_equal(again.boundary_dofs("left"), left) and np.array_equal(again.boundary_dofs("wall"), left)
    # fixed on x = 0 only, Neumann elsewhere: u = 1 + x solves -Laplace u = 0, u = 1 on x = 0, du/dn = 1 on
    # x = 1 and 0 on the other faces; the discrete solution is exact (u is in the space)
    A = mesh.poisson()
    rhs = A.dirichlet_rhs(face_load(mesh, x[:, 0] == 1), "left", values=1.0)
    assert np.array_equal(rhs, A.dirichlet_rhs(face_load(mesh, x[:, 0] == 1), left, values=np.ones(mesh.ndof)))
    u, info = sla.cg(A.as_linear_operator("left"), rhs, rtol=1e-13, M=A.jacobi(np.flatnonzero(left)))
    assert info == 0 and np.abs(u - (1 + x[:, 0])).max() < 1e-9
    assert np.array_equal(A.constrained(7), left) and np.array_equal(A.constrained(lambda y: y[:, 0] < 1e-12), left)


def face_load(mesh, face):
    """``int v`` over the face x = 1 of the unit cube for every global node: on that square the nodes form a
    tensor grid of GLL points of the cells, and ``int l_j`` of a GLL Lagrange polynomial is its GLL weight."""
    _, wg = gll(mesh.basis.P)
    p = mesh.basis.P - 1
    yz = mesh.coords[face][:, 1:]
    out = np.zeros(mesh.ndof)
    w1 = []
    for t in (np.unique(yz[:, 0]), np.unique(yz[:, 1])):
        w = np.zeros(len(t))
        for c in range(0, len(t) - 1, p):
            w[c:c + p + 1] += wg * (t[c + p] - t[c]) / 2
        w1.append((t, w))
    (ty, wy), (tz, wz) = w1
    out[np.flatnonzero(face)] = wy[np.searchsorted(ty, yz[:, 0])] * wz[np.searchsorted(tz, yz[:, 1])]
    return out


def test_topological_boundary_of_a_curved_domain():
    mesh = read_mesh("examples/data/quarter_shell.msh", degree=2)
    r = np.hypot(mesh.coords[:, 0], mesh.coords[:, 1])
    on = (np.abs(r - 1) < 1e-12) | (np.abs(r - 2) < 1e-12) | (np.abs(mesh.coords) < 1e-12).any(axis=1) | (
        np.abs(mesh.coords[:, 2] - 1) < 1e-12)
    assert np.array_equal(mesh.boundary, on)  # the nodes of the 27-node cells lie on the exact surfaces
    assert abs(mesh.volume - 0.75 * np.pi) < 1e-4


# ----- I/O ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix,kw", [(".vtu", {}), (".vtk", {}), (".msh", {"file_format": "gmsh", "binary": True})])
def test_write_and_read_back(tmp_path, suffix, kw):
    mm = structured(2, "hexahedron27", warp=1.0, seed=6)
    mesh = read_mesh(mm, degree=3)
    u = np.sin(mesh.coords).sum(axis=1)
    path = tmp_path / f"u{suffix}"
    mesh.write(path, {"u": u}, **kw)
    back = meshio.read(path)
    again = read_mesh(path, degree=3)
    perm = match(again.coords, mesh.coords)
    assert rel(again.poisson(method="float64").assemble().toarray(),
               mesh.poisson(method="float64").assemble().toarray()[np.ix_(perm, perm)]) < 1e-13
    vals = back.point_data["u"].reshape(-1)
    # at the vertices: the nodal values themselves (corner nodes are global nodes)
    corner = mesh.dofs[:, [0, -1]][:, :, [0, -1]][:, :, :, [0, -1]].reshape(mesh.nelem, 8)
    lat = HEX_NODES["hexahedron27"][1][:8] // 2
    order = [int(np.flatnonzero((lat == (a, b, c)).all(axis=1))[0]) for a, b, c in itertools.product((0, 1), repeat=3)]
    assert np.array_equal(vals[mesh.cells[:, :8][:, order]], u[corner])
    # at the edge and face nodes: the degree-3 function there, close to sin since it is interpolated
    used = np.unique(mesh.cells)
    assert np.abs(vals[used] - np.sin(mesh.points[used]).sum(axis=1)).max() < 1e-3
    if suffix == ".vtu":
        mesh.write(tmp_path / "fine.vtu", {"u": u}, refined=True)
        ref = meshio.read(tmp_path / "fine.vtu")
        assert ref.cells[0].type == "hexahedron" and len(ref.cells[0].data) == mesh.nelem * 27
        assert np.array_equal(ref.point_data["u"].reshape(-1), u) and np.array_equal(ref.points, mesh.coords)
        fine = read_mesh(ref, degree=1)  # the sub-cells are valid (positively oriented) trilinear hexahedra
        assert abs(fine.volume - mesh.volume) < 1e-3


def test_refine_keeps_the_geometry():
    mesh = read_mesh("examples/data/quarter_shell.msh", degree=2)
    fine = mesh.refine()
    assert fine.nelem == 8 * mesh.nelem and fine.cell_type == "hexahedron27"
    assert abs(fine.volume - mesh.volume) < 1e-13  # the same triquadratic map, integrated exactly by both
    q1 = read_mesh(structured(2, "hexahedron", warp=1.0), degree=1)
    assert abs(q1.refine().volume - q1.volume) < 1e-14


def test_box_mesh_operator_on_scipy_cg():
    mesh = box_mesh(TensorBasis(4), shape=2, curved=0.1)
    A = PoissonOperator.on(mesh)
    fixed = mesh.boundary_dofs()
    b = A.dirichlet_rhs(mesh.load_vector(lambda x: np.ones(x.shape[:-1])), fixed)
    u, info = sla.cg(A.as_linear_operator(fixed), b, rtol=1e-12, M=A.jacobi(fixed))
    ref = np.linalg.solve(A.assemble(fixed).toarray(), b)
    assert info == 0 and rel(u, ref) < 1e-9


# ----- errors -----------------------------------------------------------------------------------------

def test_bad_meshes_and_arguments(tmp_path):
    good = structured(1, "hexahedron", rotate=False)
    pts, hexa = good.points, good.cells[0].data
    with pytest.raises(ValueError, match="tetra"):
        read_mesh(meshio.Mesh(pts, [("hexahedron", hexa), ("tetra", [[0, 1, 2, 4]])]))
    with pytest.raises(ValueError, match="no hexahedron"):
        read_mesh(meshio.Mesh(pts, [("quad", [[0, 1, 2, 3]])]))
    q2 = structured(1, "hexahedron27", rotate=False)
    with pytest.raises(ValueError, match="mixes"):
        read_mesh(meshio.Mesh(q2.points, [("hexahedron27", q2.cells[0].data), ("hexahedron", [list(range(8))])]))
    bad = pts.copy()
    corner = hexa[0, 6]
    bad[corner] = [-0.4, -0.4, -0.4]  # pulled through the opposite corner: detJ changes sign inside the cell
    with pytest.raises(InvertedElementError, match="quadrature point.s., the first in element 0"):
        read_mesh(meshio.Mesh(bad, [("hexahedron", hexa)]))
    with pytest.raises(ValueError, match="point ids"):
        read_mesh(meshio.Mesh(pts, [("hexahedron", hexa + 1)]))
    with pytest.raises(InvertedElementError, match="reorient=True"):
        read_mesh(meshio.Mesh(pts, [("hexahedron", hexa[:, [4, 5, 6, 7, 0, 1, 2, 3]])]))
    with pytest.raises(ValueError, match="repeat a vertex"):
        read_mesh(meshio.Mesh(pts, [("hexahedron", [[0, 1, 2, 3, 0, 5, 6, 7]])]))
    two = meshio.Mesh(np.vstack([pts, pts[hexa[0][7]]]), [("hexahedron", np.vstack([hexa, [list(hexa[0][:7]) + [len(pts)]]]))])
    with pytest.raises(ValueError, match="duplicate"):
        read_mesh(two)
    with pytest.raises(ValueError, match="degree"):
        read_mesh(good, degree=0)
    with pytest.raises(ValueError, match="not both"):
        read_mesh(good, degree=2, basis=TensorBasis(3))
    with pytest.raises(TypeError, match="3-D"):
        read_mesh(good, basis=TensorBasis(3, dim=2))
    with pytest.raises(TypeError, match="source"):
        read_mesh(42)
    mesh = read_mesh(tagged_cube(), degree=2)
    A = mesh.poisson()
    with pytest.raises(ValueError, match="names no cell set"):
        mesh.boundary_dofs("right")
    with pytest.raises(ValueError, match="no cell has"):
        mesh.boundary_dofs(99)
    with pytest.raises(ValueError, match="booleans"):
        mesh.boundary_dofs(lambda x: x[:, 0])
    with pytest.raises(ValueError, match="shape"):
        A.as_linear_operator(dirichlet=np.ones(3, dtype=bool))
    with pytest.raises(ValueError, match=r"\[0, "):
        A.diagonal(dirichlet=np.array([mesh.ndof]))
    with pytest.raises(ValueError, match="one value per global node"):
        A.apply(np.ones(mesh.ndof + 1))
    with pytest.raises(TypeError, match="real"):
        A.as_linear_operator() @ np.ones(mesh.ndof, dtype=complex)
    with pytest.raises(TypeError, match="boolean mask"):
        A.as_linear_operator(dirichlet=np.ones(mesh.ndof))
    with pytest.raises(ValueError, match="one value per quadrature point"):
        mesh.load_vector(lambda x: x)
    with pytest.raises(ValueError, match="one value per global node"):
        mesh.write(tmp_path / "x.vtu", {"u": np.ones(2)})
    # a 27-node mesh whose shared face has two different centre nodes at different places: not conforming
    m = structured(1, "hexahedron27", shape=(2, 1, 1), rotate=False)
    cells = m.cells[0].data.copy()
    centre = cells[0][21]  # the face x = 1 of cell 0 (meshio's node 21) is cell 1's face x = 0 (node 20)
    assert cells[1][20] == centre
    pts2 = np.vstack([m.points, m.points[centre] + [0.05, 0.0, 0.0]])
    cells[1][20] = len(m.points)
    with pytest.raises(ValueError, match="not conforming"):
        read_mesh(meshio.Mesh(pts2, [("hexahedron27", cells)]), degree=2)
