"""Shared timing helper of the benchmark scripts: best wall time of several runs after a warm-up."""

import time

__all__ = ["best_time"]


def best_time(fn, repeat: int) -> float:
    """Best of ``repeat`` timed calls of ``fn`` after one untimed call (numba compilation, page faults)."""
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)
