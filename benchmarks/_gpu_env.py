"""The environment of a GPU benchmark run: CuPy and the CUDA backend (or NumPy and the CPU backend), its timers."""

from __future__ import annotations

import statistics
import time

import numpy as np

__all__ = ["Env"]


class Env:
    """Array module, backends, synchronisation and timers of one run (GPU or the CPU smoke run)."""

    def __init__(self, cpu_smoke: bool = False):
        self.cpu = cpu_smoke
        self.standin = False
        if cpu_smoke:
            from rnstensor.backends.cpu import CpuBackend

            self.xp = np
            self.backend_name = "cpu"
            self._engines = {"mma": CpuBackend()}
        else:
            import cupy as cp

            self.xp = cp
            self.backend_name = "cuda"
            # tests/cupy_standin.py (device_check.sh --dry-run): kernels run as host builds; nothing here is a speed
            self.standin = bool(getattr(cp, "__rnstensor_standin__", False))
            from rnstensor.backends.cuda import CudaBackend

            self._engines = {"mma": CudaBackend("mma")}
            for eng in ("cublas", "wgmma"):
                try:
                    self._engines[eng] = CudaBackend(eng)
                except Exception as exc:  # an engine that does not exist (yet) is skipped
                    self._engines.setdefault("_missing", {})[eng] = f"{type(exc).__name__}: {exc}"

    def engine(self, name="mma"):
        return self._engines.get(name)

    @property
    def engines(self):
        return [k for k in self._engines if not k.startswith("_")]

    def sync(self):
        if not self.cpu:
            self.xp.cuda.Device().synchronize()

    def asnumpy(self, a):
        return a if self.cpu else self.xp.asnumpy(a)

    def free(self):
        if not self.cpu:
            self.xp.get_default_memory_pool().free_all_blocks()

    # events: a marker object and the seconds between two
    def mark(self):
        if self.cpu:
            return time.perf_counter()
        ev = self.xp.cuda.Event()
        ev.record()
        return ev

    def between(self, a, b) -> float:
        if self.cpu:
            return b - a
        b.synchronize()
        return self.xp.cuda.get_elapsed_time(a, b) / 1e3

    def time(self, fn, reps: int = 5, warm: int = 1, max_s: float = 3.0) -> dict:
        """Median seconds of ``fn()`` over up to ``reps`` timed calls after ``warm`` untimed ones (CUDA events)."""
        t0 = time.perf_counter()
        for _ in range(warm):
            fn()
        self.sync()
        first = time.perf_counter() - t0
        ts = []
        for i in range(reps):
            a = self.mark()
            fn()
            b = self.mark()
            ts.append(self.between(a, b))
            if sum(ts) + first > max_s and len(ts) >= 2:
                break
        return {"median_s": float(statistics.median(ts)), "min_s": float(min(ts)), "runs": len(ts)}
