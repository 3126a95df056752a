"""Element operators bound to a mesh's global numbering: matrix-free products, SciPy operators, Dirichlet rows, Jacobi."""

from __future__ import annotations

from typing import Callable, Union

import numpy as np

__all__ = ["MeshOperator"]


class MeshOperator:
    """A :class:`MassOperator` or :class:`PoissonOperator` on the global nodes of a mesh: ``E^T A_e E``.

    Made by ``mesh.poisson()``, ``mesh.mass()`` or ``PoissonOperator.on(mesh)``.
    Every product gathers the global vector to the elements, applies the
    element operator (in the residue domain for ``method='rescale_be'``)
    and sums the element results back.

    Dirichlet conditions (``dirichlet=`` of :meth:`as_linear_operator`,
    :meth:`diagonal`, :meth:`jacobi`, :meth:`dirichlet_rhs`) keep the full
    size ``ndof`` and put the identity on the constrained nodes: with ``C``
    the constrained set and ``F`` the free one, the operator is
    ``[[A_FF, 0], [0, I]]``. It is symmetric, and positive definite for
    Poisson as soon as ``C`` is not empty (on a connected mesh), so
    :func:`scipy.sparse.linalg.cg` accepts it; :meth:`dirichlet_rhs` gives
    the right-hand side ``[b_F - A_FC g_C, g_C]`` whose solution equals the
    prescribed values ``g`` on ``C``. A ``dirichlet`` argument is ``None``
    (no constraint), a NumPy array (a boolean mask ``(ndof,)`` or integer
    global node indices), or anything else the mesh's ``boundary_dofs``
    reads (a predicate on coordinates, a tag name or number, a list of tags).

    Attributes
    ----------
    mesh : FEMesh
    op : MassOperator or PoissonOperator
        The element operator.
    ndof : int

    Examples
    --------
    >>> import numpy as np, scipy.sparse.linalg as sla
    >>> from rnstensor.fem import TensorBasis, box_mesh
    >>> mesh = box_mesh(TensorBasis(3), shape=2)
    >>> A = mesh.poisson()
    >>> L = A.as_linear_operator(dirichlet=mesh.boundary)
    >>> b = A.dirichlet_rhs(mesh.load_vector(1.0), mesh.boundary)
    >>> u, info = sla.cg(L, b, rtol=1e-12, M=A.jacobi(mesh.boundary))
    >>> info, L.shape, bool(abs(u.max() - 0.0562) < 1e-3)   # -Laplace u = 1, u = 0 on the cube's faces
    (0, (125, 125), True)
    """

    def __init__(self, mesh, op):
        self.mesh, self.op = mesh, op
        self.ndof = int(mesh.ndof)
        if op.basis != mesh.basis or op.nelem != mesh.nelem:
            raise ValueError(
                f"op must act on the mesh's elements with its basis: op has {op.basis!r} and {op.nelem} elements, "
                f"the mesh {mesh.basis!r} and {mesh.nelem}"
            )

    def __repr__(self) -> str:
        return f"MeshOperator({self.op!r}, ndof={self.ndof})"

    # ----- products ---------------------------------------------------------------------------

    def apply(self, u) -> np.ndarray:
        """``E^T A_e E u`` for global nodal values ``u`` of shape ``(ndof,)`` (no Dirichlet rows)."""
        return self.mesh.scatter(self.op.apply(self.mesh.gather(self._vector(u, "u"))))

    __call__ = apply

    def _vector(self, u, name: str) -> np.ndarray:
        if np.iscomplexobj(u):
            raise TypeError(f"{name} must be real: the operator is real, apply it to u.real and u.imag separately")
        v = np.asarray(u, dtype=np.float64)
        if v.shape not in ((self.ndof,), (self.ndof, 1)):
            raise ValueError(f"{name} must have shape ({self.ndof},) (one value per global node); got {v.shape}")
        return v.reshape(-1)

    def constrained(self, dirichlet) -> np.ndarray:
        """The boolean mask ``(ndof,)`` of ``dirichlet`` (see the class docstring); ``None``: no node."""
        n = self.ndof
        if dirichlet is None:
            return np.zeros(n, dtype=bool)
        if isinstance(dirichlet, np.ndarray):
            a = dirichlet
            if a.dtype == bool:
                if a.shape != (n,):
                    raise ValueError(f"dirichlet as a boolean mask must have shape ({n},) (one per global node); "
                                     f"got {a.shape}")
                return a.copy()
            if a.dtype.kind in "iu" and a.ndim == 1:
                if a.size and (a.min() < 0 or a.max() >= n):
                    raise ValueError(f"dirichlet node indices must lie in [0, {n}); got {a.min()} .. {a.max()}")
                mask = np.zeros(n, dtype=bool)
                mask[a] = True
                return mask
            raise TypeError(f"dirichlet as an array must be a boolean mask ({n},) or 1-D integer node indices; "
                            f"got dtype {a.dtype}, shape {a.shape}")
        return self.mesh.boundary_dofs(dirichlet)

    def as_linear_operator(self, dirichlet=None):
        """A :class:`scipy.sparse.linalg.LinearOperator` ``(ndof, ndof)``: the matrix-free global operator.

        With ``dirichlet``, the identity on the constrained nodes and their
        rows and columns of ``A`` removed (see the class docstring), so that
        ``cg(L, A.dirichlet_rhs(b, dirichlet, g))`` solves the Dirichlet
        problem. Every product runs the element operator once.
        """
        from scipy.sparse.linalg import LinearOperator

        fixed = self.constrained(dirichlet)
        free = ~fixed

        def matvec(v):
            v = self._vector(v, "v")
            y = self.apply(np.where(free, v, 0.0))
            return np.where(free, y, v)

        return LinearOperator((self.ndof, self.ndof), matvec=matvec, rmatvec=matvec, dtype=np.float64)

    def diagonal(self, dirichlet=None) -> np.ndarray:
        """The diagonal of the assembled global matrix, ``(ndof,)``: the element diagonals summed (float64).

        With ``dirichlet``, 1 on the constrained nodes (the operator of
        :meth:`as_linear_operator` with the same argument).
        """
        d = self.mesh.scatter(self.op.element_diagonal())
        d[self.constrained(dirichlet)] = 1.0
        return d

    def jacobi(self, dirichlet=None):
        """The Jacobi preconditioner ``v -> v / diagonal(dirichlet)`` as a :class:`~scipy.sparse.linalg.LinearOperator`."""
        from scipy.sparse.linalg import LinearOperator

        inv = 1.0 / self.diagonal(dirichlet)

        def matvec(v):
            return inv * self._vector(v, "v")

        return LinearOperator((self.ndof, self.ndof), matvec=matvec, rmatvec=matvec, dtype=np.float64)

    def dirichlet_rhs(self, b, dirichlet, values: Union[float, np.ndarray, Callable] = 0.0) -> np.ndarray:
        """The right-hand side ``[b_F - A_FC g_C, g_C]`` of the operator of :meth:`as_linear_operator`.

        Parameters
        ----------
        b : array_like, shape (ndof,)
            The load vector (e.g. ``mesh.load_vector(f)``).
        dirichlet
            The constrained nodes (as for :meth:`as_linear_operator`).
        values : float, array_like (ndof,) or callable
            The prescribed values ``g``: a number, one per global node (only
            the constrained ones are read) or ``g(x)`` on the coordinates
            ``(n, dim)`` of the constrained nodes.

        Returns
        -------
        ndarray of float64, shape (ndof,)
        """
        b = self._vector(b, "b")
        fixed = self.constrained(dirichlet)
        g = np.zeros(self.ndof)
        if callable(values):
            vals = np.asarray(values(self.mesh.coords[fixed]), dtype=np.float64)
            if vals.shape != (int(fixed.sum()),):
                raise ValueError(f"values(x) must return one number per constrained node, shape "
                                 f"({int(fixed.sum())},); got {vals.shape}")
            g[fixed] = vals
        elif np.ndim(values) == 0:
            g[fixed] = float(values)
        else:
            g[fixed] = self._vector(values, "values")[fixed]
        if not np.isfinite(g).all():
            raise ValueError("values must be finite on the constrained nodes")
        return np.where(fixed, g, b - self.apply(g))

    def assemble(self, dirichlet=None):
        """The global matrix as :class:`scipy.sparse.csr_matrix`, from the float64 element matrices (small meshes).

        With ``dirichlet``, the matrix of :meth:`as_linear_operator`.
        """
        import scipy.sparse as sp

        dofs = self.mesh.dofs.reshape(self.mesh.nelem, -1)
        n = dofs.shape[1]
        vals = np.stack([self.op.dense(e) for e in range(self.mesh.nelem)])
        rows = np.repeat(dofs, n, axis=1).reshape(-1)
        cols = np.tile(dofs, (1, n)).reshape(-1)
        A = sp.coo_matrix((vals.reshape(-1), (rows, cols)), shape=(self.ndof, self.ndof)).tocsr()
        fixed = self.constrained(dirichlet)
        if fixed.any():
            keep = sp.diags((~fixed).astype(np.float64))
            A = (keep @ A @ keep + sp.diags(fixed.astype(np.float64))).tocsr()
        return A

