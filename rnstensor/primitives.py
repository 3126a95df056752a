"""The exact residue primitives on RNSTensor: products, sums, drop, base extension, decode.

Each checks its input, updates the bound and the scale exactly, raises
:class:`RNSRangeError` before a result could leave the centered range, and
hands the residue arithmetic to the backend.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from . import arith
from .arrays import array_module, is_device_array, to_host
from .backends import dispatch
from .encode import normalize_axis
from .errors import range_error
from .tensor import RNSTensor, Scale

__all__ = [
    "mode_product",
    "hadamard",
    "add",
    "sub",
    "drop",
    "base_extend",
    "decode",
    "to_int",
    "operator_row_sums",
    "operator_rho",
    "fold_pending",
    "fold_exponents",
    "strip_pending",
]

DECODE_MODES = ("fp64", "exact")


def _check_tensor(T, name: str) -> RNSTensor:
    if not isinstance(T, RNSTensor):
        raise TypeError(f"{name} must be an RNSTensor (see rnstensor.encode); got {type(T).__name__}")
    return T


def _check_same_basis(T: RNSTensor, U: RNSTensor, names: str) -> None:
    if T.basis != U.basis:
        raise ValueError(f"{names} are on different bases ({T.basis!r} vs {U.basis!r}); encode both on one basis")


def _backend(fn: str, backend, *tensors: RNSTensor, names: tuple[str, ...]):
    """The backend for a primitive on ``tensors``: CuPy residues run on 'cuda'; host and device mixed is an error."""
    be, _ = dispatch(*(T.residues for T in tensors), backend=backend, names=names, fn=fn)
    return be


def _planes_on(U: RNSTensor, active: tuple[int, ...], name: str) -> np.ndarray:
    """``U``'s planes for the moduli ``active`` (a subset of ``U.active``), in that order."""
    if U.active == active:
        return U.residues
    missing = [p for p in active if p not in U.active]
    if missing:
        raise ValueError(
            f"{name} lacks the moduli {missing} held by the other operand; base_extend it first"
        )
    return U.residues[[U.active.index(p) for p in active]]


def to_int(T: RNSTensor) -> np.ndarray:
    """The exact integers ``v`` held by ``T``, as an object array of Python ints.

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> T = rt.encode(np.array([1.5, -2.0]), 15, bits=3)
    >>> rt.to_int(T).tolist()  # 2**e with e = 3 - 2 = 1
    [3, -4]
    """
    _check_tensor(T, "T")
    return arith.to_int_ref(to_host(T.residues), T.active)


def _split_row_sums(v):
    """Exact ``sum_k |v[j, k]|`` of an int64 matrix (``|v| <= 2**53``, ``k < 2**36``) as normalized 26-bit limbs ``(hi, lo)``."""
    xp = array_module(v)
    a = xp.abs(v)
    hi = (a >> 26).sum(axis=1)
    lo = (a & ((1 << 26) - 1)).sum(axis=1)
    return hi + (lo >> 26), lo & ((1 << 26) - 1)


def _device_integers(op: RNSTensor):
    """A device operator's integers as int64 on the device (its exact decode is exact: ``bound <= 2**53``), or None."""
    if op.bound > 1 << 53 or op.ndim != 2:
        return None
    xp = array_module(op.residues)
    be = _backend("operator_rho", None, op, names=("op",))
    v = be.decode(op.residues, op.active, xp.zeros((1, 1), np.int64), 1, "exact")
    return v.reshape(op.shape).astype(np.int64)


def operator_row_sums(op: RNSTensor) -> tuple[int, ...]:
    """Exact ``sum_k |op[j, k]|`` of the integer operator for every row ``j`` (cached on ``op``).

    A device operator's sums are taken on the device and only the row sums read back.
    """
    if op._row_sums is None:
        v = _device_integers(op) if is_device_array(op.residues) else None
        if v is not None:
            hi, lo = (to_host(x) for x in _split_row_sums(v))
            op._row_sums = tuple((int(h) << 26) + int(l) for h, l in zip(hi, lo))
        else:
            v = to_int(op)
            op._row_sums = tuple(int(sum(abs(int(a)) for a in row)) for row in v)
    return op._row_sums


def _device_rho(op: RNSTensor) -> Optional[int]:
    """The exact largest row sum of a device operator from two scalars read back (None where it does not apply)."""
    v = _device_integers(op)
    if v is None or v.size == 0:
        return None
    xp = array_module(v)
    hi, lo = _split_row_sums(v)
    top = hi.max()
    return (int(top) << 26) + int(xp.where(hi == top, lo, -1).max())


