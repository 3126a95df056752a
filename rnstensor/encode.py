"""Float → residues: power-of-two group scaling, exact rounding, residue planes (any width)."""

from __future__ import annotations

import math
import operator
from typing import Optional, Sequence, Union

import numpy as np

from .arith import float_parts
from .arrays import array_module, to_host
from .backends import dispatch
from .basis import Basis, int8_pool
from .errors import RNSRangeError
from .tensor import RNSTensor, Scale

__all__ = ["encode", "exact_bits_needed", "entry_stats", "encode_integers", "as_basis", "check_float_array", "check_nonfinite", "finite_part", "NONFINITE", "normalize_axis",
           "group_exponents", "encode_checked"]


def as_basis(basis: Union[Basis, int, Sequence[int]], name: str = "basis") -> Basis:
    """A :class:`Basis` from a Basis, a modulus count ``s`` (``Basis.int8(s)``) or a tuple of moduli."""
    if isinstance(basis, Basis):
        return basis
    if isinstance(basis, (int, np.integer)) and not isinstance(basis, bool):
        try:
            return Basis.int8(int(basis))
        except ValueError:  # (the argument's own name, not Basis.int8's)
            raise ValueError(f"{name} must be a number of INT8 moduli, an integer in 1..{len(int8_pool())}; "
                             f"got {int(basis)}") from None
    if isinstance(basis, (tuple, list)):
        return Basis(basis)
    raise TypeError(
        f"{name} must be a Basis, a number of INT8 moduli (e.g. 15) or a tuple of moduli; got {type(basis).__name__}"
    )


def normalize_axis(axis, ndim: int, name: str = "axis") -> int:
    """``axis`` as a non-negative int, or ``ValueError`` naming the valid range."""
    try:
        a = operator.index(axis)
    except TypeError:
        raise TypeError(f"{name} must be an integer; got {type(axis).__name__}") from None
    if not -ndim <= a < ndim:
        raise ValueError(f"{name}={axis} is out of range for a {ndim}-d tensor (valid: {-ndim}..{ndim - 1})")
    return a % ndim


#: What the public calls do with inf and NaN operands: follow numpy (the default), or refuse them.
NONFINITE = ("propagate", "raise")


def check_nonfinite(nonfinite) -> str:
    """The ``nonfinite=`` argument, checked."""
    if nonfinite not in NONFINITE:
        raise ValueError(f"nonfinite must be one of {NONFINITE}; got {nonfinite!r}")
    return nonfinite


def finite_part(x) -> tuple:
    """``(x with its inf and NaN entries zeroed, True)`` where ``x`` has any, else ``(x, False)``; where ``x`` lives.

    What ``nonfinite='propagate'`` computes in residues: an output whose float64
    computation meets an inf or NaN is inf or NaN there, so no other output
    reads the zeroed entries.
    """
    xp = array_module(x)
    ok = xp.isfinite(x)
    if bool(ok.all()):
        return x, False
    return xp.where(ok, x, 0.0), True


def check_float_array(x, name: str = "x", allow_empty: bool = False, xp=None):
    """``x`` as a float64 array where it lives (NumPy, or CuPy for a device array); errors for what cannot be encoded.

    Real floating dtypes (float16, float32, float64) are widened exactly.
    Integer, bool, complex and object inputs are refused: integers above 2^53
    would round on the way to float64, complex values need their real and
    imaginary parts encoded separately. On the device the finiteness check
    reads back one flag. ``xp``: ``x``'s array module, where the caller has it.
    """
    xp = array_module(x) if xp is None else xp
    arr = x if xp is not np else np.asarray(x)
    if arr.dtype.kind != "f" or arr.dtype.itemsize > 8:
        hint = {
            "i": "cast with .astype(np.float64) (exact while |x| <= 2**53)",
            "u": "cast with .astype(np.float64) (exact while x <= 2**53)",
            "b": "cast with .astype(np.float64)",
            "c": "encode the real and imaginary parts separately (x.real, x.imag)",
        }.get(arr.dtype.kind, "pass a float64 array")
        raise TypeError(f"{name} must be a real floating-point array (float16/32/64); got dtype {arr.dtype}: {hint}")
    arr = arr.astype(np.float64, copy=False)
    if arr.size == 0 and not allow_empty:
        raise ValueError(f"{name} is empty (shape {tuple(arr.shape)}): there is nothing to encode")
    finite = xp.isfinite(arr)
    if not bool(finite.all()):
        bad = to_host(xp.argwhere(~finite))
        first = tuple(int(i) for i in bad[0])
        raise ValueError(
            f"{name} has {len(bad)} non-finite entr{'y' if len(bad) == 1 else 'ies'} (NaN or inf); "
            f"the first at index {first} is {float(arr[first])!r}. Residues hold finite values only"
        )
    return arr


