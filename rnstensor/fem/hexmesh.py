"""Unstructured hexahedral meshes read through meshio: isoparametric geometry, a conforming numbering, tags, output."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional, Union

import numpy as np

from .mesh import FEMesh, _geometry, _predicate_mask, tensor_interp_grad
from .operators import InvertedElementError
from .quadrature import lagrange_matrices
from .tensorbasis import TensorBasis

if TYPE_CHECKING:  # meshio is optional (the 'fem' extra): imported where a mesh is read or written
    import meshio

__all__ = ["HexMesh", "read_mesh", "HEX_NODES"]

#: lattice corner (a, b, c) in {0, 1}^3 of node k of a VTK / meshio / gmsh ``hexahedron``
_CORNERS = np.array([(0, 0, 0), (1, 0, 0), (1, 1, 0), (0, 1, 0), (0, 0, 1), (1, 0, 1), (1, 1, 1), (0, 1, 1)])
#: meshio's (VTK's) ``hexahedron27``: edge midpoints (nodes 8..19), then the faces x=0, x=1, y=0, y=1, z=0, z=1
_EDGES27 = [(0, 1), (1, 2), (2, 3), (3, 0), (4, 5), (5, 6), (6, 7), (7, 4), (0, 4), (1, 5), (2, 6), (3, 7)]
_FACES27 = [(0, 1, 1), (2, 1, 1), (1, 0, 1), (1, 2, 1), (1, 1, 0), (1, 1, 2)]


def _hex27() -> np.ndarray:
    c = 2 * _CORNERS
    mids = [(c[a] + c[b]) // 2 for a, b in _EDGES27]
    return np.vstack([c, mids, _FACES27, [(1, 1, 1)]])


#: per meshio cell type: (geometric order n, position in the lattice {0..n}^3 of every node, in meshio's order)
HEX_NODES = {"hexahedron": (1, _CORNERS), "hexahedron27": (2, _hex27())}

# the hexahedron's faces (corners in cyclic order: x=0, x=1, y=0, y=1, z=0, z=1) and edges (corners one step apart)
_HEX_FACES = [[0, 3, 7, 4], [1, 2, 6, 5], [0, 1, 5, 4], [3, 2, 6, 7], [0, 1, 2, 3], [4, 5, 6, 7]]
_HEX_EDGES = [(a, b) for a in range(8) for b in range(a + 1, 8) if np.abs(_CORNERS[a] - _CORNERS[b]).sum() == 1]
_QUAD_EDGES = [(0, 1), (1, 2), (2, 3), (3, 0)]
#: lower-dimensional meshio cells that can tag boundary entities: the number of corner nodes (listed first)
_TAG_CELLS = {"vertex": 1, "line": 2, "line3": 2, "quad": 4, "quad8": 4, "quad9": 4,
              "hexahedron": 8, "hexahedron27": 8}
_VOLUME_CELLS = ("tetra", "tetra10", "wedge", "wedge15", "wedge18", "pyramid", "pyramid13", "pyramid14",
                 "hexahedron20", "hexahedron24", "polyhedron")


def _unique_rows(a: np.ndarray):
    """``np.unique(a, axis=0, return_index=True, return_inverse=True, return_counts=True)`` for an integer
    matrix, by one lexicographic sort (several times faster than the structured sort of ``np.unique``)."""
    order = np.lexsort(a.T[::-1])
    s = a[order]
    new = np.ones(len(s), dtype=bool)
    new[1:] = (s[1:] != s[:-1]).any(axis=1)
    starts = np.flatnonzero(new)
    inverse = np.empty(len(a), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return s[starts], order[starts], inverse, np.diff(np.append(starts, len(a)))


def _lattice_numbering(corners: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    """A global number for every node ``(i, j, k)`` of the lattice ``{0..p}^3`` of every element.

    A node is keyed by the pairs ``(vertex, w)`` of its integer trilinear
    weights ``w = prod_c (i_c or p - i_c)`` that are nonzero: the vertices of
    the entity (vertex, edge, face, cell) it lies on and its position there.
    Mirroring the lattice along an axis maps ``i -> p - i`` and the corners
    accordingly, so the key does not depend on how an element is oriented,
    provided the 1-D node set is symmetric (GLL and equispaced nodes are).

    Returns the numbers ``(nelem, P, P, P)`` and every number's support: its
    vertex ids sorted, padded with ``-1`` to 8 (``(nnum, 8)``).
    """
    i = np.arange(p + 1)
    f = np.stack([p - i, i])  # f[a, i]: the 1-D weight of corner side a at lattice index i
    a, b, c = _CORNERS.T
    w = f[a][:, :, None, None] * f[b][:, None, :, None] * f[c][:, None, None, :]  # (8, P, P, P)
    base = p**3 + 1
    keys = np.where(w > 0, corners[:, :, None, None, None] * base + w, -1)
    keys = np.sort(np.moveaxis(keys, 1, -1).reshape(-1, 8), axis=1)
    uniq, _, inv, _ = _unique_rows(keys)
    support = np.where(uniq >= 0, uniq // base, -1)
    return inv.reshape((corners.shape[0],) + (p + 1,) * 3), support


def _rows(entities) -> np.ndarray:
    """Vertex-id tuples as sorted rows padded with ``-1`` to 8 (the layout of a support)."""
    ent = np.sort(np.asarray(entities, dtype=np.int64), axis=1)
    return np.hstack([np.full((ent.shape[0], 8 - ent.shape[1]), -1, dtype=np.int64), ent])


def _closure(corners: np.ndarray) -> np.ndarray:
    """Every vertex, edge, face and cell in the closure of cells given by their corners ``(n, k)``, as rows."""
    k = corners.shape[1]
    parts = [corners[:, [v]] for v in range(k)]
    if k == 2:
        parts.append(corners)
    elif k == 4:
        parts += [corners[:, list(e)] for e in _QUAD_EDGES] + [corners]
    elif k == 8:
        parts += [corners[:, list(e)] for e in _HEX_EDGES] + [corners[:, f] for f in _HEX_FACES] + [corners]
    return np.vstack([_rows(x) for x in parts]) if corners.size else np.empty((0, 8), dtype=np.int64)


def _geometry_matrices(order: int, points) -> tuple[np.ndarray, np.ndarray]:
    """Lagrange matrices of the equispaced nodes of the geometric order on ``[-1, 1]`` at ``points``."""
    return lagrange_matrices(np.linspace(-1.0, 1.0, order + 1), points)


def _tensor_interp(B: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``(B ⊗ B ⊗ B) x`` for element fields ``x`` of shape ``(nelem, n, n, n, ...)`` (float64)."""
    return np.einsum("ai,bj,ck,eijk...->eabc...", B, B, B, x, optimize=True)