# past this many entries an operator's exact row sums (Python ints per entry) cost more than
# the product itself; mode_product then uses the a-priori n_in * bound, which is as rigorous
EXACT_ROW_SUMS_MAX = 1 << 16


def operator_rho(op: RNSTensor) -> int:
    """The bound growth of a product with ``op``: its exact largest row sum (Eq. 21) when known or cheap.

    Exact for operators of at most ``EXACT_ROW_SUMS_MAX`` entries or with
    row sums already known (a plan's operators carry the planner's); else
    ``n_in * op.bound``, a rigorous upper bound.
    """
    if op._row_sums is None and op.size <= EXACT_ROW_SUMS_MAX and is_device_array(op.residues):
        rho = _device_rho(op)
        if rho is not None:
            return rho
    if op._row_sums is not None or op.size <= EXACT_ROW_SUMS_MAX:
        return max(operator_row_sums(op), default=0)
    return op.shape[1] * op.bound


def mode_product(T: RNSTensor, op: RNSTensor, axis: int, *, backend: Optional[str] = None) -> RNSTensor:
    """Contract axis ``axis`` of ``T`` with the encoded operator ``op`` (``n_out × n_in``).

    ``v'[..., j, ...] = sum_k op[j, k] v[..., k, ...]`` on every active modulus;
    the bound becomes ``bound * rho`` with ``rho = max_j sum_k |op[j, k]|``
    ([2610.05059] Eq. 21-22; see :func:`operator_rho` for large operators). The
    operator's row exponents become the pending scale of ``axis``; its scalar
    exponent and factor multiply ``T``'s.

    Parameters
    ----------
    T : RNSTensor
        Any order; axes other than ``axis`` (batch axes included) are untouched.
    op : RNSTensor
        A 2-D encoded operator, typically ``encode(A, basis, bits, shared_axes=(1,))``.
    axis : int
        The contracted axis of ``T``; it must carry no pending scale
        (fold it with :func:`fold_pending` first).

    Raises
    ------
    RNSRangeError
        If ``2 * bound * rho`` reaches the product of the active moduli.

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> B = rt.Basis.int8(15)
    >>> X = rt.encode(np.arange(6.0).reshape(2, 3), B)
    >>> A = rt.encode(np.array([[1.0, 0, 0], [1, 1, 1]]), B, shared_axes=(1,))
    >>> rt.decode(rt.mode_product(X, A, 1))
    array([[ 0.,  3.],
           [ 3., 12.]])
    """
    _check_tensor(T, "T")
    _check_tensor(op, "op")
    _check_same_basis(T, op, "T and op")
    if op.ndim != 2:
        raise ValueError(f"op must be a 2-D operator (n_out × n_in); got shape {op.shape}")
    if T.ndim == 0:
        raise ValueError("T is 0-d: a mode product needs at least one axis")
    a = normalize_axis(axis, T.ndim)
    n_out, n_in = op.shape
    if T.shape[a] != n_in:
        raise ValueError(
            f"op has {n_in} columns but axis {a} of T has length {T.shape[a]} (T.shape={T.shape}); "
            f"the operator must be n_out × {T.shape[a]}"
        )
    if T.scale.axes[a] is not None:
        raise ValueError(
            f"axis {a} of T carries a pending scale from an earlier product; fold it into the operator "
            f"with rnstensor.fold_pending(T, A, {a}) and encode that effective operator"
        )
    if T.scale.field is not None and T.scale.field.shape[a] != 1:
        raise ValueError(
            f"T's encoding exponents vary along axis {a}; encode T with shared_axes including {a}"
        )
    if op.scale.axes[1] is not None or op.scale.field is not None:
        raise ValueError(
            "op must share one exponent along each row (encode it with shared_axes=(1,) or None)"
        )
    be = _backend("mode_product", backend, T, op, names=("T", "op"))
    bound = T.bound * operator_rho(op)
    P = T.active_product
    if 2 * bound >= P:
        raise range_error(f"mode_product along axis {a}", bound, P, active=T.active)
    planes = be.product(_planes_on(op, T.active, "op"), T.residues, T.active, a)
    axes = list(T.scale.axes)
    axes[a] = op.scale.axes[0]
    # a field has size 1 along the contracted axis, so it still broadcasts to the new length n_out
    scale = Scale(T.scale.exp2 + op.scale.exp2, T.scale.factor * op.scale.factor, tuple(axes), T.scale.field)
    return RNSTensor(planes, T.basis, T.active, bound, scale)


