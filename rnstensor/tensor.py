"""RNSTensor: residue planes, the exact scale that decodes them, and a rigorous bound."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .arrays import array_module, is_device_array
from .basis import Basis, log2_int
from .errors import RNSRangeError

__all__ = ["Scale", "RNSTensor"]


def _frozen(a):
    """An int64 copy that nothing changes: read-only on the host; a private copy on the device (CuPy has no flag)."""
    if a is None:
        return None
    if is_device_array(a):
        return a.astype(np.int64, copy=True)
    if isinstance(a, np.ndarray) and a.dtype == np.int64 and not a.flags.writeable and a.base is None:
        return a  # already a frozen array of its own (the executor's exponents): nothing can change it
    a = np.array(a, dtype=np.int64, copy=True)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Scale:
    """Exact decoding scale: ``value = v * factor * 2**(exp2 + sum_a axes[a][i_a] + field)``.

    Attributes
    ----------
    exp2 : int
        Scalar power-of-two exponent (``-e`` of a whole-tensor encoding).
    factor : int
        Product of the moduli dropped so far (Alg. 1 multiplies it by ``q``).
    axes : tuple of (ndarray of int64 or None)
        One entry per tensor axis: the pending exponent of every index along
        that axis (operator row scales after a mode product, or per-row
        encoding exponents), or ``None`` when the axis has none.
    field : ndarray of int64 or None
        Exponents that vary jointly along several axes (a grouped encoding),
        shaped like the tensor with size 1 along the axes they are shared on.

    The exponent arrays live where the residues do: NumPy arrays for a
    tensor on the host, CuPy arrays for one on the device.
    """

    exp2: int = 0
    factor: int = 1
    axes: tuple = ()
    field: Optional[np.ndarray] = None

    def __post_init__(self):
        object.__setattr__(self, "exp2", int(self.exp2))
        object.__setattr__(self, "factor", int(self.factor))
        if self.factor < 1:
            raise ValueError(f"Scale.factor must be a positive integer; got {self.factor}")
        object.__setattr__(self, "axes", tuple(_frozen(a) for a in self.axes))
        object.__setattr__(self, "field", _frozen(self.field))

    @classmethod
    def unit(cls, ndim: int) -> "Scale":
        """The scale of a plain integer tensor: 1."""
        return cls(0, 1, (None,) * ndim, None)

    def exponent(self, xp=None) -> np.ndarray:
        """The power-of-two exponent of every entry, as a small int64 array that broadcasts to the shape.

        Only the axes that carry exponents have their full length; the rest are 1.
        ``xp``: the array module to build it in (default: that of the exponent
        arrays, NumPy for a scalar scale); a device tensor's residues' module.
        """
        ndim = len(self.axes)
        xp = array_module(*self.axes, self.field, fn="Scale") if xp is None else xp
        if self.exp2 == 0 and self.field is not None and all(v is None for v in self.axes) \
                and array_module(self.field) is xp and self.field.ndim == ndim:
            return self.field  # read-only (or a private device copy): no copy of a full-size exponent array
        e = xp.full((1,) * ndim, self.exp2, dtype=np.int64)
        for a, vec in enumerate(self.axes):
            if vec is not None:
                idx = [None] * ndim
                idx[a] = slice(None)
                e = e + vec[tuple(idx)]
        if self.field is not None:
            e = e + self.field
        return e

    def replace(self, **changes) -> "Scale":
        """A copy with some fields changed."""
        kw = dict(exp2=self.exp2, factor=self.factor, axes=self.axes, field=self.field)
        kw.update(changes)
        return Scale(**kw)

    def same_as(self, other: "Scale") -> bool:
        """Exact equality of every part (the condition for ``add``/``sub``)."""
        if self.exp2 != other.exp2 or self.factor != other.factor:
            return False
        if len(self.axes) != len(other.axes):
            return False
        for a, b in zip(self.axes, other.axes):
            if (a is None) != (b is None) or (a is not None and not _equal(a, b)):
                return False
        if (self.field is None) != (other.field is None):
            return False
        return self.field is None or _equal(self.field, other.field)

    def __repr__(self) -> str:
        parts = [f"2^{self.exp2}"]
        if self.factor != 1:
            parts.append(f"factor~2^{log2_int(self.factor):.1f}")
        pend = [a for a, v in enumerate(self.axes) if v is not None]
        if pend:
            parts.append(f"pending axes {pend}")
        if self.field is not None:
            parts.append(f"field {self.field.shape}")
        return "Scale(" + ", ".join(parts) + ")"


def _equal(a, b) -> bool:
    """Exact equality of two exponent arrays on one side of the bus (one scalar read back from a device)."""
    xp = array_module(a, b, fn="Scale")
    return a.shape == b.shape and bool(xp.array_equal(a, b))


class RNSTensor:
    """A real tensor held exactly as residue planes: ``X = v * scale``, ``|v| <= bound``.

    Parameters
    ----------
    residues : ndarray of int8, shape ``(L, *shape)``
        Plane ``i`` holds the centered residues of ``v`` modulo ``active[i]``.
        A NumPy array (the tensor lives on the host) or a CuPy array (on the
        device; its scale's exponent arrays then live there too).
    basis : Basis
        The working basis.
    active : tuple of int
        The moduli currently held, in basis order (fewer after a drop).
    bound : int
        A Python int with ``|v| <= bound`` for every entry; ``2*bound`` must be
        below the product of the active moduli.
    scale : Scale
        The exact decoding scale.
    negative_zeros : ndarray of bool, optional
        Entries that were ``-0.0`` at encoding; kept only until arithmetic
        changes the integers (an integer has one zero).

    Notes
    -----
    Instances are produced by :func:`rnstensor.encode` and the primitives
    (:func:`rnstensor.mode_product`, :func:`rnstensor.drop`, ...), which keep
    the invariants; constructing one by hand checks the cheap ones only
    (:meth:`validate` checks every residue).
    """

    __slots__ = ("residues", "basis", "active", "bound", "scale", "negative_zeros", "_row_sums")

    def __init__(self, residues, basis: Basis, active, bound: int, scale: Scale, negative_zeros=None):
        if not isinstance(basis, Basis):
            raise TypeError(f"RNSTensor: basis must be a Basis; got {type(basis).__name__}")
        active = tuple(int(p) for p in active)
        order = [p for p in basis.moduli if p in active]
        if len(order) != len(active) or tuple(order) != active:
            raise ValueError(
                f"RNSTensor: active moduli {active} must be distinct members of the basis, in basis order"
            )
        if getattr(residues, "dtype", None) != np.int8:
            raise TypeError(f"RNSTensor: residues must be int8; got {getattr(residues, 'dtype', type(residues))}")
        if residues.ndim < 1 or residues.shape[0] != len(active):
            raise ValueError(
                f"RNSTensor: residues need one plane per active modulus ({len(active)}); got shape {residues.shape}"
            )
        bound = int(bound)
        if bound < 0:
            raise ValueError(f"RNSTensor: bound must be >= 0; got {bound}")
        prod = math.prod(active)
        if 2 * bound >= prod:
            raise RNSRangeError(
                f"RNSTensor: bound 2^{log2_int(bound):.2f} does not fit the centered range of the "
                f"active moduli (2*bound must be < 2^{log2_int(prod):.2f})"
            )
        if len(scale.axes) != residues.ndim - 1:
            raise ValueError(f"RNSTensor: scale has {len(scale.axes)} axes for a {residues.ndim - 1}-d tensor")
        self.residues = residues
        self.basis = basis
        self.active = active
        self.bound = bound
        self.scale = scale
        self.negative_zeros = negative_zeros
        self._row_sums = None

    # ----- shape --------------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        """The tensor shape (without the plane axis)."""
        return tuple(self.residues.shape[1:])

    @property
    def ndim(self) -> int:
        """Number of tensor axes."""
        return self.residues.ndim - 1

    @property
    def size(self) -> int:
        """Number of tensor entries."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def active_product(self) -> int:
        """Exact product of the active moduli."""
        return math.prod(self.active)

    @property
    def log2_bound(self) -> float:
        """``log2`` of the magnitude bound."""
        return log2_int(self.bound)

    @property
    def log2_range(self) -> float:
        """``log2(P_active / 2)``: the centered range limit of the active moduli."""
        return log2_int(self.active_product) - 1.0

    def exponent(self, xp=None):
        """The power-of-two exponent of every entry (:meth:`Scale.exponent`), where the residues live (``xp``: their
        array module, where the caller has it)."""
        return self.scale.exponent(array_module(self.residues) if xp is None else xp)

    def plane(self, p: int) -> np.ndarray:
        """The residue plane of active modulus ``p``."""
        return self.residues[self.active.index(p)]

    def validate(self) -> None:
        """Check every residue lies in its centered interval (raises ``ValueError``)."""
        for i, p in enumerate(self.active):
            r = self.residues[i]
            lo, hi = -(p // 2), (p + 1) // 2 - 1
            if r.size and (int(r.min()) < lo or int(r.max()) > hi):  # two scalars read back from a device
                raise ValueError(f"RNSTensor: plane {i} (modulus {p}) has residues outside [{lo}, {hi}]")

    def __repr__(self) -> str:
        return (
            f"RNSTensor(s={len(self.active)}/{len(self.basis)}, shape={self.shape}, "
            f"log2 bound={self.log2_bound:.1f}, log2 range={self.log2_range:.1f}, scale={self.scale!r})"
        )
