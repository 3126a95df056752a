"""Which numba kernels a call compiles: a small call on a cold kernel runs NumPy's reference path, the same bits.

A kernel is *cold* when it is neither compiled in this process nor in
numba's disk cache: its first call would compile it (0.2-4 s each, 25 s for
a first chain call on an empty cache). A call touching fewer than
:data:`COLD_WORK_MAX` entries runs the backend contract's NumPy reference
(:class:`rnstensor.backends.NumpyBackend`) instead, a chain step by step in
place of the fused interpreter, or the full classical certificate in place
of a chain's one-pass statistics: the same bits, so only the time
changes, and a one-off small call never waits for a compiler.

A kernel is compiled once that pays, as a ski rental decides: each routed
call is charged its reference path's estimated time (``call_s``, by default
:data:`REFERENCE_CALL_S`, plus :data:`REFERENCE_ENTRY_S` an entry of its
work), and the first call after the charges pass :data:`COLD_SECONDS`
compiles the kernel (a loop of small calls then runs it, and numba's cache
keeps it for the next process); a large call compiles it at once. So a few
dozen small calls (the Quickstart's demo, its accuracy runs included) never
wait for the compiler, and a long loop of them waits once. ``RNSTENSOR_COLD_START=0`` (or
:func:`enabled`) turns the routing off: the tests do, so that every kernel is
exercised, and the benchmarks, which time compiled kernels.
"""

from __future__ import annotations

import os

__all__ = ["warm", "COLD_WORK_MAX", "COLD_SECONDS", "REFERENCE_CALL_S", "REFERENCE_ENTRY_S", "enabled", "routed"]

#: entries a call touches (times the moduli, or the terms of a sum) below which a cold kernel is not compiled for
#: it: the reference path takes 1-20 ns an entry (measured on this project's 2-vCPU VM), 4-80 ms here
COLD_WORK_MAX = 1 << 22
#: the reference time charged to one cold kernel after which it is compiled (a kernel's compile takes 0.2-6 s, the
#: fused interpreter's about 18 s: the rental stops before it costs the purchase)
COLD_SECONDS = 1.0
#: the estimate of a reference call's time: a fixed part (its NumPy calls' overhead) and a part per entry of its work
#: (NumPy's passes over the planes; a product's reference is 1 ns a term, a decode's 13 ns an entry on the 2-vCPU VM)
REFERENCE_CALL_S = 1e-3
REFERENCE_ENTRY_S = 10e-9
_state = {"enabled": os.environ.get("RNSTENSOR_COLD_START", "1") != "0", "routed": 0}
_spent: dict = {}
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


def routed() -> int:
    """How many calls this process has routed to a reference path so far (the demo says which of its runs did)."""
    return _state["routed"]


def warm(kernel, work: int, call_s: float = REFERENCE_CALL_S, charge: bool = True) -> bool:
    """Whether to run the numba dispatcher ``kernel`` for a call touching ``work`` entries (``False``: the caller
    takes its reference path, charged ``call_s`` plus :data:`REFERENCE_ENTRY_S` an entry to ``kernel``; not with
    ``charge=False``, a question asked ahead of the call that then asks again).

    Examples
    --------
    >>> from rnstensor.backends.cpu import warm, products
    >>> warm.warm(products._product_direct, warm.COLD_WORK_MAX + 1)  # a large call compiles
    True
    """
    if not _state["enabled"] or work > COLD_WORK_MAX or kernel.signatures or _in_disk_cache(kernel):
        return True
    spent = _spent.get(kernel, 0.0)
    if spent >= COLD_SECONDS:  # the reference paths have cost about what the compile will: compile it
        return True
    if not charge:
        return False
    _spent[kernel] = spent + call_s + work * REFERENCE_ENTRY_S
    _state["routed"] += 1
    return False