def group_exponents(x, bits: int, shared: tuple[int, ...], xp=None):
    """``e = bits - E`` per group (``2**(E-1) <= max|G| < 2**E``), 0 for all-zero groups; keepdims int64, where ``x``
    lives (``xp``: its array module, where the caller has it)."""
    xp = array_module(x) if xp is None else xp
    lead = x.ndim - len(shared)
    if xp is np and x.dtype == np.float64 and x.size and 0 < len(shared) and tuple(shared) == tuple(range(lead, x.ndim)):
        # one exponent per tensor (the trailing axes shared): one threaded pass over the IEEE bits on the CPU
        from .backends.cpu.fused import tensor_exponents  # noqa: PLC0415 - numba, loaded on first use

        e = tensor_exponents(x.reshape((math.prod(x.shape[:lead]), -1)), bits)
        return e.reshape(tuple(x.shape[:lead]) + (1,) * len(shared))
    amax = xp.max(xp.abs(x), axis=shared, keepdims=True) if x.ndim else xp.abs(x)
    _, E = xp.frexp(amax)
    return xp.where(amax > 0, bits - E.astype(np.int64), 0).astype(np.int64)


def _shared(shared_axes, ndim: int) -> tuple[int, ...]:
    if shared_axes is None:
        return tuple(range(ndim))
    shared = tuple(normalize_axis(a, ndim, "shared_axes") for a in shared_axes)
    if len(set(shared)) != len(shared):
        raise ValueError(f"shared_axes has repeated axes: {tuple(shared_axes)}")
    return shared


def encode_integers(x, bits: int = 53, shared_axes: Optional[Sequence[int]] = None) -> tuple[np.ndarray, np.ndarray]:
    """The integers :func:`encode` holds, computed on the host: ``(v, e)`` with ``x ~= v * 2**-e``.

    ``v`` is int64 for ``bits <= 53`` and an object array of Python ints
    above; ``e`` are the keepdims group exponents. Used by the planner to
    bound the integer operators it will execute (a device array is copied to
    the host for it, once per plan).

    Examples
    --------
    >>> v, e = encode_integers(np.array([[0.75, -0.5], [3.0, 1.0]]), bits=3, shared_axes=(1,))
    >>> v.tolist(), e.ravel().tolist()
    ([[6, -4], [6, 2]], [3, 1])
    """
    arr = to_host(check_float_array(x))
    e = group_exponents(arr, bits, _shared(shared_axes, arr.ndim))
    eb = np.broadcast_to(e, arr.shape)
    if bits <= 53:
        return np.rint(np.ldexp(arr, eb.astype(np.int32))).astype(np.int64), e
    m, k = float_parts(arr)
    k = k + eb
    v = np.empty(arr.shape, dtype=object)
    fv, fm, fk = v.reshape(-1), m.reshape(-1), k.reshape(-1)
    for i in range(fv.size):
        mi, ki = int(fm[i]), int(fk[i])
        if ki >= 0:
            fv[i] = mi << ki
        else:  # |m * 2**k| < 2**53: the float64 rounding is exact here
            fv[i] = int(np.rint(np.ldexp(float(mi), ki)))
    return v, e


