"""Array types: whether an array lives on the host (NumPy) or the device (CuPy).

The one place that tells them apart (:func:`rnstensor.backends.dispatch`
picks the backend from it): NumPy in, NumPy out on the CPU backend; CuPy in,
CuPy out on the CUDA backend. CuPy is recognised from an array's type (its
module) and imported only when such an array is seen, so this module imports
on any machine.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np

from .errors import RNSRangeError

__all__ = [
    "default_workspace_bytes",
    "is_device_array",
    "device_module",
    "array_module",
    "to_host",
    "to_module",
    "exact_float",
    "exact_result",
    "EXACT_INTEGER",
    "CASTINGS",
    "MixedDevicesError",
]

#: Every integer up to this magnitude is a float64; beyond it float64 rounds.
EXACT_INTEGER = 2**53

#: numpy's casting rules, for ``dtype=`` and ``out=`` of einsum and matmul.
CASTINGS = ("no", "equiv", "safe", "same_kind", "unsafe")


class MixedDevicesError(TypeError):
    """Host (NumPy) and device (CuPy) arrays met in one call; nothing is moved implicitly."""


def is_device_array(x: Any) -> bool:
    """Whether ``x`` is a CuPy array (read from its type's module: CuPy is not imported).

    Examples
    --------
    >>> is_device_array(np.ones(3)), is_device_array([1.0])
    (False, False)
    """
    return type(x).__module__.partition(".")[0] == "cupy"


def device_module():
    """The CuPy module, with a clear error where it is not installed."""
    try:
        import cupy
    except ImportError as exc:
        raise RuntimeError(
            "the 'cuda' backend needs CuPy: pip install 'rnstensor[gpu]' (cupy-cuda13x, cuda-python, nvidia-cuda-nvrtc)"
        ) from exc
    return cupy


def _is_host_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) and not is_device_array(x)


def array_module(*arrays: Any, names: Optional[tuple[str, ...]] = None, fn: str = "rnstensor"):
    """``numpy``, or ``cupy`` when an operand is a CuPy array; :class:`MixedDevicesError` for a mix.

    Scalars, lists and other non-arrays go with either. ``names`` name the
    operands in the error (default ``operand 0``, ``operand 1``, ...).

    Examples
    --------
    >>> array_module(np.ones(2), 3.0) is np
    True
    """
    device = [i for i, a in enumerate(arrays) if is_device_array(a)]
    if not device:
        return np
    host = [i for i, a in enumerate(arrays) if _is_host_array(a)]
    if host:
        label = (lambda i: names[i]) if names else (lambda i: f"operand {i}")  # noqa: E731
        raise MixedDevicesError(
            f"{fn}: {', '.join(label(i) for i in host)} on the host (NumPy) but {', '.join(label(i) for i in device)} "
            "on the device (CuPy); nothing is moved implicitly: move one explicitly with cupy.asarray(x) or x.get()"
        )
    return device_module()


def to_host(x: Any) -> np.ndarray:
    """An explicit host copy of a (small) array: CuPy arrays are copied with ``.get()``, the rest by ``np.asarray``."""
    return x.get() if is_device_array(x) else np.asarray(x)


def to_module(x: Any, xp):
    """``x`` in the array module ``xp`` (``numpy`` or ``cupy``): itself where it lives there, else an explicit copy
    across the bus (constants and tables, once)."""
    if xp is np:
        return to_host(x)
    return x if is_device_array(x) else xp.asarray(x)


def refuse_rnstensor(x: Any, name: str, fn: str) -> None:
    """A ``TypeError`` naming the fix where ``x`` is an :class:`~rnstensor.RNSTensor` (a float array is expected)."""
    if type(x).__name__ == "RNSTensor":  # (rnstensor.tensor imports this module: named, not imported)
        raise TypeError(f"{fn}: {name} is an RNSTensor; decode it first (rt.decode({name}, 'exact') gives its exact "
                        f"value as float64), or contract it with rt.einsum, which takes RNSTensor operands")


def exact_float(x: Any, name: str, fn: str):
    """``x`` as float64 (or complex128) where that holds every value exactly, else a clear error.

    bool, integers with ``|x| <= 2**53``, float16/32/64 and complex64/128
    convert exactly (the residue encoding reads float64); integers beyond
    ``2**53`` raise ``ValueError`` (float64 would round them); other dtypes
    (longdouble, object, strings, datetimes) raise ``TypeError``. NumPy
    arrays, array-likes and CuPy arrays (kept on the device) are accepted.

    Examples
    --------
    >>> exact_float(np.array([1, -2], np.int8), "a", "matmul")
    array([ 1., -2.])
    """
    refuse_rnstensor(x, name, fn)
    xp = array_module(x)
    x = x if xp is not np else np.asarray(x)
    kind, size = x.dtype.kind, x.dtype.itemsize
    if (kind == "f" and size == 8) or (kind == "c" and size == 16):
        return x
    if kind == "b" or (kind == "f" and size < 8):
        return x.astype(np.float64)
    if kind == "c" and size < 16:
        return x.astype(np.complex128)
    if kind in "iu":
        big = max(abs(int(x.min())), abs(int(x.max()))) if x.size else 0  # Python ints: exact, no overflow
        if big > EXACT_INTEGER:
            raise ValueError(
                f"{fn}: {name} holds an integer of magnitude {big} (> 2^53 = {EXACT_INTEGER}); float64 (and so the "
                "residue encoding) holds integers exactly only up to 2^53: split them, or pass float64 if rounding "
                "them is fine"
            )
        return x.astype(np.float64)
    raise TypeError(
        f"{fn}: {name} has dtype {x.dtype}; rnstensor takes what float64 or complex128 holds exactly (bool, "
        "integers up to 2^53, float16/32/64, complex64/128): convert it, e.g. with .astype(np.float64)"
    )


def exact_result(res: Any, dt: np.dtype, fn: str, wider: str = "cast the operands to a wider integer dtype such as int64"):
    """A float64 / complex128 result ``res`` in the result dtype ``dt``: integer and bool ones only where exact.

    Floating ``dt`` narrower than float64 rounds once more; integer and bool
    ``dt`` need ``res`` correctly rounded (so below ``2**53`` each value is
    the exact integer) and raise :class:`~rnstensor.errors.RNSRangeError`
    where it reaches ``2**53`` (it may be a rounded value there) or leaves
    ``dt``'s range: numpy's integer arithmetic would wrap it (``wider``: the
    fix that message names, the caller's: a wider ``out`` where ``dt`` is its dtype).

    Examples
    --------
    >>> exact_result(np.array([3.0, -1.0]), np.dtype(np.int8), "matmul")
    array([ 3, -1], dtype=int8)
    """
    dt = np.dtype(dt)
    if dt.kind in "fc":
        return res if res.dtype == dt else res.astype(dt)
    if res.size:
        lo, hi = float(res.min()), float(res.max())
        if max(-lo, hi) >= EXACT_INTEGER:
            raise RNSRangeError(
                f"{fn}: an integer result reaches {max(-lo, hi):.3e} in magnitude, where float64 no longer holds "
                "every integer (2^53); numpy's integer arithmetic would give it modulo 2^64: split the operands, "
                "or pass float64 operands if a correctly rounded result is fine"
            )
        if dt.kind != "b":
            info = np.iinfo(dt)
            if lo < info.min or hi > info.max:
                raise RNSRangeError(
                    f"{fn}: the exact result spans [{lo:.0f}, {hi:.0f}], outside {dt}'s range (numpy would wrap "
                    f"it); {wider}"
                )
    return res != 0 if dt.kind == "b" else res.astype(dt)


def default_workspace_bytes() -> int:
    """The default workspace for one GEMM: a quarter of the available physical memory, clamped to 64 MiB .. 4 GiB.

    Read from ``os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')``
    at each call; 1 GiB where the system does not report it.

    Examples
    --------
    >>> 64 << 20 <= default_workspace_bytes() <= 4 << 30
    True
    """
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 1 << 30
    return int(min(max(avail // 4, 64 << 20), 4 << 30))