class HexMesh(FEMesh):
    """An unstructured hexahedral mesh (``hexahedron`` or ``hexahedron27`` cells) with a continuous degree-``p`` space.

    Built by :func:`read_mesh`. The geometry is the mesh's own isoparametric
    map (trilinear for 8-node, triquadratic for 27-node cells) evaluated at
    the basis's quadrature points, whatever the degree of the basis; the
    global numbering identifies shared nodes across vertices, edges and
    faces however neighbouring cells are oriented.

    Attributes
    ----------
    basis : TensorBasis
    source : meshio.Mesh
        The mesh read (its tags, point and cell data).
    points : ndarray, shape (npoints, 3)
        The mesh's nodes.
    cell_type : {'hexahedron', 'hexahedron27'}
    cells : ndarray of int64, shape (nelem, 8 or 27)
        The hexahedra in meshio's node order (mirrored ones re-ordered when ``reorient``).
    order : int
        The geometric order (1 or 2).
    nelem, ndof : int
    dofs : ndarray of int64, shape (nelem, P, P, P)
        The global number of every element node (axis ``k`` along ``xi_k``:
        from cell node 0 towards nodes 1, 3 and 4).
    coords : ndarray, shape (ndof, 3)
        Coordinates of the global nodes.
    boundary : ndarray of bool, shape (ndof,)
        The nodes on the topological boundary (faces of only one cell).
    boundary_faces : ndarray of int64, shape (nfaces, 4)
        Those faces, as vertex ids in cyclic order.
    x : ndarray, shape (nelem, P, P, P, 3)
        Element node coordinates.
    geometry : Geometry
        ``J``, ``detJ``, ``qdata``, ``G``, ``xq`` at the quadrature points.
    reoriented : ndarray of int64
        The cells that were mirrored (empty unless ``reorient``).

    Examples
    --------
    >>> import meshio, numpy as np
    >>> from rnstensor.fem import read_mesh
    >>> cube = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1], [1, 0, 1], [1, 1, 1], [0, 1, 1.0]])
    >>> mesh = read_mesh(meshio.Mesh(cube, [("hexahedron", [list(range(8))])]), degree=2).refine()
    >>> mesh.nelem, mesh.ndof, int(mesh.boundary_dofs(lambda x: x[:, 2] == 0).sum())  # 8 cells; 25 nodes on z = 0
    (8, 125, 25)
    >>> out = mesh.to_meshio({"z": mesh.coords[:, 2]}, refined=True)  # 8 * 2**3 trilinear sub-cells
    >>> len(out.cells[0].data), float(out.point_data["z"].max())
    (64, 1.0)
    """

    def __init__(self, mesh, basis: TensorBasis, *, reorient: bool = False):
        import meshio

        if not isinstance(mesh, meshio.Mesh):
            raise TypeError(f"mesh must be a meshio.Mesh; got {type(mesh).__name__}")
        if not isinstance(basis, TensorBasis) or basis.dim != 3:
            raise TypeError(f"basis must be a 3-D rnstensor.fem.TensorBasis; got {basis!r}")
        self.source, self.basis = mesh, basis
        self.cell_type, cells = _hex_cells(mesh)
        points = np.asarray(mesh.points, dtype=np.float64)
        if points.ndim != 2 or points.shape[1] != 3:
            raise ValueError(f"the mesh's points must have shape (npoints, 3); got {points.shape}")
        if not np.isfinite(points).all():
            raise ValueError("the mesh's points must be finite")
        self.points = points
        self.order, lattice = HEX_NODES[self.cell_type]
        _check_cells(points, cells)
        self.nelem = cells.shape[0]
        n = self.order
        Bq, Dq = _geometry_matrices(n, basis.points)

        def at_quadrature(c):
            X = np.empty((c.shape[0],) + (n + 1,) * 3 + (3,))
            X[:, lattice[:, 0], lattice[:, 1], lattice[:, 2]] = points[c]
            xq, J = tensor_interp_grad(Bq, Dq, X)
            return X, xq, J

        X, xq, J = at_quadrature(cells)
        detJ = np.linalg.det(J)
        mirrored = np.flatnonzero((detJ < 0).reshape(self.nelem, -1).all(axis=1))
        if mirrored.size and not reorient:
            raise InvertedElementError(
                f"{mirrored.size} cell(s) are inverted (detJ < 0 at all their quadrature points), the first is cell "
                f"{mirrored[0]}: their nodes are in the mirror image of meshio's {self.cell_type} order; pass "
                f"reorient=True to mirror them"
            )
        if mirrored.size:
            flip = [int(np.flatnonzero((lattice == (n - a, b, c)).all(axis=1))[0]) for a, b, c in lattice]
            cells = cells.copy()
            cells[mirrored] = cells[mirrored][:, flip]
            X, xq, J = at_quadrature(cells)
        self.reoriented = mirrored
        self.cells = cells
        self.geometry = _geometry(basis, xq, J)  # raises InvertedElementError for elements inverted in part
        Bn, _ = _geometry_matrices(n, basis.nodes)
        self.x = _tensor_interp(Bn, X)
        corners = cells[:, :8].astype(np.int64)
        self.dofs, support = _lattice_numbering(corners, basis.P - 1)
        self.ndof = support.shape[0]
        coords = np.empty((self.ndof, 3))
        coords[self.dofs.reshape(-1)] = self.x.reshape(-1, 3)
        scale = float(np.abs(points[corners]).max())
        off = np.abs(coords[self.dofs] - self.x).max()
        if off > 1e-9 * scale:
            e = int(np.argmax(np.abs(coords[self.dofs] - self.x).reshape(self.nelem, -1).max(axis=1)))
            raise ValueError(
                f"the mesh is not conforming: a node shared by cells (cell {e} among them) lies at points "
                f"{off:.3g} apart in them; neighbouring cells must share their vertices, and 27-node cells also "
                f"their edge and face nodes"
            )
        self.coords = coords
        # the entities (vertices, edges, faces, cells) that the nodes lie on, for boundary and tag masks
        self._entities, _, self._node_entity, _ = _unique_rows(support)
        self._entity_index = {tuple(r): k for k, r in enumerate(self._entities.tolist())}
        faces = np.concatenate([corners[:, f] for f in _HEX_FACES])
        uniq, first, _, counts = _unique_rows(np.sort(faces, axis=1))
        if counts.max() > 2:
            raise ValueError(f"the mesh is not a manifold: {int((counts > 2).sum())} face(s) belong to more than two "
                             f"cells (the first has vertices {uniq[np.argmax(counts)].tolist()})")
        #: the faces of only one cell, ``(nfaces, 4)`` vertex ids in cyclic order
        self.boundary_faces = faces[first[counts == 1]]
        self.boundary = self._closure_mask(self.boundary_faces)

    def __repr__(self) -> str:
        return (f"HexMesh({self.basis!r}, {self.nelem} {self.cell_type} cells, ndof={self.ndof}, "
                f"{int(self.boundary.sum())} on the boundary)")

    @property
    def volume(self) -> float:
        """The volume, by the basis's quadrature."""
        return float(self.qdata.sum())

    def _closure_mask(self, corners: np.ndarray) -> np.ndarray:
        """The nodes on the closure of the cells given by their corner vertex ids ``(n, k)``."""
        hit = np.zeros(len(self._entities), dtype=bool)
        for r in _closure(np.asarray(corners, dtype=np.int64)).tolist():
            k = self._entity_index.get(tuple(r))
            if k is not None:
                hit[k] = True
        return hit[self._node_entity]

    # ----- boundary conditions ----------------------------------------------------------------

    def boundary_dofs(self, where=None) -> np.ndarray:
        """Boolean mask ``(ndof,)`` of the nodes of a boundary part (for Dirichlet conditions).

        Parameters
        ----------
        where : None, callable, str, int, array or list of str / int
            - ``None``: the topological boundary (faces of only one cell).
            - a predicate ``where(x)`` on the coordinates ``x`` ``(n, 3)`` of
              the boundary nodes, returning ``n`` booleans
              (``lambda x: np.abs(x[:, 0]) < 1e-12``).
            - a tag: the name of a cell set of the mesh (``mesh.cell_sets``),
              of a gmsh physical group (``field_data`` with
              ``cell_data['gmsh:physical']``) or an integer gmsh physical tag:
              every node on the closure of the tagged cells (``quad``/``quad9``
              faces, ``line`` edges, ``vertex`` points; hexahedra: all their
              nodes). A point-data name: as a point mask of its nonzero entries.
            - a boolean mask ``(npoints,)`` or integer indices of the mesh's
              points: the boundary nodes whose vertex, edge or face has only
              tagged vertices.
            - a list or tuple of tags: their union.

        Returns
        -------
        ndarray of bool, shape (ndof,)
        """
        if where is None:
            return self.boundary.copy()
        if callable(where):
            return _predicate_mask(where, self.coords, self.boundary)
        if isinstance(where, np.ndarray) and where.dtype.kind in "biu":
            return self._point_mask(where)
        if isinstance(where, (list, tuple)) and where and not all(isinstance(t, (str, int, np.integer)) for t in where):
            raise TypeError(f"where as a list must hold tag names or gmsh physical tags; got {where!r}")
        tags = list(where) if isinstance(where, (list, tuple)) else [where]
        mask = np.zeros(self.ndof, dtype=bool)
        for tag in tags:
            mask |= self._tag_mask(tag)
        return mask

    def _point_mask(self, pts) -> np.ndarray:
        npts = self.points.shape[0]
        a = np.asarray(pts)
        if a.dtype == bool:
            if a.shape != (npts,):
                raise ValueError(f"where as a point mask must have shape ({npts},) (one per mesh point); got {a.shape}")
            tagged = a
        else:
            if a.ndim != 1 or (a.size and (a.min() < 0 or a.max() >= npts)):
                raise ValueError(f"where as point indices must be 1-D integers in [0, {npts}); got {a!r}")
            tagged = np.zeros(npts, dtype=bool)
            tagged[a] = True
        ent = self._entities
        ok = np.where(ent >= 0, tagged[np.maximum(ent, 0)], True).all(axis=1)
        return self.boundary & ok[self._node_entity]

    def _tag_mask(self, tag) -> np.ndarray:
        m = self.source
        blocks = []  # (cell type, indices into the block) per block
        if isinstance(tag, str):
            if tag in (m.cell_sets or {}):
                blocks = [(blk.type, np.asarray([] if idx is None else idx, dtype=np.int64))
                          for blk, idx in zip(m.cells, m.cell_sets[tag])]
            elif tag in (m.field_data or {}) and "gmsh:physical" in m.cell_data:
                blocks = _physical(m, int(np.asarray(m.field_data[tag]).reshape(-1)[0]))
            elif tag in m.point_data:
                return self._point_mask(np.asarray(m.point_data[tag]).reshape(len(self.points), -1).any(axis=1))
            else:
                known = sorted(set(m.cell_sets or {}) | set(m.field_data or {}) | set(m.point_data))
                raise ValueError(f"where={tag!r} names no cell set, gmsh physical group or point data of the mesh; "
                                 f"it has {known}")
        elif isinstance(tag, (int, np.integer)) and not isinstance(tag, bool):
            if "gmsh:physical" not in m.cell_data:
                raise ValueError(f"where={tag!r}: the mesh has no gmsh physical tags (cell_data['gmsh:physical'])")
            blocks = _physical(m, int(tag))
            if not any(len(i) for _, i in blocks):
                raise ValueError(f"where={tag!r}: no cell has this gmsh physical tag")
        else:
            raise TypeError(f"where must be None, a predicate, a tag name or number, a point mask or a list of tags; "
                            f"got {type(tag).__name__}")
        mask = np.zeros(self.ndof, dtype=bool)
        for (ctype, idx), blk in zip(blocks, m.cells):
            if not len(idx):
                continue
            if ctype not in _TAG_CELLS:
                raise ValueError(f"where={tag!r} tags {ctype} cells, which are not faces, edges or points of "
                                 f"hexahedra; tag quad, line or vertex cells")
            mask |= self._closure_mask(np.asarray(blk.data)[idx][:, :_TAG_CELLS[ctype]])
        return mask

    # ----- refinement and output ----------------------------------------------------------------

    def refine(self) -> "HexMesh":
        """This mesh refined uniformly (every cell into 8, the same isoparametric map): a new :class:`HexMesh`.

        The new nodes are the map's values, so the geometry (and the domain)
        is unchanged. Tags and data are not carried over.
        """
        import meshio

        n = self.order
        _, lattice = HEX_NODES[self.cell_type]
        X = np.empty((self.nelem,) + (n + 1,) * 3 + (3,))
        X[:, lattice[:, 0], lattice[:, 1], lattice[:, 2]] = self.points[self.cells]
        B, _ = _geometry_matrices(n, np.linspace(-1.0, 1.0, 2 * n + 1))
        fine = _tensor_interp(B, X)
        ids, support = _lattice_numbering(self.cells[:, :8].astype(np.int64), 2 * n)
        pts = np.empty((support.shape[0], 3))
        pts[ids.reshape(-1)] = fine.reshape(-1, 3)
        sub = [ids[:, a * n + lattice[:, 0], b * n + lattice[:, 1], c * n + lattice[:, 2]] for a, b, c in _CORNERS]
        cells = np.stack(sub, axis=1).reshape(-1, lattice.shape[0])
        return HexMesh(meshio.Mesh(pts, [(self.cell_type, cells)]), self.basis)

    def at_points(self, u) -> np.ndarray:
        """Global nodal values ``(ndof, ...)`` evaluated at the mesh's own points ``(npoints, ...)``.

        The degree-``p`` function at every cell node (exact copies at the
        vertices; interpolated at 27-node cells' edge and face nodes where
        they are not nodes of the basis). Points no hexahedron uses get NaN.
        """
        u = np.asarray(u, dtype=np.float64)
        if u.shape[:1] != (self.ndof,):
            raise ValueError(f"u must have shape ({self.ndof}, ...) (one value per global node); got {u.shape}")
        n = self.order
        _, lattice = HEX_NODES[self.cell_type]
        Bp, _ = lagrange_matrices(self.basis.nodes, np.linspace(-1.0, 1.0, n + 1))
        vals = _tensor_interp(Bp, u[self.dofs])
        out = np.full((self.points.shape[0],) + u.shape[1:], np.nan)
        out[self.cells] = vals[:, lattice[:, 0], lattice[:, 1], lattice[:, 2]]
        return out

    def to_meshio(self, point_data: Optional[dict] = None, *, refined: bool = False) -> "meshio.Mesh":
        """A :class:`meshio.Mesh` holding global nodal fields ``{name: (ndof,) or (ndof, k)}``.

        ``refined=False``: the mesh's own points and cells, the fields at its
        points (:meth:`at_points`). ``refined=True``: the global nodes as
        points and every cell split into ``p^3`` trilinear hexahedra of its
        node lattice, the fields exactly as given (what a viewer needs to
        show a degree-``p`` solution).
        """
        import meshio

        data = {}
        for name, v in (point_data or {}).items():
            v = np.asarray(v, dtype=np.float64)
            if v.shape[:1] != (self.ndof,):
                raise ValueError(f"point_data[{name!r}] must have shape ({self.ndof}, ...) (one value per global "
                                 f"node); got {v.shape}")
            data[name] = v if refined else self.at_points(v)
        if not refined:
            return meshio.Mesh(self.points, [(self.cell_type, self.cells)], point_data=data)
        p = self.basis.P - 1
        d = self.dofs
        sub = [d[:, a:a + p, b:b + p, c:c + p].reshape(self.nelem, -1) for a, b, c in _CORNERS]
        cells = np.stack(sub, axis=-1).reshape(-1, 8)
        return meshio.Mesh(self.coords, [("hexahedron", cells)], point_data=data)

    def write(self, path: Union[str, os.PathLike], point_data: Optional[dict] = None, *, refined: bool = False,
              file_format: Optional[str] = None, **kwargs) -> "meshio.Mesh":
        """Write global nodal fields with the mesh through :func:`meshio.write` (any format meshio writes).

        ``point_data`` and ``refined`` as in :meth:`to_meshio`; ``file_format``
        and ``kwargs`` go to :func:`meshio.write`. Returns the written mesh.
        """
        import meshio

        out = self.to_meshio(point_data, refined=refined)
        meshio.write(path, out, file_format=file_format, **kwargs)
        return out


