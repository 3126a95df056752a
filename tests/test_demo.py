"""The parts of ``rnstensor demo`` (rnstensor.demo): what its first run says it did, and numba's compile count."""

from __future__ import annotations

from rnstensor import demo


def test_warm_up_line_says_compiled_or_loaded():
    assert demo.warm_up_line("cpu", 10.24, 49) == "compiling the CPU kernels (first run only, cached afterwards): 10.2 s"
    assert demo.warm_up_line("cpu", 0.31, 0) == "CPU kernels loaded from the cache: 0.3 s"
    assert demo.warm_up_line("cpu", 0.31, None).startswith("CPU kernels loaded")  # no numba events: by the time
    assert demo.warm_up_line("cpu", 12.0, None).startswith("compiling the CPU kernels")
    assert demo.warm_up_line("cuda", 1.5, 0).startswith("first run on the 'cuda' backend")
    routed = demo.warm_up_line("cpu", 1.2, 3, routed=True)  # cold kernels, a small call: NumPy's reference paths
    assert routed.startswith("first run on NumPy's reference paths") and "rnstensor demo --compile" in routed
    assert routed.endswith(": 1.2 s")


def test_timed_compiles_counts_numba_compilations():
    import numba

    @numba.njit(cache=False)
    def fresh(x):
        return x + 1

    seconds, compiled = demo.timed_compiles(lambda: fresh(1))
    assert compiled >= 1 and seconds > 0
    assert demo.timed_compiles(lambda: fresh(2))[1] == 0  # compiled once, then only called
