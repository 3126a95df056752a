"""Exact references (scaled Python integers, one correct rounding), the [2610.05059] datasets and error metrics."""

from __future__ import annotations

from typing import Sequence

import math
import operator
from typing import Optional, Union

import numpy as np

from .arith import float_parts, round_scaled_int

__all__ = [
    "exact_ints",
    "exact_mode_chain",
    "round_exact",
    "DATASETS",
    "dataset",
    "chain_operators",
    "cycling_axes",
    "error_metrics",
]

#: The input distributions of [2610.05059] Sec. 6.2.1, in the paper's order.
DATASETS = ("uniform", "smooth", "wide160")

RngLike = Union[None, int, np.random.Generator]


def exact_ints(x) -> tuple[np.ndarray, int]:
    """``x == ints * 2**k`` exactly: an object array of Python ints and one common exponent ``k``.

    Examples
    --------
    >>> ints, k = exact_ints(np.array([0.75, -2.0]))
    >>> ints.tolist(), k
    ([3, -8], -2)
    """
    x = np.asarray(x, dtype=np.float64)
    if not np.isfinite(x).all():
        raise ValueError("exact_ints: x must be finite")
    m, k = float_parts(x)
    nz = m != 0
    # strip the trailing zero bits of every significand: smaller ints, and the smallest exponent is odd
    low = np.where(nz, m & -m, 1)  # the lowest set bit, a power of two <= 2**53
    tz = np.frexp(low.astype(np.float64))[1].astype(np.int64) - 1
    m, k = m >> tz, k + tz
    k0 = int(k[nz].min()) if nz.any() else 0
    shift = np.where(nz, k - k0, 0)
    ints = m.astype(object) * (np.full(x.shape, 2, dtype=object) ** shift.astype(object))
    return ints, k0


def exact_mode_chain(x, operators: Sequence, axes: Sequence[int], ndim: Optional[int] = None) -> tuple[np.ndarray, int]:
    """The exact value of ``A_d ×_{m_d} ( ... (A_1 ×_{m_1} x))`` as ``(ints, k)`` with value ``ints * 2**k``.

    Every float64 entry is an integer times a power of two, so the whole chain
    is integer arithmetic on one common exponent: object-dtype ``tensordot``
    on Python ints, nothing rounded (a chain of depth 8 on 32 tensors of
    ``8**3`` entries takes a fraction of a second).

    Parameters
    ----------
    x : array_like of float
        ``(*batch, *tensor)``, finite.
    operators : sequence of 2-D float arrays
        ``A_i`` (``n_out × n_in``), applied in order.
    axes : sequence of int
        The contracted axis of each product, counted within the trailing
        ``ndim`` tensor axes (as in :func:`rnstensor.plan_chain`).
    ndim : int, optional
        Number of tensor axes (default ``max(axes) + 1``); leading axes of
        ``x`` beyond these are a batch.

    Returns
    -------
    ints : ndarray of object (Python ints)
    k : int
        The exact result is ``ints * 2**k``; :func:`round_exact` rounds it once.

    Examples
    --------
    >>> ints, k = exact_mode_chain(np.array([[1.0, 0.5]]), [np.array([[0.25, 1.0]])], [1])
    >>> ints.tolist(), k
    ([[6]], -3)
    """
    ops = list(operators)
    axes = list(axes)
    if not ops:
        raise ValueError("operators is empty: a chain needs at least one operator")
    if len(axes) != len(ops):
        raise ValueError(f"got {len(ops)} operators but {len(axes)} axes; give one axis per operator")
    try:
        axes = [operator.index(a) for a in axes]
    except TypeError:
        raise TypeError(f"axes must be integers; got {axes!r}") from None
    if ndim is None:
        if min(axes) < 0:
            raise ValueError(f"axes {axes} has negative entries: give ndim= (the number of tensor axes)")
        ndim = max(axes) + 1
    ndim = operator.index(ndim)
    bad = [a for a in axes if not -ndim <= a < ndim]
    if bad:
        raise ValueError(f"axes {bad} are out of range for ndim={ndim} tensor axes")
    axes = [a % ndim for a in axes]
    xa = np.asarray(x, dtype=np.float64)
    if xa.ndim < ndim:
        raise ValueError(f"x must have at least ndim={ndim} axes; got shape {xa.shape}")
    batch = xa.ndim - ndim
    shape = list(xa.shape)
    v, k = exact_ints(xa)
    for i, (A, ax) in enumerate(zip(ops, axes)):
        A = np.asarray(A, dtype=np.float64)
        if A.ndim != 2:
            raise ValueError(f"operators[{i}] must be a 2-D matrix (n_out x n_in); got shape {A.shape}")
        if A.shape[1] != shape[batch + ax]:
            raise ValueError(
                f"operators[{i}] has {A.shape[1]} columns but tensor axis {ax} has length {shape[batch + ax]} "
                f"at that step"
            )
        a_ints, ka = exact_ints(A)
        v = np.moveaxis(np.tensordot(a_ints, v, axes=([1], [batch + ax])), 0, batch + ax)
        shape[batch + ax] = A.shape[0]
        k += ka
    return v, k