def fold_exponents(A, pending: Optional[np.ndarray]) -> tuple[np.ndarray, int]:
    """The effective operator ``A_eff = A * 2**(pending - c)`` column by column, and ``c = max(pending)``.

    Only the relative exponents go into ``A``'s columns (all factors <= 1);
    the common ``2**c`` belongs to the scalar exponent. Row encoding is
    invariant under a power-of-two factor, so the integers are the ones the
    full folding of [2610.05059] Sec. 5.2 gives, without its exponent growth.

    Raises
    ------
    ValueError
        If the scaling is not exact in float64 (underflow).
    """
    A = np.asarray(A, dtype=np.float64)
    if pending is None:
        return A, 0
    pending = np.asarray(pending, dtype=np.int64)
    c = int(pending.max())
    rel = (pending - c)[None, :]
    eff = np.ldexp(A, np.maximum(rel, -(1 << 20)).astype(np.int32))
    back = np.ldexp(eff, (-rel).astype(np.int32))
    if not np.array_equal(back, A):
        lost = A[back != A]
        raise ValueError(
            f"folding pending exponents (scales 2**{int(rel.min())} .. 2**0 on its columns) into the operator is "
            f"inexact in float64: entries as small as {float(np.abs(lost).min()):.3g} would lose bits below the "
            f"subnormal range; scale the operator up by a power of two"
        )
    return eff, c


def strip_pending(T: RNSTensor, axis: int) -> tuple[RNSTensor, Optional[np.ndarray]]:
    """``T`` without the pending scale of ``axis`` (its maximum moved to the scalar exponent), and that scale."""
    _check_tensor(T, "T")
    a = normalize_axis(axis, T.ndim)
    pend = T.scale.axes[a]
    if pend is None:
        return T, None
    axes = list(T.scale.axes)
    axes[a] = None
    scale = T.scale.replace(axes=tuple(axes), exp2=T.scale.exp2 + int(pend.max()))
    return RNSTensor(T.residues, T.basis, T.active, T.bound, scale, T.negative_zeros), pend


def fold_pending(T: RNSTensor, A, axis: int) -> tuple[np.ndarray, RNSTensor]:
    """Fold ``T``'s pending scale on ``axis`` into the columns of the float operator ``A``.

    Returns ``(A_eff, T0)`` such that ``mode_product(T0, encode(A_eff, ...),
    axis)`` applies every scale exactly once (the effective operator of
    [2610.05059] Sec. 5.2): ``A_eff = A * 2**(pending - c)`` column by column
    and ``T0`` holds the same residues with that axis' scale replaced by the
    scalar ``2**c``, ``c = max(pending)`` (see :func:`fold_exponents`). With no
    pending scale, ``A_eff`` is ``A`` as float64 and ``T0`` is ``T``.

    Raises
    ------
    ValueError
        If ``A`` does not match the axis, or the scaling would underflow.

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> B = rt.Basis.int8(15)
    >>> X = rt.encode(np.ones((2, 2)), B, bits=20)
    >>> A = np.array([[1.0, 0.0], [0.0, 3.0]])
    >>> Y = rt.mode_product(X, rt.encode(A, B, bits=20, shared_axes=(1,)), 0)
    >>> A_eff, Y0 = rt.fold_pending(Y, A, 0)
    >>> rt.decode(rt.mode_product(Y0, rt.encode(A_eff, B, bits=20, shared_axes=(1,)), 0))
    array([[1., 1.],
           [9., 9.]])
    """
    _check_tensor(T, "T")
    a = normalize_axis(axis, T.ndim)
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 2 or A.shape[1] != T.shape[a]:
        raise ValueError(f"A must be 2-D with {T.shape[a]} columns (axis {a} of T); got shape {A.shape}")
    T0, pend = strip_pending(T, a)
    A_eff, _ = fold_exponents(A, pend)
    return A_eff, T0


