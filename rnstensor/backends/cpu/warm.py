"""Which numba kernels a call compiles: a small call on a cold kernel runs NumPy's reference path, the same bits.

A kernel is *cold* when it is neither compiled in this process nor in
numba's disk cache: its first call would compile it (0.2-4 s each, 25 s for
a first chain call on an empty cache). A call touching fewer than
:data:`COLD_WORK_MAX` entries runs the backend contract's NumPy reference
(:class:`rnstensor.backends.NumpyBackend`) instead, a chain step by step in
place of the fused interpreter, or the full classical certificate in place
of a chain's one-pass statistics: the same bits, so only the time
changes, and a one-off small call never waits for a compiler. After
:data:`COLD_CALLS` such calls of one kernel, the kernel is compiled (a loop
of small calls then runs it, and numba's cache keeps it for the next
process); a large call compiles it at once. ``RNSTENSOR_COLD_START=0`` (or
:func:`enabled`) turns the routing off: the tests do, so that every kernel is
exercised, and the benchmarks, which time compiled kernels.
"""

from __future__ import annotations

import os

__all__ = ["warm", "COLD_WORK_MAX", "COLD_CALLS", "enabled"]

#: entries a call touches (times the moduli, or the terms of a sum) below which a cold kernel is not compiled for
#: it: the reference path takes 1-20 ns an entry (measured on this project's 2-vCPU VM), 4-80 ms here
COLD_WORK_MAX = 1 << 22
#: small calls of one cold kernel on the reference path before the kernel is compiled anyway
COLD_CALLS = 16
_state = {"enabled": os.environ.get("RNSTENSOR_COLD_START", "1") != "0"}
_calls: dict = {}
_cached: dict = {}


def enabled(value: bool | None = None) -> bool:
    """Whether cold kernels are routed (``value``: set it, e.g. ``False`` in a test that runs every kernel)."""
    if value is not None:
        _state["enabled"] = bool(value)
    return _state["enabled"]


def _in_disk_cache(kernel) -> bool:
    """Whether numba's disk cache holds an index of ``kernel`` (loading it costs a read, not a compile). A kernel
    whose cache this numba does not expose counts as cached: it is compiled as before."""
    if kernel not in _cached:
        try:
            _cached[kernel] = os.path.exists(kernel._cache._cache_file._index_path)
        except AttributeError:
            _cached[kernel] = True
    return _cached[kernel]


def warm(kernel, work: int) -> bool:
    """Whether to run the numba dispatcher ``kernel`` for a call touching ``work`` entries (``False``: the caller
    takes its reference path).

    Examples
    --------
    >>> from rnstensor.backends.cpu import warm, products
    >>> warm.warm(products._product_direct, warm.COLD_WORK_MAX + 1)  # a large call compiles
    True
    """
    if not _state["enabled"] or work > COLD_WORK_MAX or kernel.signatures or _in_disk_cache(kernel):
        return True
    _calls[kernel] = _calls.get(kernel, 0) + 1
    return _calls[kernel] > COLD_CALLS