def round_exact(ints: np.ndarray, k: int) -> np.ndarray:
    """``ints * 2**k`` rounded once to nearest-even float64, entry by entry."""
    ints = np.asarray(ints, dtype=object)
    out = np.empty(ints.shape, dtype=np.float64)
    flat, o = ints.reshape(-1), out.reshape(-1)
    for i in range(flat.size):
        o[i] = round_scaled_int(flat[i], k)
    return out


# ----- datasets and operators of [2610.05059] Sec. 6.2.1 ---------------------------------------


def _positive_int(value, name: str) -> int:
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be a positive integer; got {value!r}") from None
    if isinstance(value, bool) or v < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return v


def _rng(rng: RngLike) -> np.random.Generator:
    if rng is None or isinstance(rng, np.random.Generator):
        return np.random.default_rng(rng)
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) and rng >= 0:
        return np.random.default_rng(int(rng))
    raise ValueError(f"rng must be None, a non-negative int seed or a numpy Generator; got {rng!r}")


def dataset(name: str, count: int = 32, n: int = 8, rng: RngLike = None) -> np.ndarray:
    """``count`` float64 tensors of shape ``(n, n, n)`` from one input distribution of [2610.05059] Sec. 6.2.1.

    Parameters
    ----------
    name : {'uniform', 'smooth', 'wide160'}
        ``'uniform'``: every entry i.i.d. U[-1, 1).
        ``'smooth'``: Eq. 29, ``X(x, y, z) = a sin(3x + phi1) cos(5y + phi2) exp(c z)``
        sampled on the unit grid ``x, y, z = linspace(0, 1, n)`` (tensor axes 0,
        1, 2 are x, y, z), with one draw per tensor of the amplitude
        ``a ~ U(0.5, 2)``, the phases ``phi1, phi2 ~ U(0, 2 pi)`` and the growth
        rate ``c ~ U(0.5, 1.5)``. Separable (rank one) up to float64 rounding.
        ``'wide160'``: every entry ``± m * 2**k`` with ``m ~ U[1, 2)``, ``k`` a
        uniform integer in ``[-80, 80]`` (inclusive) and a random sign: a
        160-bit exponent span.
    count : int
        Number of tensors (the paper uses 32).
    n : int
        Mode size (the paper uses 8).
    rng : None, int or numpy.random.Generator
        Source of randomness (an int is a seed for ``default_rng``; ``None``
        draws fresh entropy, as numpy does).

    Returns
    -------
    ndarray of float64, shape ``(count, n, n, n)``

    Examples
    --------
    >>> X = dataset("wide160", count=2, n=4, rng=0)
    >>> X.shape, bool(np.all(np.abs(X) >= 2.0**-80) and np.all(np.abs(X) < 2.0**81))
    ((2, 4, 4, 4), True)
    """
    if name not in DATASETS:
        raise ValueError(f"name must be one of {DATASETS}; got {name!r}")
    count = _positive_int(count, "count")
    n = _positive_int(n, "n")
    g = _rng(rng)
    shape = (count, n, n, n)
    if name == "uniform":
        return g.uniform(-1.0, 1.0, size=shape)
    if name == "wide160":
        mant = g.uniform(1.0, 2.0, size=shape)
        k = g.integers(-80, 80, size=shape, endpoint=True)
        sign = np.where(g.integers(0, 2, size=shape) == 1, 1.0, -1.0)
        return sign * np.ldexp(mant, k.astype(np.int32))  # exact: a power-of-two scaling in the normal range
    # smooth: draws in the order a, (phi1, phi2), c, each one value per tensor
    a = g.uniform(0.5, 2.0, size=count)
    phi = g.uniform(0.0, 2.0 * math.pi, size=(count, 2))
    c = g.uniform(0.5, 1.5, size=count)
    t = np.linspace(0.0, 1.0, n)
    fx = np.sin(3.0 * t[None, :] + phi[:, :1])  # (count, n) along axis x
    fy = np.cos(5.0 * t[None, :] + phi[:, 1:])  # along y
    fz = np.exp(c[:, None] * t[None, :])  # along z
    return a[:, None, None, None] * fx[:, :, None, None] * fy[:, None, :, None] * fz[:, None, None, :]