def _physical(m, tag: int) -> list:
    """Per cell block of ``m``: its type and the cells whose gmsh physical tag is ``tag``."""
    return [(blk.type, np.flatnonzero(np.asarray(phys) == tag)) for blk, phys in zip(m.cells, m.cell_data["gmsh:physical"])]


def _hex_cells(mesh) -> tuple[str, np.ndarray]:
    """The hexahedra of a meshio mesh (one of the two types), refusing other volume cells."""
    found = {}
    for blk in mesh.cells:
        if blk.type in HEX_NODES:
            found.setdefault(blk.type, []).append(np.asarray(blk.data, dtype=np.int64))
        elif blk.type in _VOLUME_CELLS:
            raise ValueError(f"the mesh has {len(blk.data)} {blk.type} cells: only hexahedron (8-node) and "
                             f"hexahedron27 cells are supported")
    if not found:
        types = sorted({blk.type for blk in mesh.cells})
        raise ValueError(f"the mesh has no hexahedron or hexahedron27 cells (its cells: {types})")
    if len(found) > 1:
        raise ValueError("the mesh mixes hexahedron and hexahedron27 cells; use one geometric order")
    (ctype, blocks), = found.items()
    return ctype, np.concatenate(blocks)


def _check_cells(points: np.ndarray, cells: np.ndarray) -> None:
    if cells.min() < 0 or cells.max() >= points.shape[0]:
        raise ValueError(f"the cells name point ids in [{cells.min()}, {cells.max()}], but the mesh has "
                         f"{points.shape[0]} points (ids 0 .. {points.shape[0] - 1})")
    corners = np.sort(cells[:, :8], axis=1)
    rep = np.flatnonzero((np.diff(corners, axis=1) == 0).any(axis=1))
    if rep.size:
        raise ValueError(f"{rep.size} cell(s) repeat a vertex (degenerate hexahedra), the first is cell {rep[0]}: "
                         f"{cells[rep[0], :8].tolist()}")
    used = np.unique(cells)
    distinct = len(_unique_rows(points[used])[0])
    if distinct != used.size:
        raise ValueError(f"{used.size - distinct} point(s) of the cells duplicate others (the same coordinates, "
                         f"another id): the cells on them would not be connected; merge the duplicate points")


