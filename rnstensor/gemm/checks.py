"""The argument checks of the GEMM entry points (shared with :mod:`rnstensor.dask`) and the default workspace."""

from __future__ import annotations

from typing import Optional, Union

import numpy as np

from ..arrays import default_workspace_bytes, exact_float
from ..basis import moduli_count
from ..run.policy import check_rtol
from .width import _MAX_MODULI

__all__ = ["default_workspace_bytes", "blas_operands"]

# ----- argument checks -----------------------------------------------------------------------


def _check_trans(flag, name: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(flag, str) or flag.upper() not in allowed:
        raise ValueError(f"{name} must be one of {allowed} (case-insensitive); got {flag!r}")
    return flag.upper()


def _check_array(x, name: str, dtype: np.dtype, fn: str, xp=np):
    """A 2-D operand as ``dtype`` (float64 or complex128), converted only where that is exact (see
    :func:`~rnstensor.arrays.exact_float`: bool, integers up to 2^53, float16/32, complex64)."""
    arr = exact_float(x, name, fn)
    if arr.dtype.kind == "c" and dtype.kind != "c":
        raise TypeError(f"{fn}: {name} must be real ({fn} takes real input, as BLAS dgemm); got dtype {arr.dtype}: "
                        "use rnstensor.zgemm for complex data")
    arr = arr.astype(dtype, copy=False)
    if arr.ndim != 2:
        raise ValueError(f"{fn}: {name} must be 2-D; got shape {tuple(arr.shape)}")
    return arr


def _check_moduli(moduli, fn: str) -> Union[None, int, str]:
    if moduli is None or (isinstance(moduli, str) and moduli in ("auto", "fast")):
        return moduli
    if isinstance(moduli, bool) or not isinstance(moduli, (int, np.integer)):
        raise ValueError(f"{fn}: moduli must be None (the classical float64 bound), 'fast' (moduli_for_bits(k, 53)), "
                         f"'auto' (correctly rounded) or a number of INT8 moduli "
                         f"(1..{_MAX_MODULI}); got {moduli!r}")
    return moduli_count(moduli, f"{fn}: moduli")


def _check_scalar(x, name: str, fn: str, cplx: bool) -> Union[float, complex]:
    try:
        return complex(x) if cplx else float(x)
    except (TypeError, ValueError):
        want = "a complex number" if cplx else "a real number"
        raise TypeError(f"{fn}: {name} must be {want}; got {x!r}") from None


def _check_workspace(workspace_bytes, fn: str, xp=np) -> int:
    if workspace_bytes is None:
        return default_workspace_bytes() if xp is np else _device_workspace_bytes(xp)
    if isinstance(workspace_bytes, bool) or not isinstance(workspace_bytes, (int, np.integer)) or workspace_bytes < 1:
        raise ValueError(f"{fn}: workspace_bytes must be a positive integer; got {workspace_bytes!r}")
    return int(workspace_bytes)


def _device_workspace_bytes(xp) -> int:
    """The default workspace of a GEMM on the device: a quarter of its free memory, clamped to 64 MiB .. 16 GiB."""
    try:
        free = int(xp.cuda.Device().mem_info[0])
    except Exception:  # noqa: BLE001 - a device that does not say: the host rule's middle
        return 1 << 30
    return int(min(max(free // 4, 64 << 20), 16 << 30))


def _check_target(rtol, moduli, fn: str) -> Optional[float]:
    """``rtol`` checked, with ``moduli=None`` (a target chooses the moduli itself)."""
    rtol = check_rtol(rtol, fn)
    if rtol is not None and moduli is not None:
        raise ValueError(f"{fn}: rtol chooses the moduli itself; pass moduli=None with it (got moduli={moduli!r})")
    return rtol


def blas_operands(a, b, ta: str, tb: str, cplx: bool, fn: str):
    """``(op(a), op(b))`` for checked BLAS flags (``'C'`` conjugates complex data), inner dimensions checked.

    Works on any array type with ``.T``, ``.conj()`` and ``.shape`` (NumPy, CuPy, Dask).
    """

    def op(x, f):
        if f == "N":
            return x
        return x.T.conj() if (f == "C" and cplx) else x.T

    opa, opb = op(a, ta), op(b, tb)
    m, k = opa.shape
    if opb.shape[0] != k:
        raise ValueError(
            f"{fn}: shape mismatch: op(a) is {m}x{k} (a {tuple(a.shape)}, trans_a={ta!r}) but op(b) is "
            f"{opb.shape[0]}x{opb.shape[1]} (b {tuple(b.shape)}, trans_b={tb!r}); the inner dimensions must agree"
        )
    return opa, opb
