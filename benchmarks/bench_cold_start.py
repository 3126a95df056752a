"""The first call of each entry point in a fresh process with an empty numba cache, and the same call cached.

Issue 33, item 4 sets the targets: each entry point's first call at most
3 s cold, and the Quickstart's first command (a fresh venv, ``pip install
-e .``, ``rnstensor demo``) at most 20 s: its demo row here, at most 9 s. Each row runs ``python -c`` in a new process whose
``NUMBA_CACHE_DIR`` is a new empty folder (cold: numba compiles what the
call uses), then again with that folder filled (cached: numba loads it),
and reports the wall time of the call alone (the import apart). Prints a
table; ``--json PATH`` writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

__all__ = ["CALLS", "TARGETS", "first_call", "main"]

#: entry point -> (setup, the call), small data: what is timed is compilation, not arithmetic
CALLS = {
    "einsum": ("a = np.random.default_rng(0).uniform(-1, 1, (8, 8))", "rt.einsum('ij,jk->ik', a, a)"),
    "dgemm": ("a = np.random.default_rng(0).uniform(-1, 1, (64, 64))", "rt.dgemm(a, a)"),
    "plan_chain": ("ops = [np.random.default_rng(i).uniform(-1, 1, (8, 8)) for i in range(3)]\n"
                   "X = np.random.default_rng(5).uniform(-1, 1, (16, 8, 8, 8))",
                   "rt.plan_chain(ops, [0, 1, 2])(X)"),
    "dgemm auto": ("a = np.random.default_rng(0).uniform(-1, 1, (64, 64))", "rt.dgemm(a, a, moduli='auto')"),
    # the Quickstart's first command less its venv and pip install (about 11 s here): the demo, accuracy runs too
    "rnstensor demo": ("import contextlib, io\nfrom rnstensor.cli import main",
                       "with contextlib.redirect_stdout(io.StringIO()):\n    main(['demo'])"),
}
#: seconds a first call may take: issue 33's 3 s per entry point; the demo, the Quickstart's 20 s less its install
TARGETS = {"rnstensor demo": 9.0}

_SCRIPT = """
import time
t0 = time.perf_counter()
import numpy as np, rnstensor as rt
t1 = time.perf_counter()
{setup}
t2 = time.perf_counter()
{call}
t3 = time.perf_counter()
print(t1 - t0, t3 - t2)
"""


def first_call(setup: str, call: str, cache: str) -> tuple[float, float]:
    """``(import seconds, call seconds)`` of ``call`` in a new process with ``NUMBA_CACHE_DIR=cache``."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    out = subprocess.run([sys.executable, "-c", _SCRIPT.format(setup=setup, call=call)], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[-2]), float(out[-1])


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'entry point':<15} {'import s':>9} {'cold call s':>12} {'cached call s':>14}  target")
    for name, (setup, call) in CALLS.items():
        with tempfile.TemporaryDirectory() as cache:
            imp, cold = first_call(setup, call, cache)
            _, warm = first_call(setup, call, cache)
        target = TARGETS.get(name, 3.0)
        rows.append({"entry": name, "import_s": imp, "cold_s": cold, "cached_s": warm, "target_s": target,
                     "met": cold <= target})
        print(f"{name:<15} {imp:>9.2f} {cold:>12.2f} {warm:>14.2f}  <= {target:g} s "
              f"{'met' if cold <= target else 'not met'}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
