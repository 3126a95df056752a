"""Hexahedral (quadrilateral) meshes of a box, element geometry at quadrature points, continuous H1 gather/scatter."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

from ..encode import check_float_array
from .meshop import MeshOperator
from .operators import InvertedElementError, MassOperator, PoissonOperator
from .program import voigt_index
from .tensorbasis import TensorBasis

__all__ = ["BoxMesh", "box_mesh", "element_geometry", "Geometry", "FEMesh"]


@dataclass(frozen=True)
class Geometry:
    """Per-element data at the quadrature points.

    Attributes
    ----------
    J : ndarray, shape (nelem, Q, ..., Q, dim, dim)
        ``J[..., c, k] = dx_c / dxi_k``.
    detJ : ndarray, shape (nelem, Q, ..., Q)
    qdata : ndarray, shape (nelem, Q, ..., Q)
        ``w * detJ`` (the mass operator's field).
    G : ndarray, shape (nelem, 3 (dim - 1), Q, ..., Q)
        ``w adj(J) adj(J)^T / detJ`` packed (3-D ``xx yy zz yz xz xy``, 2-D ``xx yy xy``).
    xq : ndarray, shape (nelem, Q, ..., Q, dim)
        Physical coordinates of the quadrature points.
    """

    J: np.ndarray
    detJ: np.ndarray
    qdata: np.ndarray
    G: np.ndarray
    xq: np.ndarray


def _interp_grad(basis: TensorBasis, x: np.ndarray):
    """Float64 interpolation and reference gradient of element fields ``x`` (nelem, P..P, ncomp)."""
    return tensor_interp_grad(basis.B, basis.D, x)


def tensor_interp_grad(B: np.ndarray, D: np.ndarray, x: np.ndarray):
    """``(B ⊗ ... ⊗ B) x`` and its reference gradient (``D`` on axis ``k``) for fields ``x`` (nelem, n..n, ncomp).

    ``B``, ``D`` of shape ``(Q, n)``; float64 einsum. Returns
    ``(nelem, Q..Q, ncomp)`` and ``(nelem, Q..Q, ncomp, dim)``.
    """
    d = x.ndim - 2
    idx = "ijk"[:d]
    out = "abc"[:d]

    def apply(mats):
        subs = ",".join(f"{o}{i}" for o, i in zip(out, idx))
        return np.einsum(f"{subs},e{idx}z->e{out}z", *mats, x, optimize=True)

    val = apply([B] * d)
    grad = np.stack([apply([D if a == k else B for a in range(d)]) for k in range(d)], axis=-1)
    return val, grad


def element_geometry(basis: TensorBasis, x) -> Geometry:
    """Geometric data of isoparametric elements with nodal coordinates ``x`` (float64 arithmetic).

    Parameters
    ----------
    basis : TensorBasis
    x : array_like, shape (nelem, P, ..., P, dim)
        Physical coordinates of every element's GLL nodes (axis ``k`` of the
        node grid runs along the reference coordinate ``xi_k``).

    Raises
    ------
    InvertedElementError
        ``detJ <= 0`` at some quadrature point (names the element and point).

    Examples
    --------
    >>> import numpy as np
    >>> from rnstensor.fem import TensorBasis, element_geometry
    >>> b = TensorBasis(2, dim=2)
    >>> x = np.stack(np.meshgrid([0.0, 2.0], [0.0, 1.0], indexing="ij"), axis=-1)[None]  # one 2 x 1 element
    >>> g = element_geometry(b, x)
    >>> float(g.detJ[0, 0, 0]), float(g.qdata.sum())
    (0.5, 2.0)
    """
    if not isinstance(basis, TensorBasis):
        raise TypeError(f"basis must be a TensorBasis; got {type(basis).__name__}")
    d = basis.dim
    x = check_float_array(x, "x")
    want = (basis.P,) * d + (d,)
    if x.ndim != d + 2 or x.shape[1:] != want:
        raise ValueError(f"x must have shape (nelem, {', '.join(map(str, want))}); got {x.shape}")
    xq, J = _interp_grad(basis, x)
    return _geometry(basis, xq, J)


def _geometry(basis: TensorBasis, xq: np.ndarray, J: np.ndarray) -> Geometry:
    d = basis.dim
    detJ = np.linalg.det(J)
    bad = np.argwhere(~(detJ > 0))
    if bad.size:
        first = tuple(int(i) for i in bad[0])
        raise InvertedElementError(
            f"detJ <= 0 at {len(bad)} quadrature point(s), the first in element {first[0]} at point {first[1:]} "
            f"(detJ = {detJ[first]:.3g}): the element is inverted or degenerate; check the node ordering or "
            f"reduce the curvature"
        )
    w = basis.qweights
    qdata = w * detJ
    # adj(J) = detJ * J^{-1}; G = w adj adj^T / detJ = w detJ J^{-1} J^{-T}
    Jinv = np.linalg.inv(J)
    full = np.einsum("...ik,...jk->...ij", Jinv, Jinv) * qdata[..., None, None]
    G = np.empty((J.shape[0], 3 * (d - 1)) + (basis.Q,) * d)
    for i in range(d):
        for j in range(i, d):
            G[:, voigt_index(i, j, d)] = full[..., i, j]
    return Geometry(J, detJ, qdata, G, xq)


class FEMesh:
    """What every mesh offers: the geometric fields, continuous gather/scatter, boundary masks, bound operators.

    A subclass sets ``basis``, ``nelem``, ``ndof``, ``dofs`` (nelem, P..P),
    ``coords`` (ndof, dim), ``boundary`` (ndof,) and ``geometry``.
    """

    basis: TensorBasis
    nelem: int
    ndof: int
    dofs: np.ndarray
    coords: np.ndarray
    boundary: np.ndarray
    geometry: Geometry

    @property
    def detJ(self) -> np.ndarray:
        """``detJ`` at the quadrature points, ``(nelem, Q, ..., Q)``."""
        return self.geometry.detJ

    @property
    def qdata(self) -> np.ndarray:
        """``w * detJ``: the mass operator's field."""
        return self.geometry.qdata

    @property
    def G(self) -> np.ndarray:
        """Packed ``w adj(J) adj(J)^T / detJ``: the Poisson operator's field."""
        return self.geometry.G

    @property
    def xq(self) -> np.ndarray:
        """Physical coordinates of the quadrature points, ``(nelem, Q, ..., Q, dim)``."""
        return self.geometry.xq

    def gather(self, u) -> np.ndarray:
        """Global nodal values ``(ndof,)`` to element-local ``(nelem, P, ..., P)`` (E: copies shared nodes)."""
        u = np.asarray(u)
        if u.shape != (self.ndof,):
            raise ValueError(f"u must have shape ({self.ndof},) (one value per global node); got {u.shape}")
        return u[self.dofs]

    def scatter(self, v) -> np.ndarray:
        """Element-local values ``(nelem, P, ..., P)`` summed into global nodes ``(ndof,)`` (E^T)."""
        v = np.asarray(v, dtype=np.float64)
        if v.shape != self.dofs.shape:
            raise ValueError(f"v must have shape {self.dofs.shape} (nelem, P, ..., P); got {v.shape}")
        return np.bincount(self.dofs.reshape(-1), weights=v.reshape(-1), minlength=self.ndof)

    def boundary_dofs(self, where=None) -> np.ndarray:
        """Boolean mask ``(ndof,)`` of boundary nodes: all of them (``None``) or those where ``where(x)`` holds.

        ``where`` is called once with the coordinates ``x`` of shape
        ``(n, dim)`` of the boundary nodes and must return ``n`` booleans
        (e.g. ``lambda x: x[:, 0] < 1e-12``). Interior nodes are never
        selected.
        """
        mask = np.asarray(self.boundary, dtype=bool).copy()
        if where is None:
            return mask
        if not callable(where):
            raise TypeError(f"where must be None or a predicate on coordinates (callable); got {type(where).__name__}")
        return _predicate_mask(where, self.coords, mask)

    def load_vector(self, f) -> np.ndarray:
        """The load vector ``b_i = int f phi_i`` on the global nodes, by the basis's quadrature (float64).

        Parameters
        ----------
        f : callable or array_like
            ``f(x)`` with ``x`` the quadrature points ``(nelem, Q, ..., Q, dim)``
            returning ``(nelem, Q, ..., Q)`` values, or those values, or a number.

        Returns
        -------
        ndarray of float64, shape (ndof,)
        """
        d = self.basis.dim
        want = self.qdata.shape
        vals = check_float_array(np.asarray(f(self.xq) if callable(f) else f, dtype=np.float64), "f")
        if vals.ndim == 0:
            vals = np.full(want, float(vals))
        if vals.shape != want:
            raise ValueError(f"f must give one value per quadrature point, shape {want}; got {vals.shape}")
        return self.scatter(_along_axes(self.basis.B.T, self.qdata * vals, d))

    def at_quadrature(self, u) -> np.ndarray:
        """Global nodal values ``(ndof,)`` interpolated to the quadrature points, ``(nelem, Q, ..., Q)`` (float64).

        With :attr:`xq` and :attr:`qdata`: ``sqrt(sum(qdata * (at_quadrature(u) - exact(xq))**2))`` is the
        L2 error by the basis's quadrature.
        """
        return _along_axes(self.basis.B, self.gather(u).astype(np.float64), self.basis.dim)

    def poisson(self, **kwargs) -> "MeshOperator":
        """The Poisson (stiffness) operator on the global nodes: ``PoissonOperator.on(self, **kwargs)``."""
        return MeshOperator(self, PoissonOperator(self.basis, self.G, **kwargs))

    def mass(self, **kwargs) -> "MeshOperator":
        """The mass operator on the global nodes: ``MassOperator.on(self, **kwargs)``."""
        return MeshOperator(self, MassOperator(self.basis, self.qdata, **kwargs))


