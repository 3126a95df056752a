"""Array types: whether an array lives on the host (NumPy) or the device (CuPy).

The one place that tells them apart (:func:`rnstensor.backends.dispatch`
picks the backend from it): NumPy in, NumPy out on the CPU backend; CuPy in,
CuPy out on the CUDA backend. CuPy is recognised from an array's type (its
module) and imported only when such an array is seen, so this module imports
on any machine.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

__all__ = ["is_device_array", "device_module", "array_module", "to_host", "to_module", "MixedDevicesError"]


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
