"""Tensor-product Lagrange bases on GLL nodes: 1-D matrices and residue-domain interpolation and gradients."""

from __future__ import annotations

import operator
from functools import lru_cache
from typing import Optional, Union

import numpy as np

from ..basis import Basis
from ..chain import ChainPlan, plan_chain
from ..encode import as_basis, check_float_array
from .quadrature import MAX_POINTS, gauss, gll, lagrange_matrices

__all__ = ["TensorBasis", "QUADRATURES"]

QUADRATURES = ("gauss", "gll")
_LETTERS = "abcdefgh"


@lru_cache(maxsize=None)
def _matrices(P: int, Q: int, quadrature: str):
    x, _ = gll(P)
    qx, qw = (gauss if quadrature == "gauss" else gll)(Q)
    B, D = lagrange_matrices(x, qx)
    return x, qx, qw, B, D


@lru_cache(maxsize=None)
def _chain(
    P: int, Q: int, quadrature: str, dim: int, deriv: int, transpose: bool, basis: Basis, method: str
) -> ChainPlan:
    """The chain of ``dim`` products (``D`` on axis ``deriv``, else ``B``; ``deriv=-1``: all ``B``), planned once."""
    _, _, _, B, D = _matrices(P, Q, quadrature)
    ops = [(D if a == deriv else B) for a in range(dim)]
    if transpose:
        ops = [np.ascontiguousarray(A.T) for A in ops]
    return plan_chain(ops, list(range(dim)), moduli=basis, method=method, ndim=dim)


def _check_int(v, name: str, lo: int, hi: int) -> int:
    try:
        k = operator.index(v)
    except TypeError:
        raise TypeError(f"{name} must be an integer; got {type(v).__name__}") from None
    if not lo <= k <= hi:
        raise ValueError(f"{name}={v} is out of range; use {lo} <= {name} <= {hi}")
    return k