def hadamard(T: RNSTensor, F: RNSTensor, *, backend: Optional[str] = None) -> RNSTensor:
    """Elementwise product with an encoded field ``F`` broadcast over ``T``'s leading axes.

    ``F.shape`` must broadcast to ``T.shape`` (numpy rules, aligned on the
    right). The bound becomes ``T.bound * F.bound``; scales multiply.

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> X = rt.encode(np.ones((2, 3)), 15)
    >>> w = rt.encode(np.array([0.5, 1.0, 2.0]), 15)
    >>> rt.decode(rt.hadamard(X, w))
    array([[0.5, 1. , 2. ],
           [0.5, 1. , 2. ]])
    """
    _check_tensor(T, "T")
    _check_tensor(F, "F")
    _check_same_basis(T, F, "T and F")
    try:
        out_shape = np.broadcast_shapes(T.shape, F.shape)
    except ValueError:
        out_shape = None
    if out_shape != T.shape:
        raise ValueError(f"F.shape {F.shape} must broadcast to T.shape {T.shape} (aligned on the right)")
    be = _backend("hadamard", backend, T, F, names=("T", "F"))
    bound = T.bound * F.bound
    P = T.active_product
    if 2 * bound >= P:
        raise range_error("hadamard", bound, P, active=T.active)
    planes = be.hadamard(T.residues, _planes_on(F, T.active, "F"), T.active)
    xp = array_module(planes)
    off = T.ndim - F.ndim
    axes = list(T.scale.axes)
    for b, vec in enumerate(F.scale.axes):
        if vec is None:
            continue
        a = b + off
        vec = xp.broadcast_to(vec, (T.shape[a],))
        axes[a] = vec if axes[a] is None else axes[a] + vec
    field = T.scale.field
    if F.scale.field is not None:
        ff = F.scale.field.reshape((1,) * off + F.scale.field.shape)
        field = ff if field is None else field + ff
    scale = Scale(T.scale.exp2 + F.scale.exp2, T.scale.factor * F.scale.factor, tuple(axes), field)
    return RNSTensor(planes, T.basis, T.active, bound, scale)


def _add_sub(T: RNSTensor, U: RNSTensor, subtract: bool, backend) -> RNSTensor:
    what = "sub" if subtract else "add"
    _check_tensor(T, "T")
    _check_tensor(U, "U")
    _check_same_basis(T, U, "T and U")
    if T.shape != U.shape:
        raise ValueError(f"{what}: T.shape {T.shape} and U.shape {U.shape} differ")
    if T.active != U.active:
        raise ValueError(f"{what}: T holds moduli {T.active} but U holds {U.active}; base_extend both first")
    if not T.scale.same_as(U.scale):
        raise ValueError(
            f"{what}: T and U must have the same scale (T: {T.scale!r}, U: {U.scale!r}); "
            f"encode them with one shared exponent (e.g. encode the stacked array) or decode first"
        )
    be = _backend(what, backend, T, U, names=("T", "U"))
    bound = T.bound + U.bound
    P = T.active_product
    if 2 * bound >= P:
        raise range_error(what, bound, P, active=T.active)
    planes = be.add(T.residues, U.residues, T.active, subtract)
    return RNSTensor(planes, T.basis, T.active, bound, T.scale)


def add(T: RNSTensor, U: RNSTensor, *, backend: Optional[str] = None) -> RNSTensor:
    """Elementwise ``T + U`` for tensors of equal shape, moduli and scale; bounds add.

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> X = rt.encode(np.array([[1.0, 2.0], [3.0, 4.0]]), 15)
    >>> rt.decode(rt.add(X, X))
    array([[2., 4.],
           [6., 8.]])
    """
    return _add_sub(T, U, False, backend)


def sub(T: RNSTensor, U: RNSTensor, *, backend: Optional[str] = None) -> RNSTensor:
    """Elementwise ``T - U`` for tensors of equal shape, moduli and scale; bounds add."""
    return _add_sub(T, U, True, backend)


