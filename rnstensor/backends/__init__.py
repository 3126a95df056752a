"""Backend dispatch: the small contract every residue backend implements, and the registry.

A backend works on residue arrays only; bounds, scales and range checks stay
in the algorithms above it. Every call is exact integer arithmetic (decode
aside), so all backends return identical bits. The contract:

``encode(x, exponent, moduli, bits)``
    float64 ``x`` and an int64 exponent array broadcastable to ``x.shape`` →
    int8 planes ``(L, *x.shape)`` of ``round_half_even(x * 2**exponent)``.
``product(op_planes, planes, moduli, axis)``
    int8 operator planes ``(L, n_out, n_in)`` contracted with tensor axis
    ``axis`` of ``planes`` ``(L, *shape)``; centered residues out.
``matmul(a_planes, b_planes, moduli)``
    per modulus, the batched matrix product ``(L, ..., M, K) @ (L, ..., K, N)``
    (batch dims broadcast as in ``numpy.matmul``); centered residues out.
``hadamard(planes, field_planes, moduli)``
    elementwise product, the field broadcast over leading axes.
``add(a, b, moduli, subtract=False)``
    elementwise sum or difference.
``drop_extend(planes, active, basis, drops, extend)``
    Alg. 1 for each dropped modulus — ``drops`` is a count (the smallest
    active moduli, smallest first) or a tuple of moduli in drop order — then,
    if ``extend``, Alg. 4 onto every basis modulus → ``(planes, active)``.
``decode(planes, active, exponent, factor, mode)``
    float64 of ``v * factor * 2**exponent``: ``mode='fp64'`` is MRC + Horner
    in float64 then the scale; ``mode='exact'`` rounds the exact product once.
``xp``
    the array module the backend computes with (``numpy``; ``cupy`` on a GPU).
``constants(key, make)``
    the host arrays ``make()`` returns (a tuple), where the backend computes:
    as they are on the host, copied to the device once per ``key`` on a GPU.

``rnstensor.arith`` defines the results; :class:`NumpyBackend` is it verbatim.
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional, Sequence

import numpy as np

from .. import arith
from ..arrays import array_module
from ..basis import Basis

__all__ = ["NumpyBackend", "get_backend", "set_backend", "available_backends", "dispatch"]


def product_layout(op_shape, planes_shape, L: int, axis: int, what: str = "product"):
    """Checked layout of a mode product: ``(axis, n_out, n_in, pre, post, out_shape)`` for every backend.

    ``op_shape`` is ``(L, n_out, n_in)``, ``planes_shape`` ``(L, *shape)``;
    the tensor is seen as ``(L, pre, n_in, post)`` around the contracted axis.
    """
    shape = tuple(planes_shape[1:])
    nd = len(shape)
    if not -nd <= axis < nd:
        raise ValueError(f"{what}: axis {axis} is out of range for a tensor of {nd} dims")
    axis %= nd
    if len(op_shape) != 3 or op_shape[0] != L or planes_shape[0] != L or op_shape[2] != shape[axis]:
        raise ValueError(
            f"{what}: need op_planes (L, n_out, n_in) and planes (L, ...) with L = {L} and "
            f"n_in = planes axis {axis}; got {tuple(op_shape)} and {tuple(planes_shape)}"
        )
    n_out, n_in = int(op_shape[1]), int(op_shape[2])
    pre = math.prod(shape[:axis])
    post = math.prod(shape[axis + 1 :])
    return axis, n_out, n_in, pre, post, shape[:axis] + (n_out,) + shape[axis + 1 :]


def matmul_shape(a_shape, b_shape, L: int) -> tuple[tuple[int, ...], int, int, int]:
    """Checked ``(batch, M, K, N)`` of a batched residue matmul ``(L, ..., M, K) @ (L, ..., K, N)``."""
    if len(a_shape) < 3 or len(b_shape) < 3 or a_shape[0] != L or b_shape[0] != L or a_shape[-1] != b_shape[-2]:
        raise ValueError(
            f"matmul: need (L, ..., M, K) and (L, ..., K, N) planes with L = {L}; got {tuple(a_shape)} and {tuple(b_shape)}"
        )
    batch = np.broadcast_shapes(tuple(a_shape[1:-2]), tuple(b_shape[1:-2]))
    return batch, int(a_shape[-2]), int(a_shape[-1]), int(b_shape[-1])


def elementwise_shape(a_shape, b_shape, L: int, mode: int, what: str) -> tuple[int, ...]:
    """Checked result shape (without the plane axis) of an elementwise call on planes ``(L, ...)``.

    ``mode`` 0 (product) broadcasts both operands; sums and differences need
    ``b`` to broadcast to ``a``'s shape.
    """
    if len(a_shape) < 1 or len(b_shape) < 1 or a_shape[0] != L or b_shape[0] != L:
        raise ValueError(f"{what}: planes must have L = {L} leading planes; got {tuple(a_shape)} and {tuple(b_shape)}")
    sa, sb = tuple(a_shape[1:]), tuple(b_shape[1:])
    shape = np.broadcast_shapes(sa, sb)
    if mode != 0 and shape != sa:
        raise ValueError(f"{what}: b of shape {tuple(b_shape)} does not broadcast to a's shape {tuple(a_shape)}")
    return shape


def exponent_runs(exponent, shape, xp=np) -> tuple[np.ndarray, int]:
    """The exponents of the flattened entries as runs: entry ``i`` has ``ev[i // inner]`` (int64, on ``xp``).

    Trailing axes the exponent broadcasts over are not materialized (a
    per-batch exponent of shape ``(batch, 1, 1, 1)`` stays ``batch`` values).
    ``xp`` is the array module the runs are built with (``numpy`` for the CPU
    backends, ``cupy`` for the CUDA backend, which copies a host exponent over);
    an exponent already in another module is an error, never a silent copy.
    """
    if xp is np:
        e = np.asarray(exponent, dtype=np.int64)
    else:
        e = xp.asarray(exponent).astype(np.int64, copy=False)
    shape = tuple(shape)
    if np.broadcast_shapes(tuple(e.shape), shape) != shape:
        raise ValueError(f"exponent of shape {tuple(e.shape)} does not broadcast to the tensor shape {shape}")
    nd = len(shape)
    ep = e.reshape((1,) * (nd - e.ndim) + tuple(e.shape))
    k = nd
    while k > 0 and ep.shape[k - 1] == 1:
        k -= 1
    lead = ep[(Ellipsis,) + (0,) * (nd - k)] if k < nd else ep
    ev = xp.ascontiguousarray(xp.broadcast_to(lead, shape[:k])).reshape(-1)
    return ev, math.prod(shape[k:])


class NumpyBackend:
    """The plain-numpy reference (``rnstensor.arith``): slow, simple, the oracle for the others."""

    name = "numpy"
    xp = np  # the array module it computes with

    def encode(self, x: np.ndarray, exponent: np.ndarray, moduli: Sequence[int], bits: int) -> np.ndarray:
        return arith.encode_ref(x, exponent, moduli, bits)

    def product(self, op_planes: np.ndarray, planes: np.ndarray, moduli: Sequence[int], axis: int) -> np.ndarray:
        return arith.product_ref(op_planes, planes, moduli, axis)

    def matmul(self, a_planes: np.ndarray, b_planes: np.ndarray, moduli: Sequence[int]) -> np.ndarray:
        return arith.matmul_ref(a_planes, b_planes, moduli)

    def hadamard(self, planes: np.ndarray, field_planes: np.ndarray, moduli: Sequence[int]) -> np.ndarray:
        return arith.hadamard_ref(planes, field_planes, moduli)

    def add(self, a: np.ndarray, b: np.ndarray, moduli: Sequence[int], subtract: bool = False) -> np.ndarray:
        return arith.add_ref(a, b, moduli, subtract)

    def drop_extend(self, planes: np.ndarray, active: Sequence[int], basis: Basis, drops: int, extend: bool):
        return arith.drop_extend_ref(planes, active, basis, drops, extend)

    def decode(self, planes: np.ndarray, active: Sequence[int], exponent: np.ndarray, factor: int, mode: str) -> np.ndarray:
        if mode == "fp64":
            return arith.decode_fp64_ref(planes, active, exponent, factor)
        return arith.decode_exact_ref(planes, active, exponent, factor)

    def constants(self, key, make):
        return make()


_BACKENDS: dict[str, object] = {}
# RNSTENSOR_BACKEND picks the default for a whole process (tests, benchmarks)
_current = [os.environ.get("RNSTENSOR_BACKEND", "cpu")]


def _make(name: str):
    if name == "numpy":
        return NumpyBackend()
    if name == "cpu":
        from .cpu import CpuBackend

        return CpuBackend()
    if name == "cuda":
        from .cuda import CudaBackend  # imports CuPy; raises RuntimeError without it or without a device

        return CudaBackend()
    raise _unknown_backend(name)


#: Every backend the library has ('cuda' runs where CuPy sees a device: :func:`available_backends` says where).
_ALL_BACKENDS = ("cpu", "numpy", "cuda")
#: Names people give the GPU backend, lower-cased (and ``'gpu0'``, ``'cuda:0'``: their starts): answered with 'cuda'.
_GPU_NAMES = ("gpu", "cupy", "device", "cuda", "nvidia")


def _unknown_backend(name) -> ValueError:
    """The error for a backend name the library lacks: every name it has, and the one meant where it can tell.

    A name for the GPU (``'gpu'``, ``'cupy'``, ``'GPU'``, ``'device'``) is
    pointed to ``'cuda'``, with why ``'cuda'`` cannot run here where it cannot.
    """
    import difflib

    from .cuda import cuda_unavailable_reason

    message = f"backend must be one of {_ALL_BACKENDS}; got {name!r}"
    key = str(name).strip().lower()
    close = difflib.get_close_matches(key, _ALL_BACKENDS, n=1, cutoff=0.75)  # 'CPU', 'numpi', 'cpu2'; not 'tpu'
    meant = "cuda" if key.startswith(_GPU_NAMES) else (close[0] if close else None)
    if meant == "cuda":
        message += ": the GPU backend is backend='cuda'"
        why = cuda_unavailable_reason()
        if why is not None:  # the reason says what to install, or that no device is visible
            message += f" (unavailable here: {why})"
    elif meant is not None:
        message += f": did you mean backend={meant!r}?"
    return ValueError(message)


def available_backends() -> tuple[str, ...]:
    """Names accepted by :func:`set_backend` and :func:`get_backend` (``'cuda'`` where CuPy sees a GPU)."""
    from .cuda import cuda_available

    return ("cpu", "numpy", "cuda") if cuda_available() else ("cpu", "numpy")


def get_backend(name: str | None = None):
    """The backend object for ``name`` (default: the current one, initially ``'cpu'``)."""
    name = _current[0] if name is None else name
    if name not in _BACKENDS:
        _BACKENDS[name] = _make(name)
    return _BACKENDS[name]


def set_backend(name: str) -> str:
    """Make ``name`` the default backend; returns the previous name.

    Examples
    --------
    >>> import rnstensor
    >>> old = rnstensor.set_backend("numpy")
    >>> _ = rnstensor.set_backend(old)
    """
    get_backend(name)
    old = _current[0]
    _current[0] = name
    return old


def dispatch(*arrays: Any, backend: Optional[str] = None, names: Optional[tuple[str, ...]] = None,
             fn: str = "rnstensor"):
    """``(backend object, xp)`` for a call on ``arrays``: CuPy arrays run on ``'cuda'``, NumPy ones on ``backend``.

    ``backend=None`` is the current default for host arrays and ``'cuda'``
    for device arrays; a host backend named for device arrays is a
    ``ValueError`` (a CPU backend cannot read device memory).
    """
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
