"""Shared helpers of the benchmark scripts: best wall time after a warm-up, peak memory, progress, and the result file."""

import time
import tracemalloc

from rnstensor.backends.cpu import warm as _warm
from rnstensor.progress import progress
from rnstensor.results import json_on_stdout, output_path, result_record, write_result

_warm.enabled(False)  # the timings are of the compiled kernels, from the first call on (no cold-start routing)

__all__ = ["best_time", "interleaved", "peak_mib", "progress", "add_output_options", "parse_args", "save_result"]


def best_time(fn, repeat: int) -> float:
    """Best of ``repeat`` timed calls of ``fn`` after one untimed call (numba compilation, page faults)."""
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def interleaved(fns: dict, rounds: int = 3) -> dict:
    """Best seconds of each callable in ``fns``: one warm-up round for all, then ``rounds`` alternating rounds (a
    ratio of two of them is a same-run ratio, each side's best)."""
    best = {k: float("inf") for k in fns}
    for r in range(rounds + 1):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if r:
                best[k] = min(best[k], time.perf_counter() - t0)
    return best


def peak_mib(fn) -> float:
    """The tracemalloc peak of one call of ``fn`` in MiB (numpy-managed buffers; numba's allocator is not seen)."""
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def add_output_options(ap) -> None:
    """``--json PATH`` (the result, for ``rnstensor plot``) and ``--plot OUT.png`` (its figure, drawn at once)."""
    ap.add_argument("--json", metavar="PATH", type=output_path, default=None,
                    help="write the rows, parameters and machine as JSON to PATH")
    ap.add_argument("--plot", metavar="OUT.png", type=output_path, default=None,
                    help="draw the figure (as rnstensor plot does)")


def parse_args(ap, argv=None):
    """``ap.parse_args(argv)``; with ``--json -`` what the script prints goes to standard error from here on, so that
    standard output carries the JSON record alone."""
    args = ap.parse_args(argv)
    if getattr(args, "json", None) == "-":
        _HELD.append(json_on_stdout("-"))  # held for the rest of the script (a dropped one would restore stdout)
        _HELD[-1].__enter__()
    return args


_HELD: list = []


def save_result(args, kind: str, data: dict) -> dict:
    """``--json``: :func:`rnstensor.results.write_result` with the script's options as ``params``; ``--plot``: its figure."""
    params = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    record = write_result(args.json, kind, data, params) if args.json else result_record(kind, data, params)
    if args.json and args.json != "-":
        print(f"JSON written to {args.json}")
    if getattr(args, "plot", None):
        from rnstensor.plot import plot_result

        print(f"figure written to {plot_result(record, args.plot)}")
    return record