def read_mesh(
    source,
    degree: Optional[int] = None,
    *,
    basis: Optional[TensorBasis] = None,
    Q: Optional[int] = None,
    quadrature: str = "gauss",
    moduli=20,
    reorient: bool = False,
    file_format: Optional[str] = None,
) -> HexMesh:
    """Read a hexahedral mesh (any format meshio reads, or a :class:`meshio.Mesh`) with a degree-``p`` space on it.

    Parameters
    ----------
    source : str, os.PathLike or meshio.Mesh
        A gmsh ``.msh``, VTK ``.vtu`` / ``.vtk``, ... file with ``hexahedron``
        (Q1) or ``hexahedron27`` (Q2) cells; other cells (``quad``, ``line``,
        ``vertex``) may tag boundary parts.
    degree : int, optional
        The polynomial degree ``p >= 1`` of the space (``TensorBasis(p + 1)``);
        default the geometric order of the cells.
    basis : TensorBasis, optional
        Instead of ``degree``: the 3-D basis to use.
    Q, quadrature, moduli
        Passed to :class:`TensorBasis` with ``degree``.
    reorient : bool
        Mirror cells whose nodes are in the mirror image of meshio's order
        (``detJ < 0`` everywhere) instead of raising.
    file_format : str, optional
        Passed to :func:`meshio.read`.

    Returns
    -------
    HexMesh

    Raises
    ------
    InvertedElementError
        A cell has ``detJ <= 0`` at some quadrature point.
    ValueError
        No hexahedra, other volume cells, a non-conforming mesh, duplicate points.

    Examples
    --------
    >>> import meshio, numpy as np
    >>> from rnstensor.fem import read_mesh
    >>> cube = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1], [1, 0, 1], [1, 1, 1], [0, 1, 1.0]])
    >>> mesh = read_mesh(meshio.Mesh(cube, [("hexahedron", [list(range(8))])]), degree=3)
    >>> mesh.nelem, mesh.ndof, int(mesh.boundary.sum()), round(mesh.volume, 12)
    (1, 64, 56, 1.0)
    """
    import meshio

    if degree is not None and basis is not None:
        raise ValueError("give degree or basis, not both")
    if isinstance(source, meshio.Mesh):
        m = source
    elif isinstance(source, (str, os.PathLike)):
        m = meshio.read(source, file_format=file_format)
    else:
        raise TypeError(f"source must be a file path or a meshio.Mesh; got {type(source).__name__}")
    if basis is None:
        if degree is None:
            degree = HEX_NODES[_hex_cells(m)[0]][0]
        if isinstance(degree, bool) or not isinstance(degree, (int, np.integer)) or degree < 1:
            raise ValueError(f"degree must be an integer >= 1; got {degree!r}")
        basis = TensorBasis(int(degree) + 1, Q, dim=3, quadrature=quadrature, moduli=moduli)
    return HexMesh(m, basis, reorient=reorient)