def chain_operators(d: int, n: int = 8, rng: RngLike = None) -> list[np.ndarray]:
    """``d`` operators ``n × n`` with entries i.i.d. U[-1, 1), drawn one after another from ``rng``.

    With ``rng = numpy.random.default_rng(0)`` these are the operators on which
    :func:`rnstensor.plan_chain` reproduces [2610.05059] Table 2; a fresh
    generator per depth makes the depth-``d`` operators a prefix of the
    depth-``d + 1`` ones.

    Examples
    --------
    >>> ops = chain_operators(3, n=4, rng=0)
    >>> len(ops), ops[0].shape
    (3, (4, 4))
    """
    d = _positive_int(d, "d")
    n = _positive_int(n, "n")
    g = _rng(rng)
    return [g.uniform(-1.0, 1.0, size=(n, n)) for _ in range(d)]


def cycling_axes(d: int, ndim: int = 3) -> tuple[int, ...]:
    """The contracted modes of [2610.05059] Sec. 6.2.1: ``(0, 1, 2, 0, 1, 2, ...)``, ``d`` of them.

    Examples
    --------
    >>> cycling_axes(8)
    (0, 1, 2, 0, 1, 2, 0, 1)
    """
    d = _positive_int(d, "d")
    ndim = _positive_int(ndim, "ndim")
    return tuple(i % ndim for i in range(d))


def error_metrics(Y, Yref) -> dict:
    """The error metrics of [2610.05059] Sec. 6.2.2 (Eq. 30-32) of ``Y`` against the reference ``Yref``.

    ``normwise = max_i |Y_i - Yref_i| / max_i |Yref_i|`` (Eq. 30; the plain
    ``max_i |Y_i - Yref_i|`` when ``Yref`` is all zero);
    ``eps_i = |Y_i - Yref_i| / |Yref_i|`` where ``Yref_i != 0`` and
    ``|Y_i - Yref_i|`` where ``Yref_i == 0`` (Eq. 31); ``max`` and ``median``
    are its maximum and median over all entries (Eq. 32). The index ``i``
    runs over every entry of the arrays (batch included). Non-finite entries
    of ``Y`` give ``inf`` / ``nan`` errors rather than an exception.

    Parameters
    ----------
    Y, Yref : array_like of float
        Same shape; ``Yref`` finite (round the exact value once with
        :func:`round_exact`).

    Returns
    -------
    dict
        ``{'normwise': float, 'max': float, 'median': float}``.

    Examples
    --------
    >>> m = error_metrics(np.array([1.0, 2.5, 1e-3]), np.array([1.0, 2.0, 0.0]))
    >>> m["normwise"], m["max"], m["median"]
    (0.25, 0.25, 0.001)
    """
    y = np.asarray(Y, dtype=np.float64)
    ref = np.asarray(Yref, dtype=np.float64)
    if y.shape != ref.shape:
        raise ValueError(f"Y and Yref must have the same shape; got {y.shape} and {ref.shape}")
    if ref.size == 0:
        raise ValueError("Yref is empty: there is nothing to compare")
    if not np.isfinite(ref).all():
        raise ValueError(f"Yref has {int((~np.isfinite(ref)).sum())} non-finite entries; the reference must be finite")
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(y - ref)
        mag = np.abs(ref)
        top = float(mag.max())
        normwise = float(diff.max()) / top if top > 0 else float(diff.max())
        eps = np.where(mag > 0, diff / np.where(mag > 0, mag, 1.0), diff)
    return {"normwise": normwise, "max": float(np.max(eps)), "median": float(np.median(eps))}