def _along_axes(M: np.ndarray, x: np.ndarray, d: int) -> np.ndarray:
    """The 1-D matrix ``M`` applied along each of the ``d`` element axes of ``x`` (nelem, n, ..., n) in float64."""
    for ax in range(1, d + 1):
        x = np.moveaxis(np.tensordot(M, x, axes=([1], [ax])), 0, ax)
    return x


def _predicate_mask(where, coords: np.ndarray, among: np.ndarray) -> np.ndarray:
    """``among`` restricted to the nodes where the predicate ``where(coords[among])`` holds."""
    sel = np.asarray(where(coords[among]))
    n = int(among.sum())
    if sel.shape != (n,) or sel.dtype != bool:
        raise ValueError(
            f"where(x) must return {n} booleans (one per node of x, shape ({n}, {coords.shape[1]})); "
            f"got an array of shape {sel.shape} and dtype {sel.dtype}"
        )
    out = np.zeros_like(among)
    out[np.flatnonzero(among)[sel]] = True
    return out


class BoxMesh(FEMesh):
    """A structured mesh of a box by ``shape`` elements of degree ``P - 1``, with a continuous H1 numbering.

    Built by :func:`box_mesh`.

    Attributes
    ----------
    basis : TensorBasis
    shape : tuple of int
        Elements per direction.
    nelem, ndof : int
        Number of elements and of global (continuous) nodes.
    dofs : ndarray of int64, shape (nelem, P, ..., P)
        Global index of every element node (elements in C order of their grid position).
    coords : ndarray, shape (ndof, dim)
        Physical coordinates of the global nodes.
    boundary : ndarray of bool, shape (ndof,)
        Nodes on the boundary of the box.
    x : ndarray, shape (nelem, P, ..., P, dim)
        Element node coordinates.
    geometry : Geometry
        ``J``, ``detJ``, ``qdata``, ``G``, ``xq`` (also as attributes of the mesh).
    volume : float
        The volume (area) of the box.
    """

    def __init__(self, basis: TensorBasis, shape, lower, upper, curved: float):
        d, p = basis.dim, basis.P - 1
        self.basis, self.shape, self.lower, self.upper, self.curved = basis, shape, lower, upper, curved
        n1 = [n * p + 1 for n in shape]
        self.ndof = int(np.prod(n1))
        self.nelem = int(np.prod(shape))
        # 1-D global node parameters t in [0, 1]: element e, local node j -> (e + (xi_j + 1)/2) / n
        ts = []
        for n in shape:
            t = np.empty(n * p + 1)
            for e in range(n):
                t[e * p: e * p + p + 1] = (e + (basis.nodes + 1) / 2) / n
            t[-1] = 1.0
            ts.append(t)
        grids = np.meshgrid(*ts, indexing="ij")
        L = np.asarray(upper) - np.asarray(lower)
        coords = np.stack([lower[c] + L[c] * grids[c] for c in range(d)], axis=-1)
        if curved:
            bump = np.ones_like(grids[0])
            for c in range(d):
                bump = bump * np.sin(np.pi * np.minimum(grids[c], 1 - grids[c]))  # exactly 0 on the faces
            for c in range(2):  # x and y only: detJ keeps degree <= 2p per variable (see box_mesh)
                h = L[c] / shape[c]
                coords[..., c] += curved * h * bump * np.cos(np.pi * grids[(c + 1) % d])
        self.coords = coords.reshape(-1, d)
        on = np.zeros(n1, dtype=bool)
        for c in range(d):
            sl = [slice(None)] * d
            sl[c] = 0
            on[tuple(sl)] = True
            sl[c] = -1
            on[tuple(sl)] = True
        self.boundary = on.reshape(-1)
        # element -> global numbering
        idx = np.arange(self.ndof, dtype=np.int64).reshape(n1)
        dofs = np.empty((self.nelem,) + (p + 1,) * d, dtype=np.int64)
        for e, pos in enumerate(np.ndindex(*shape)):
            dofs[e] = idx[tuple(slice(k * p, k * p + p + 1) for k in pos)]
        self.dofs = dofs
        self.x = self.coords[dofs]
        if curved:
            self.geometry = element_geometry(basis, self.x)
        else:  # affine: the exact diagonal Jacobian (no rounding noise in the off-diagonal metric terms)
            xq, _ = _interp_grad(basis, self.x)
            J = np.zeros(xq.shape + (d,))
            for c in range(d):
                J[..., c, c] = L[c] / (2 * shape[c])
            self.geometry = _geometry(basis, xq, J)
        self.volume = float(np.prod(L))

    def __repr__(self) -> str:
        return f"BoxMesh({self.basis!r}, shape={self.shape}, ndof={self.ndof}, curved={self.curved})"