class TensorBasis:
    """A tensor-product nodal (Lagrange) basis on the ``P`` GLL points per direction, with ``Q`` quadrature points.

    Parameters
    ----------
    P : int
        Nodes per direction (polynomial degree ``p = P - 1``), ``2 <= P <= 64``
        (63 with the default Gauss ``Q = P + 1``).
    Q : int, optional
        Quadrature points per direction; default ``P + 1`` for ``'gauss'``
        (exact mass and stiffness on affine elements with a margin for curved
        ones), ``P`` for ``'gll'`` (collocated, ``B`` is the identity).
    dim : {2, 3}
        Space dimension.
    quadrature : {'gauss', 'gll'}
        The 1-D rule of the quadrature points.
    moduli : int, Basis or tuple
        The residue basis of the residue-domain operators (default ``20`` =
        ``Basis.int8(20)``: room for the operators' default 72-bit encoding,
        at least as accurate as numpy's float64 evaluation in practice;
        ``15`` holds about 54 bits, 1.5x faster, less accurate than numpy).

    Attributes
    ----------
    B, D : ndarray, shape (Q, P)
        ``B[q, j] = l_j(y_q)``, ``D[q, j] = l_j'(y_q)`` (correctly rounded; read-only).
    nodes : ndarray, shape (P,)
        The GLL nodes on ``[-1, 1]``.
    points, weights : ndarray, shape (Q,)
        The 1-D quadrature rule.
    qweights : ndarray, shape (Q,) * dim
        Tensor-product quadrature weights.

    Examples
    --------
    >>> import numpy as np
    >>> from rnstensor.fem import TensorBasis
    >>> b = TensorBasis(3, dim=2)
    >>> b.B.shape, b.D.shape
    ((4, 3), (4, 3))
    >>> u = np.ones((5, 3, 3))               # 5 elements, the constant 1
    >>> bool(np.allclose(b.interp(u), 1.0)), bool(np.allclose(b.grad(u), 0.0, atol=1e-14))
    (True, True)
    """

    def __init__(
        self,
        P: int,
        Q: Optional[int] = None,
        dim: int = 3,
        quadrature: str = "gauss",
        *,
        moduli: Union[int, Basis, tuple] = 20,
    ):
        if quadrature not in QUADRATURES:
            raise ValueError(f"quadrature must be one of {QUADRATURES}; got {quadrature!r}")
        # (the default Q = P + 1 Gauss points must stay within the quadrature's range too)
        self.P = _check_int(P, "P", 2, MAX_POINTS - 1 if Q is None and quadrature == "gauss" else MAX_POINTS)
        if Q is None:
            Q = self.P + 1 if quadrature == "gauss" else self.P
        self.Q = _check_int(Q, "Q", 1 if quadrature == "gauss" else 2, MAX_POINTS)
        self.dim = _check_int(dim, "dim", 2, 3)
        self.quadrature = quadrature
        self.moduli = as_basis(moduli, "moduli")
        self.nodes, self.points, self.weights, self.B, self.D = _matrices(self.P, self.Q, quadrature)
        w = self.weights
        self.qweights = np.multiply.outer(w, w)
        if self.dim == 3:
            self.qweights = np.multiply.outer(self.qweights, w)

    @property
    def degree(self) -> int:
        """The polynomial degree ``p = P - 1``."""
        return self.P - 1

    def __repr__(self) -> str:
        return (
            f"TensorBasis(P={self.P}, Q={self.Q}, dim={self.dim}, quadrature={self.quadrature!r}, "
            f"s={len(self.moduli)})"
        )

    def __eq__(self, other) -> bool:
        return isinstance(other, TensorBasis) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self):
        return (self.P, self.Q, self.dim, self.quadrature, self.moduli)

    # ----- shape checks -------------------------------------------------------------------

    def check_elements(self, u, n: int, name: str = "u", lead: tuple = ()) -> tuple[np.ndarray, bool]:
        """``u`` as float64 of shape ``(nelem, *lead, n, ..., n)``; a single element without the batch axis is accepted.

        Returns the array with the batch axis and whether it was added.
        """
        x = check_float_array(u, name)
        want = lead + (n,) * self.dim
        if x.shape == want:
            return x[None], True
        if x.ndim != len(want) + 1 or x.shape[1:] != want:
            desc = ", ".join(["nelem"] + [str(k) for k in want])
            raise ValueError(
                f"{name} must have shape ({desc}) for this basis ({self!r}); got {x.shape}"
            )
        return x, False

    # ----- residue-domain chains ------------------------------------------------------------

    def chain(self, deriv: int = -1, transpose: bool = False, method: str = "rescale_be") -> ChainPlan:
        """The cached :class:`~rnstensor.ChainPlan`: ``B`` (``D`` on axis ``deriv``) along every axis, or transposed."""
        return _chain(self.P, self.Q, self.quadrature, self.dim, int(deriv), bool(transpose), self.moduli, method)

    def interp(self, u, transpose: bool = False, *, method: str = "rescale_be", decode: str = "fp64") -> np.ndarray:
        """Interpolate nodal values to the quadrature points, ``(B ⊗ ... ⊗ B) u``, element by element.

        One residue-domain chain (one encode, ``dim`` products with planned
        drops, one decode) per call.

        Parameters
        ----------
        u : array_like, shape (nelem, P, ..., P)
            Nodal values (``(nelem, Q, ..., Q)`` with ``transpose=True``).
        transpose : bool
            Apply ``B^T`` along every axis instead (quadrature points to nodes).
        method : {'rescale_be', 'rescale', 'norescale', 'composed'}
            The chain method (see :func:`rnstensor.plan_chain`).
        decode : {'fp64', 'exact'}

        Returns
        -------
        ndarray, shape (nelem, Q, ..., Q) (``(nelem, P, ..., P)`` transposed)

        Examples
        --------
        >>> import numpy as np
        >>> from rnstensor.fem import TensorBasis
        >>> b = TensorBasis(2, Q=2, dim=2)       # bilinear, 2x2 Gauss points
        >>> u = np.array([[[0.0, 1.0], [0.0, 1.0]]])  # u = (1 + y) / 2
        >>> np.round(b.interp(u), 6)
        array([[[0.211325, 0.788675],
                [0.211325, 0.788675]]])
        """
        if not isinstance(transpose, (bool, np.bool_)):
            raise TypeError(f"transpose must be a bool; got {transpose!r}")
        x, single = self.check_elements(u, self.Q if transpose else self.P)
        y = self.chain(-1, bool(transpose), method)(x, decode=decode)
        return y[0] if single else y

    def grad(self, u, transpose: bool = False, *, method: str = "rescale_be", decode: str = "fp64") -> np.ndarray:
        """Reference gradient at the quadrature points: component ``i`` is ``D`` along axis ``i``, ``B`` elsewhere.

        Parameters
        ----------
        u : array_like, shape (nelem, P, ..., P)
            Nodal values. With ``transpose=True``: ``(nelem, dim, Q, ..., Q)``,
            and the result is ``sum_i grad_i^T u[:, i]`` (each component one
            residue-domain chain, summed in float64).
        transpose : bool
        method, decode
            As in :meth:`interp`.

        Returns
        -------
        ndarray, shape (nelem, dim, Q, ..., Q) (``(nelem, P, ..., P)`` transposed)

        Examples
        --------
        >>> import numpy as np
        >>> from rnstensor.fem import TensorBasis
        >>> b = TensorBasis(3, dim=2)
        >>> x = b.nodes
        >>> u = (x[:, None] ** 2 + 3 * x[None, :])[None]  # u = x^2 + 3y on one element
        >>> g = b.grad(u)
        >>> bool(np.allclose(g[0, 0], 2 * b.points[:, None])), bool(np.allclose(g[0, 1], 3.0))
        (True, True)
        """
        if not isinstance(transpose, (bool, np.bool_)):
            raise TypeError(f"transpose must be a bool; got {transpose!r}")
        if transpose:
            x, single = self.check_elements(u, self.Q, lead=(self.dim,))
            y = sum(self.chain(i, True, method)(x[:, i], decode=decode) for i in range(self.dim))
        else:
            x, single = self.check_elements(u, self.P)
            y = np.stack([self.chain(i, False, method)(x, decode=decode) for i in range(self.dim)], axis=1)
        return y[0] if single else y