def encode(
    x,
    basis: Union[Basis, int, Sequence[int]],
    bits: int = 53,
    shared_axes: Optional[Sequence[int]] = None,
    *,
    backend: Optional[str] = None,
) -> RNSTensor:
    """Encode a float tensor exactly into residue planes ([2610.05059] Alg. 5).

    Each group of entries that shares an exponent gets ``e = bits - E`` with
    ``2**(E-1) <= max|G| < 2**E``; its entries become the integers
    ``v = round_half_even(x * 2**e)``, so ``|v| <= 2**bits``. An all-zero group
    gets ``e = 0``. ``bits <= 53`` loses nothing for entries within ``bits``
    bits of their group maximum; wider ``bits`` (up to what the basis holds)
    keep every bit of smaller entries.

    Parameters
    ----------
    x : array_like of float
        Finite real values (float16/32/64; see :func:`check_float_array`).
        A CuPy array is encoded on the device (backend ``'cuda'``): the
        residues and exponents stay there.
    basis : Basis, int or tuple of int
        The residue basis; an int ``s`` means ``Basis.int8(s)``.
    bits : int
        Encoding width ``b >= 1``; ``2 * 2**bits`` must stay below the basis product.
    shared_axes : sequence of int, optional
        Axes along which entries share one exponent. ``None``: the whole tensor
        shares one. ``(1,)`` on a matrix: one exponent per row (an operator).
        ``()``: every entry its own.
    backend : str, optional
        Backend name (default: the current one, see :func:`rnstensor.set_backend`;
        ``'cuda'`` for a CuPy array).

    Returns
    -------
    RNSTensor
        Planes on every basis modulus, bound ``2**bits``, scale ``2**-e``;
        on the device for a CuPy ``x``.

    Raises
    ------
    TypeError
        ``x`` is not a real floating array.
    ValueError
        Non-finite or empty ``x``, bad ``bits`` or ``shared_axes``.
    RNSRangeError
        ``2**(bits+1)`` does not fit the basis.

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> T = rt.encode(np.array([0.5, -3.0, 1e-300]), rt.Basis.int8(15), bits=53)
    >>> T.bound == 2**53
    True
    >>> rt.decode(T, mode="exact")[:2]
    array([ 0.5, -3. ])
    """
    basis = as_basis(basis)
    be, xp = dispatch(x, backend=backend, names=("x",), fn="encode")
    arr = check_float_array(x, xp=xp)
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or bits < 1:
        raise ValueError(f"bits must be an integer >= 1; got {bits!r}")
    bits = int(bits)
    # compare bit lengths first: an absurd ``bits`` must not build a 2**bits integer
    if bits >= basis.product.bit_length() or 2 * (1 << bits) >= basis.product:
        widest = (basis.product - 1).bit_length() - 2  # the largest b with 2 * 2**b < P
        raise RNSRangeError(
            f"encode: bits={bits} needs a basis product above 2^{bits + 1}, but {basis!r} gives "
            f"2^{basis.log2_product:.1f}; " + (f"use at most bits={widest} or more moduli" if widest >= 1 else
                                               "use more moduli (this basis holds no width)")
        )
    return encode_checked(arr, basis, bits, _shared(shared_axes, arr.ndim), be, xp)


def encode_checked(arr, basis: Basis, bits: int, shared: tuple[int, ...], be, xp) -> RNSTensor:
    """:func:`encode` of an array its caller has checked and placed: the runtime's encode, nothing asked again.

    ``arr`` is a finite, nonempty float64 array on ``xp``, ``bits`` fits
    ``basis`` (a program's :class:`~rnstensor.ir.Encode` step, planned),
    ``shared`` the normalized shared axes, ``be`` the backend that encodes.
    """
    e = group_exponents(arr, bits, shared, xp)
    planes = be.encode(arr, e, basis.moduli, bits)
    scale = _scale_from_exponents(-e, arr.ndim, shared)
    negz = None
    if bool((arr == 0).any()):
        mask = (arr == 0) & xp.signbit(arr)
        if bool(mask.any()):
            negz = mask
    return RNSTensor(planes, basis, basis.moduli, 1 << bits, scale, negz)


