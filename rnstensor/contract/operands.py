"""Operands as the residues take them: kinds and checks, diagonals and broadcasts, one operand's encoding."""

from __future__ import annotations

import numpy as np

from ..arrays import array_module, exact_float
from ..basis import Basis
from ..encode import encode, encode_checked
from ..tensor import RNSTensor, Scale
from .parse import _unique

__all__ = ["_as_float", "_operand_kind", "_check_finite", "_encode_leaf", "_tensor_diagonal", "_tensor_broadcast",
           "_leaf_array"]


def _as_float(x, i: int, what: str = "operand"):
    """``x`` as float64 (or complex128) where that holds it exactly (:func:`rnstensor.arrays.exact_float`);
    RNSTensor operands as they are."""
    return x if isinstance(x, RNSTensor) else exact_float(x, f"{what} {i}", "einsum")


def _operand_kind(x, i: int) -> tuple[str, bool]:
    """``('tensor', False)`` for an RNSTensor, else ``('input', is_complex)``; other dtypes rejected."""
    if isinstance(x, RNSTensor):
        return "tensor", False
    dt = getattr(x, "dtype", None)
    if dt is None:
        x = np.asarray(x)
        dt = x.dtype
    if dt == np.float64:
        return "input", False
    if dt == np.complex128:
        return "input", True
    raise TypeError(
        f"einsum: operand {i} has dtype {dt}; rnstensor.einsum takes what float64 or complex128 holds exactly "
        f"(bool, integers up to 2^53, float16/32/64, complex64/128); convert it with .astype(np.float64)"
    )


def _check_finite(x, i: int, what: str = "operand") -> None:
    if not bool(array_module(x).isfinite(x).all()):
        raise ValueError(f"einsum: {what} {i} holds inf or NaN; residues hold finite values only"
                         + (" (nonfinite='propagate' follows numpy for operands, not constants)" if what == "constant" else ""))


def _encode_leaf(x, basis: Basis, bits: int, shared: tuple[int, ...], be=None, xp=None) -> RNSTensor:
    """One operand's encoding: module level so that tests can count how often constants are encoded. ``be`` and
    ``xp``: the call's backend and array module, where the caller has them (the leaf is then encoded as it is:
    a finite, nonempty float64 array, checked by the front end); else :func:`rnstensor.encode`'s checks."""
    if be is None:
        return encode(x, basis, bits=bits, shared_axes=shared)
    return encode_checked(x, basis, bits, tuple(shared), be, xp)


def _tensor_diagonal(T: RNSTensor, term: str) -> RNSTensor:
    """The diagonal an RNSTensor operand's repeated indices select (residues and exponents: a pure selection)."""
    labels = _unique(term)
    letters = {c: chr(ord("a") + k) for k, c in enumerate(labels)}
    src, dst = "".join(letters[c] for c in term), "".join(letters[c] for c in labels)
    xp = array_module(T.residues)
    planes = xp.ascontiguousarray(xp.einsum(f"z{src}->z{dst}", T.residues))
    exp = xp.einsum(f"{src}->{dst}", xp.broadcast_to(T.exponent().astype(np.int64, copy=False), T.shape))
    return RNSTensor(planes, T.basis, T.active, T.bound, Scale(0, T.scale.factor, (None,) * len(labels), exp))


def _tensor_broadcast(T: RNSTensor, labels: str, sizes: dict) -> RNSTensor:
    """An RNSTensor operand with its size-1 axes repeated to the index sizes (numpy's broadcasting; exact)."""
    full = tuple(sizes[c] for c in labels)
    if tuple(T.shape) == full:
        return T
    xp = array_module(T.residues)
    planes = xp.ascontiguousarray(xp.broadcast_to(T.residues, (T.residues.shape[0],) + full))
    exp = xp.broadcast_to(T.exponent().astype(np.int64, copy=False), full)
    return RNSTensor(planes, T.basis, T.active, T.bound, Scale(0, T.scale.factor, (None,) * len(full), exp))


def _leaf_array(term: str, sizes: dict, x, cplx: bool, xp):
    """An operand as encoded: diagonals taken, broadcast to the full sizes, complex parts stacked first (where it
    lives: ``xp``)."""
    x = xp.asarray(x)
    labels = _unique(term)
    if labels != term:
        x = xp.einsum(f"{term}->{labels}", x)  # a diagonal is a selection: exact
    x = xp.broadcast_to(x, tuple(sizes[c] for c in labels))
    if cplx:
        x = xp.stack([x.real, x.imag])
    return x.astype(np.float64, order="C", copy=False)  # (ascontiguousarray would make a 0-d operand 1-d)