def drop(
    T: RNSTensor,
    count: int = 1,
    *,
    extend: bool = False,
    moduli: Optional[Sequence[int]] = None,
    backend: Optional[str] = None,
) -> RNSTensor:
    """RnsDrop ([2610.05059] Alg. 1) ``count`` times, each time the smallest active modulus ``q``.

    Every drop replaces ``v`` by ``(v - [v]_q) / q`` (division with rounding to
    nearest), multiplies the scale factor by ``q`` and the bound becomes
    ``bound // q + 1``. With ``extend=True`` the base extension (Alg. 4) follows
    in the same pass per entry, restoring every basis modulus.

    Parameters
    ----------
    T : RNSTensor
    count : int
        How many of the smallest active moduli to drop.
    extend : bool
        Restore every basis modulus afterwards (fused with the drops).
    moduli : sequence of int, optional
        Drop exactly these active moduli, in this order, instead of the
        ``count`` smallest (``count`` is then ignored). The error-optimal
        planner uses it to divide by just enough.

    Raises
    ------
    ValueError
        If ``count`` is negative or would leave no modulus, or ``moduli`` are
        not distinct active moduli.
    RNSRangeError
        If a quotient's bound would not fit the remaining moduli.

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> T = rt.encode(np.array([24.0]), rt.Basis((7, 5, 3)), bits=5)
    >>> D = rt.drop(T)
    >>> D.active, D.scale.factor
    ((7, 5), 3)
    """
    _check_tensor(T, "T")
    if moduli is None:
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise ValueError(f"count must be a non-negative integer; got {count!r}")
        order = tuple(sorted(T.active)[: int(count)])
        if count >= len(T.active):
            raise ValueError(
                f"count={count} would drop every active modulus ({len(T.active)} held); at most {len(T.active) - 1}"
            )
    else:
        order = tuple(int(q) for q in moduli)
        bad = [q for q in order if q not in T.active]
        if bad or len(set(order)) != len(order) or len(order) >= len(T.active):
            raise ValueError(
                f"moduli={tuple(moduli)} must be distinct active moduli of T {T.active}, leaving at least one"
            )
    bound, factor, P = T.bound, T.scale.factor, T.active_product
    for i, q in enumerate(order):
        bound, factor, P = bound // q + 1, factor * q, P // q
        if 2 * bound >= P:
            raise range_error(f"drop {i + 1} of {len(order)} (modulus {q})", bound, P)
    if not order and not extend:
        return T
    be = _backend("drop", backend, T, names=("T",))
    drops = arith.drop_spec(T.active, order)
    planes, new_active = be.drop_extend(T.residues, T.active, T.basis, drops, extend)
    # no drop leaves the integers untouched (a pure extension): entries encoded from -0.0 stay -0.0
    negz = T.negative_zeros if not order else None
    return RNSTensor(planes, T.basis, new_active, bound, T.scale.replace(factor=factor), negz)


def base_extend(T: RNSTensor, *, backend: Optional[str] = None) -> RNSTensor:
    """Base extension ([2610.05059] Alg. 4): residues of the same integer on every basis modulus.

    Centered mixed-radix digits are computed once per entry (the even modulus
    first) and reused for every restored modulus. The integer, bound and scale
    are unchanged; it is exact because ``2 * bound < P_active`` always holds.

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> T = rt.drop(rt.encode(np.array([24.0]), rt.Basis((7, 5, 3)), bits=5))
    >>> E = rt.base_extend(T)
    >>> E.active, E.residues[:, 0].tolist()
    ((7, 5, 3), [1, -2, -1])
    """
    _check_tensor(T, "T")
    if T.active == T.basis.moduli:
        return T
    planes, active = _backend("base_extend", backend, T, names=("T",)).drop_extend(T.residues, T.active, T.basis, 0, True)
    return RNSTensor(planes, T.basis, active, T.bound, T.scale, T.negative_zeros)


def decode(T: RNSTensor, mode: str = "fp64", *, backend: Optional[str] = None) -> np.ndarray:
    """Decode to float64: ``v * factor * 2**exponent`` for every entry.

    Parameters
    ----------
    T : RNSTensor
    mode : {'fp64', 'exact'}
        ``'fp64'``: centered mixed-radix digits, float64 Horner, then the scale
        in float64 ([2610.05059] Alg. 5; a few roundings). ``'exact'``: the exact
        integer times the exact scale, rounded once to nearest-even: the
        correctly rounded value, subnormal results included; magnitudes at or
        beyond ``2**1024`` (after rounding) become ``±inf``.

    Returns
    -------
    ndarray of float64, shape ``T.shape``
        Where ``T`` lives: NumPy, or CuPy for a tensor on the device.
        Entries encoded from ``-0.0`` decode to ``-0.0`` while no arithmetic
        has touched them; every other integer zero is ``+0.0``. In ``'exact'``
        mode a nonzero negative value that rounds to zero gives ``-0.0`` (the
        correctly rounded result).

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> x = np.array([0.1, -2.5e-310, 3e300])
    >>> T = rt.encode(x, 15, shared_axes=())
    >>> bool((rt.decode(T, mode="exact") == x).all())
    True
    """
    _check_tensor(T, "T")
    if mode not in DECODE_MODES:
        raise ValueError(f"mode must be one of {DECODE_MODES}; got {mode!r}")
    be = _backend("decode", backend, T, names=("T",))
    out = be.decode(T.residues, T.active, T.exponent(), T.scale.factor, mode)
    out = array_module(out).asarray(out, dtype=np.float64).reshape(T.shape)
    if T.negative_zeros is not None:
        out[T.negative_zeros] = -0.0
    return out