def _per_axis(v, d: int, name: str) -> tuple[float, ...]:
    a = np.asarray(v, dtype=np.float64)
    if a.ndim == 0:
        a = np.full(d, float(a))
    if a.shape != (d,) or not np.isfinite(a).all():
        raise ValueError(f"{name} must be a finite number or {d} numbers; got {v!r}")
    return tuple(float(t) for t in a)


def box_mesh(
    basis: TensorBasis,
    shape: Union[int, Sequence[int]] = 2,
    lower: Union[float, Sequence[float]] = 0.0,
    upper: Union[float, Sequence[float]] = 1.0,
    curved: float = 0.0,
) -> BoxMesh:
    """A mesh of the box ``[lower, upper]`` by ``shape`` hexahedra (quadrilaterals in 2-D), affine or curved.

    With ``curved = a != 0`` every interior node is displaced by
    ``a h_c prod_k sin(pi t_k) cos(pi t_{c+1})`` in the directions ``c = x, y``
    (``t`` the node's position scaled to ``[0, 1]``, ``h_c`` the element
    size): a smooth map that fixes the boundary, so the elements are curved
    (isoparametric, all metric components nonzero) while the domain stays
    the box. Leaving ``z`` straight keeps ``detJ`` a polynomial of degree
    ``<= 2p`` per variable, so Gauss quadrature with ``Q >= P`` (the default
    ``Q = P + 1``) integrates the volume exactly. ``|a|`` up to about
    ``0.25 n`` keeps every element valid; beyond,
    :class:`InvertedElementError` is raised.

    Parameters
    ----------
    basis : TensorBasis
        Degree, quadrature and dimension of the elements.
    shape : int or tuple of int
        Elements per direction.
    lower, upper : float or tuple of float
        Corners of the box (``upper > lower`` in every direction).
    curved : float
        Perturbation amplitude, relative to the element size.

    Returns
    -------
    BoxMesh

    Examples
    --------
    >>> from rnstensor.fem import TensorBasis, box_mesh
    >>> mesh = box_mesh(TensorBasis(3), shape=(2, 2, 1), upper=(1.0, 1.0, 0.5), curved=0.1)
    >>> mesh.nelem, mesh.ndof, int(mesh.boundary.sum())
    (4, 75, 66)
    >>> abs(float(mesh.qdata.sum()) - 0.5) < 1e-15  # the volume
    True
    """
    if not isinstance(basis, TensorBasis):
        raise TypeError(f"basis must be a TensorBasis; got {type(basis).__name__}")
    d = basis.dim
    sh = (shape,) * d if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool) else tuple(shape)
    try:
        sh = tuple(operator.index(n) for n in sh)
    except TypeError:
        raise TypeError(f"shape must be an int or {d} ints; got {shape!r}") from None
    if len(sh) != d or min(sh) < 1:
        raise ValueError(f"shape must be a positive int or {d} positive ints (elements per direction); got {shape!r}")
    lo, hi = _per_axis(lower, d, "lower"), _per_axis(upper, d, "upper")
    if any(h <= l for l, h in zip(lo, hi)):
        raise ValueError(f"upper must exceed lower in every direction; got lower={lo}, upper={hi}")
    a = float(curved)
    if not np.isfinite(a):
        raise ValueError(f"curved must be a finite number; got {curved!r}")
    return BoxMesh(basis, sh, lo, hi, a)
