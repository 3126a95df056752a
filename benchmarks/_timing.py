"""Shared helpers of the benchmark scripts: best wall time of several runs after a warm-up, and peak memory."""

import time
import tracemalloc

__all__ = ["best_time", "peak_mib"]


def best_time(fn, repeat: int) -> float:
    """Best of ``repeat`` timed calls of ``fn`` after one untimed call (numba compilation, page faults)."""
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def peak_mib(fn) -> float:
    """The tracemalloc peak of one call of ``fn`` in MiB (numpy-managed buffers; numba's allocator is not seen)."""
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20
