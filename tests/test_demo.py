"""The parts of ``rnstensor demo`` (rnstensor.demo): what its first run says it did, and numba's compile count."""

from __future__ import annotations

from rnstensor import demo


def test_warm_up_line_says_compiled_or_loaded():
    assert demo.warm_up_line("cpu", 10.24, 49) == "compiling the CPU kernels (first run only, cached afterwards): 10.2 s"
    assert demo.warm_up_line("cpu", 0.31, 0) == "CPU kernels loaded from the cache: 0.3 s"
    assert demo.warm_up_line("cpu", 0.31, None).startswith("CPU kernels loaded")  # no numba events: by the time
    assert demo.warm_up_line("cpu", 12.0, None).startswith("compiling the CPU kernels")
    assert demo.warm_up_line("cuda", 1.5, 0).startswith("first run on the 'cuda' backend")
    routed = demo.warm_up_line("cpu", 1.2, 0, routed=True)  # cold kernels, a small call: NumPy's reference paths
    assert routed.startswith("first run on NumPy's reference paths") and "rnstensor demo --compile" in routed
    assert "(the same bits): 1.2 s\n" in routed


def test_timed_compiles_counts_numba_compilations():
    import numba

    @numba.njit(cache=False)
    def fresh(x):
        return x + 1

    seconds, compiled = demo.timed_compiles(lambda: fresh(1))
    assert compiled >= 1 and seconds > 0
    assert demo.timed_compiles(lambda: fresh(2))[1] == 0  # compiled once, then only called


def test_timed_line_says_what_ran():
    assert demo.timed_line("cpu", 0.0057, 0, False) == "residue chain took 5.7 ms on the 'cpu' backend (kernels already loaded)"
    assert demo.timed_line("cpu", 0.028, 0, True).endswith("(NumPy's reference paths where the kernels are not compiled)")
    assert demo.timed_line("cpu", 10.3, 28, False).endswith("(kernels already loaded; 28 numba compilations included)")
    both = demo.warm_up_line("cpu", 16.0, 21, routed=True)  # small calls routed, large ones compiled
    assert both.startswith("first run on NumPy's reference paths") and "(the same bits, 21 numba compilations): 16.0 s" in both


def test_first_run_takes_the_timed_runs_paths(monkeypatch, capsys):
    # the untimed first run meets every kernel with the timed run's work, so whatever a call of that size compiles
    # compiles there, not inside the time shown (a first run on one tensor once routed what the batch compiled)
    from rnstensor import cli
    from rnstensor.backends.cpu import backend as cpu_backend
    from rnstensor.backends.cpu import magnitudes, warm

    seen: list = []

    def decide(kernel, work, call_s=None, charge=True):
        seen.append((kernel, work))
        routed = work < 20_000  # some of the demo's calls are routed, some run their kernel
        if routed and charge:
            warm._state["routed"] += 1
        return not routed

    for mod in (cpu_backend, magnitudes):
        monkeypatch.setattr(mod, "warm", decide)
    monkeypatch.setitem(warm._state, "enabled", True)
    chain_report = demo.chain_report
    monkeypatch.setattr(demo, "chain_report", lambda *a: seen.append("timed") or chain_report(*a))
    assert cli.main(["demo", "--batch", "3", "--accuracy-count", "0"]) == 0
    out = capsys.readouterr().out
    cut = seen.index("timed")
    first, timed = seen[:cut], seen[cut + 1:]
    assert first == timed and any(w < 20_000 for _, w in timed) and any(w >= 20_000 for _, w in timed)
    assert "(NumPy's reference paths where the kernels are not compiled)" in out
