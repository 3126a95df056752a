"""Array types: whether an array lives on the host (NumPy) or the device (CuPy), and the backend that runs it.

Every public entry point dispatches through here: NumPy in, NumPy out on the
CPU backend; CuPy in, CuPy out on the CUDA backend. CuPy is recognised from
an array's type (its module) and imported only when such an array is seen,
so this module imports on any machine.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

__all__ = ["is_device_array", "device_module", "array_module", "dispatch", "to_host", "MixedDevicesError"]


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


def dispatch(*arrays: Any, backend: Optional[str] = None, names: Optional[tuple[str, ...]] = None,
             fn: str = "rnstensor"):
    """``(backend object, xp)`` for a call on ``arrays``: CuPy arrays run on ``'cuda'``, NumPy ones on ``backend``.

    ``backend=None`` is the current default for host arrays and ``'cuda'``
    for device arrays; a host backend named for device arrays is a
    ``ValueError`` (a CPU backend cannot read device memory).
    """
    from .backends import get_backend

    xp = array_module(*arrays, names=names, fn=fn)
    if xp is np:
        return get_backend(backend), np
    be = get_backend("cuda" if backend is None else backend)
    if be.name != "cuda":
        raise ValueError(
            f"{fn}: the operands are CuPy arrays but backend={be.name!r}: use backend='cuda' (or None), "
            "or move them to the host first (x.get())"
        )
    return be, xp


def to_host(x: Any) -> np.ndarray:
    """An explicit host copy of a (small) array: CuPy arrays are copied with ``.get()``, the rest by ``np.asarray``."""
    return x.get() if is_device_array(x) else np.asarray(x)