def _scale_from_exponents(exp, ndim: int, shared: tuple[int, ...]) -> Scale:
    """The most structured Scale for keepdims group exponents: scalar, one axis vector, or a field.

    A device tensor's scalar exponent is read back (one value); vectors and
    fields stay on the device.
    """
    varying = [a for a in range(ndim) if a not in shared and exp.shape[a] > 1]
    if not varying or exp.size == 1:
        return Scale(int(exp.reshape(-1)[0]) if exp.size else 0, 1, (None,) * ndim, None)
    if len(varying) == 1:
        axes = [None] * ndim
        axes[varying[0]] = exp.reshape(-1)
        return Scale(0, 1, tuple(axes), None)
    return Scale(0, 1, (None,) * ndim, exp)


_NONE = np.iinfo(np.int64).min // 4
_HUGE = np.iinfo(np.int64).max // 4


def entry_stats(x):
    """Per entry ``(finite, frexp exponent or NONE, lowest set bit or HUGE)`` (complex: both parts) as int64 planes.

    Works where ``x`` lives (NumPy or CuPy).
    """
    xp = array_module(x)
    parts = [x.real, x.imag] if x.dtype.kind == "c" else [x]
    fin = xp.ones(x.shape, bool)
    E = xp.full(x.shape, _NONE, np.int64)
    lsb = xp.full(x.shape, _HUGE, np.int64)
    for p in parts:
        p = p.astype(np.float64, copy=False)
        fin &= xp.isfinite(p)
        ok = xp.isfinite(p) & (p != 0)
        q = xp.where(ok, p, 1.0)
        mant, ex = xp.frexp(q)
        ex = ex.astype(np.int64)
        mi = (mant * 2.0**53).astype(np.int64)
        low = xp.abs(mi) & -xp.abs(mi)
        tz = xp.frexp(low.astype(np.float64))[1].astype(np.int64) - 1
        E = xp.where(ok, xp.maximum(E, ex), E)
        lsb = xp.where(ok, xp.minimum(lsb, ex - 53 + tz), lsb)
    return xp.stack([fin.astype(np.int64), E, lsb])


def exact_bits_needed(x, shared_axes: tuple[int, ...]) -> int:
    """The smallest width ``t`` at which :func:`rnstensor.encode` holds every entry of ``x`` exactly.

    For a group ``G`` sharing one exponent (``2**(E-1) <= max|G| < 2**E``) the
    encoding is ``x * 2**(t - E)``, an integer iff ``t >= E - lsb(x)`` where
    ``lsb(x)`` is the exponent of the lowest set bit of ``x``'s significand.
    The result is the maximum of ``E - lsb`` over all nonzero entries (at
    least 1); non-finite entries must be masked out before. NumPy or CuPy
    (one scalar comes back).

    Examples
    --------
    >>> exact_bits_needed(np.array([[1.0, 0.5], [3.0, 2.0**-30]]), (1,))
    32
    """
    xp = array_module(x)
    x = x.astype(np.float64, copy=False) if xp is not np else np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return 1
    if xp is np and x.dtype == np.float64:
        # on the CPU: the groups as rows of a matrix, one threaded pass over the IEEE bits (the GEMM's scan)
        from .backends.cpu.gemm import group_stats  # noqa: PLC0415 - numba, loaded on first use

        keep = [a for a in range(x.ndim) if a not in shared_axes]
        rows = np.ascontiguousarray(x.transpose(keep + list(shared_axes))).reshape(
            math.prod(x.shape[a] for a in keep), -1)
        _, Emax, lsb, _ = group_stats(rows, 1, True)
        return max(int(np.where(Emax != _NONE, Emax - lsb, 1).max()), 1)
    _, E, lsb = entry_stats(x)
    nz = x != 0
    Emax = xp.max(xp.where(nz, E, _NONE), axis=shared_axes, keepdims=True) if shared_axes else E
    return max(int(xp.where(nz, Emax - lsb, 1).max()), 1)
