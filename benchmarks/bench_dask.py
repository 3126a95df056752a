"""Strong scaling of rnstensor.dask on local worker processes (1 and 2 on this 2-core machine).

Two workloads, each first in memory in this process (one numba thread), then
through a ``distributed.LocalCluster`` of 1 and of 2 single-threaded worker
processes (``NUMBA_NUM_THREADS=1`` in the workers): the RescaleBE chain
``eijk,ai,bj,ck->eabc`` (n = 8, s = 15) on a batch chunked along elements
(``rnstensor.dask.apply``), and a DGEMM N x N x N (``rnstensor.dask.dgemm``,
tiles of N/2, k in two chunks summed in residues). Every Dask result is
checked bit for bit against the in-memory one. Reports wall seconds and the
speed-up of 2 workers over 1. Prints a table and writes JSON (``--json PATH``).

Usage: ``python benchmarks/bench_dask.py [--elements 8192] [--n 1024] [--repeat 3] [--json out.json] [--plot out.png]``
"""

from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import dask.array as da  # noqa: E402
import distributed  # noqa: E402
import numpy as np  # noqa: E402

import rnstensor as rt  # noqa: E402
import rnstensor.dask as rd  # noqa: E402
from _timing import add_output_options, best_time, progress, parse_args, save_result  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=8192)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    add_output_options(ap)
    args = parse_args(ap)
    r = np.random.default_rng(0)
    X = r.uniform(-1, 1, (args.elements, 8, 8, 8))
    ops = [r.uniform(-1, 1, (8, 8)) for _ in range(3)]
    plan = rt.plan_chain(ops, [0, 1, 2], ndim=3)
    N = args.n
    A, B = r.uniform(-1, 1, (N, N)), r.uniform(-1, 1, (N, N))
    ref_chain, ref_gemm = plan(X), rt.dgemm(A, B)
    rows = [
        {"workload": "chain n=8", "workers": 0, "seconds": best_time(lambda: plan(X), args.repeat)},
        {"workload": f"dgemm N={N}", "workers": 0, "seconds": best_time(lambda: rt.dgemm(A, B), args.repeat)},
    ]
    for workers in progress((1, 2), desc="bench_dask", unit="cluster"):
        with distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
        ) as cluster, distributed.Client(cluster) as client:
            client.run(lambda: os.environ.__setitem__("NUMBA_NUM_THREADS", "1"))
            DX = client.persist(da.from_array(X, chunks=(args.elements // 8, 8, 8, 8)))
            DA = client.persist(da.from_array(A, chunks=(N // 2, N // 2)))
            DB = client.persist(da.from_array(B, chunks=(N // 2, N // 2)))
            chain = rd.apply(plan, DX)
            gemm = rd.dgemm(DA, DB)
            assert np.array_equal(chain.compute(), ref_chain)
            assert np.array_equal(gemm.compute(), ref_gemm)
            rows.append({"workload": "chain n=8", "workers": workers, "seconds": best_time(chain.compute, args.repeat)})
            rows.append({"workload": f"dgemm N={N}", "workers": workers, "seconds": best_time(gemm.compute, args.repeat)})
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "load_avg": os.getloadavg()}
    print(f"\nrnstensor.dask strong scaling; {meta['machine']}, {meta['date']}, load average {meta['load_avg'][0]:.2f}")
    print("workload        | in memory (1 thread) |  1 worker |  2 workers | 2 vs 1 | 2 workers vs in memory")
    for w in ("chain n=8", f"dgemm N={N}"):
        t = {row["workers"]: row["seconds"] for row in rows if row["workload"] == w}
        print(f"{w:15s} | {t[0]:17.3f} s | {t[1]:7.3f} s | {t[2]:8.3f} s | {t[1] / t[2]:5.2f}x | {t[0] / t[2]:5.2f}x")
    save_result(args, "dask_scaling", {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
