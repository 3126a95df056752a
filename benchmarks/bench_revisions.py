"""Two checkouts of rnstensor timed in the same run on the same machine: the public CPU calls, case by case.

Every case runs in a fresh child process per checkout (``PYTHONPATH=<checkout>``),
the two checkouts alternating ``--rounds`` times so that drift in the
machine's load falls on both; each child reports the best of ``--repeat``
calls after a warm-up (numba's compilation excluded: the children run with
``RNSTENSOR_COLD_START=0`` unless it is set), keeping each result
until the next call returns (as an application keeps its results).
``--pinned-malloc`` fixes glibc's adaptive mmap / trim thresholds in the
children: the page faults of a call otherwise follow the order of its
allocations and frees, a few ms either way at these sizes. Prints per case the
best time of each and the ratio new / old, and writes JSON (``--json``).

Usage: ``python benchmarks/bench_revisions.py OLD_DIR NEW_DIR [--rounds 3] [--repeat 5] [--json out.json] [--plot out.png]``
(for example ``git worktree add /tmp/old <rev>`` for the old checkout).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

from _timing import add_output_options, progress, parse_args, save_result

# each case: (name, setup code, timed expression); numpy as np, rnstensor as rt, rng = default_rng(0)
CASES = [
    ("decode fp64, 2^18 entries, 15 moduli",
     "B=rt.Basis.int8(15); a=rng.uniform(-1,1,(8,8)); x=rng.uniform(-1,1,(512,8,8,8));"
     " T=rt.mode_product(rt.encode(x,B,bits=53),rt.encode(a,B,bits=53,shared_axes=(1,)),1)",
     "rt.decode(T)"),
    ("chain n=8 d=3 (2^18 DoFs, rescale_be)",
     "ops=[rng.uniform(-1,1,(8,8)) for _ in range(3)]; p=rt.plan_chain(ops,[0,1,2]); X=rng.uniform(-1,1,(512,8,8,8))",
     "p(X)"),
    ("chain n=8 d=3 (2^20 DoFs, moduli=15)",
     "ops=[rng.uniform(-1,1,(8,8)) for _ in range(3)]; p=rt.plan_chain(ops,[0,1,2],moduli=15);"
     " X=rng.uniform(-1,1,(2048,8,8,8))",
     "p(X)"),
    ("chain n=8 d=3 (2^20 DoFs, default)",
     "ops=[rng.uniform(-1,1,(8,8)) for _ in range(3)]; p=rt.plan_chain(ops,[0,1,2]); X=rng.uniform(-1,1,(2048,8,8,8))",
     "p(X)"),
    ("chain n=8 d=3 exact decode",
     "ops=[rng.uniform(-1,1,(8,8)) for _ in range(3)]; p=rt.plan_chain(ops,[0,1,2]); X=rng.uniform(-1,1,(512,8,8,8))",
     "p(X, decode='exact')"),
    ("chain n=16 composed",
     "ops=[rng.uniform(-1,1,(16,16)) for _ in range(3)]; p=rt.plan_chain(ops,[0,1,2],method='composed');"
     " X=rng.uniform(-1,1,(64,16,16,16))",
     "p(X)"),
    ("einsum eijk,ai,bj,ck->eabc (512 x 8^3)",
     "A=rng.uniform(-1,1,(8,8)); X=rng.uniform(-1,1,(512,8,8,8))",
     "rt.einsum('eijk,ai,bj,ck->eabc', X, A, A, A)"),
    ("einsum ij,jk,kl->il (128^2)",
     "a,b,c=(rng.uniform(-1,1,(128,128)) for _ in range(3))",
     "rt.einsum('ij,jk,kl->il', a, b, c)"),
    ("einsum bij,jk->bik moduli='fast' (64*50 x 60 x 40: a mode product)",
     "x=rng.uniform(-1,1,(64,50,60)); m=rng.uniform(-1,1,(60,40))",
     "rt.einsum('bij,jk->bik', x, m, moduli='fast')"),
    ("einsum ijab,abcd->ijcd moduli='fast' (64 x 900 x 900)",
     "x=rng.uniform(-1,1,(8,8,30,30)); m=rng.uniform(-1,1,(30,30,30,30))",
     "rt.einsum('ijab,abcd->ijcd', x, m, moduli='fast')"),
    ("matmul stack 64 x (50x60)(60x40) default",
     "A=rng.uniform(-1,1,(64,50,60)); B=rng.uniform(-1,1,(64,60,40))",
     "rt.matmul(A, B)"),
    ("matmul complex stack 64 x (50x60)(60x40) moduli='fast'",
     "A=rng.uniform(-1,1,(64,50,60))+1j*rng.uniform(-1,1,(64,50,60)); B=rng.uniform(-1,1,(64,60,40))-1j",
     "rt.matmul(A, B, moduli='fast')"),
    ("dgemm N=512 default moduli",
     "a,b=rng.standard_normal((512,512)),rng.standard_normal((512,512))",
     "rt.dgemm(a, b)"),
    ("dgemm N=512 moduli='auto'",
     "a,b=rng.standard_normal((512,512)),rng.standard_normal((512,512))",
     "rt.dgemm(a, b, moduli='auto')"),
    ("dgemm N=512 moduli='auto' with alpha, beta, C",
     "a,b,c=(rng.standard_normal((512,512)) for _ in range(3))",
     "rt.dgemm(a, b, c, alpha=1.5, beta=-0.3, moduli='auto')"),
    ("dgemm N=512 moduli='auto' with beta, C (two entries 2^+-900)",
     "a,b,c=(rng.standard_normal((512,512)) for _ in range(3)); c[3,4]=2.0**900; c[100,7]=-2.0**-900",
     "rt.dgemm(a, b, c, beta=-0.3, moduli='auto')"),
    ("dgemm N=1024 moduli='auto'",
     "a,b=rng.uniform(-1,1,(1024,1024)),rng.uniform(-1,1,(1024,1024))",
     "rt.dgemm(a, b, moduli='auto')"),
    ("einsum ij,jk,kl->il moduli='auto' (64^2, 2^+-150: beyond one plan)",
     "w=lambda s: rng.standard_normal(s)*np.exp2(rng.integers(-150,150,s)); a,b,c=w((64,64)),w((64,64)),w((64,64))",
     "rt.einsum('ij,jk,kl->il', a, b, c, moduli='auto')"),
    ("chain d=3 moduli='auto' (8 x 8^3, X 2^+-200: beyond one plan)",
     "ops=[rng.uniform(-1,1,(8,8)) for _ in range(3)]; p=rt.plan_chain(ops,[0,1,2],moduli='auto');"
     " X=rng.standard_normal((8,8,8,8))*np.exp2(rng.integers(-200,200,(8,8,8,8)))",
     "p(X)"),
    ("dgemm N=256 moduli='auto' (rows 2^+-400: the exact split)",
     "a=rng.standard_normal((256,256))*np.exp2(rng.integers(-400,400,(256,256))); b=rng.standard_normal((256,256))",
     "rt.dgemm(a, b, moduli='auto')"),
    ("dgemm N=1024 moduli=14",
     "a,b=rng.standard_normal((1024,1024)),rng.standard_normal((1024,1024))",
     "rt.dgemm(a, b, moduli=14)"),
    ("zgemm N=256",
     "a=rng.standard_normal((256,256))+1j*rng.standard_normal((256,256)); b=a.T.copy()",
     "rt.zgemm(a, b)"),
    ("FEM mass p=4 (4^3 elements)",
     "from rnstensor.fem import TensorBasis, MassOperator, box_mesh; bb=TensorBasis(5); m=box_mesh(bb,shape=(4,4,4),"
     "curved=0.1); M=MassOperator(bb,m.qdata); u=rng.standard_normal((m.nelem,5,5,5))",
     "M.apply(u)"),
    ("FEM Poisson p=4 (4^3 elements)",
     "from rnstensor.fem import TensorBasis, PoissonOperator, box_mesh; bb=TensorBasis(5); m=box_mesh(bb,shape=(4,4,4),"
     "curved=0.1); A=PoissonOperator(bb,m.G); u=rng.standard_normal((m.nelem,5,5,5))",
     "A.apply(u)"),
]

# the result of a call is kept until the next one returns, as an application keeps its results
_CHILD = """
import time, numpy as np, rnstensor as rt
rng = np.random.default_rng(0)
{setup}
f = lambda: {expr}
y = f()
best = float('inf')
for _ in range({repeat}):
    t0 = time.perf_counter(); y = f(); best = min(best, time.perf_counter() - t0)
print(best)
"""

# glibc's malloc returns memory to the system or keeps it depending on the order and sizes of the frees
# (its adaptive mmap / trim thresholds), so the page faults of a call, up to a few ms here, follow allocation
# patterns rather than the arithmetic; --pinned-malloc fixes both thresholds in every child (no trimming)
_PINNED = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 31)}
PINNED = False


def _time(checkout: str, setup: str, expr: str, repeat: int) -> float:
    # the kernels compile in the warm-up call (RNSTENSOR_COLD_START=0): with the first-call routing on, a checkout
    # whose numba cache is empty would time the reference paths its few calls never pay to leave
    env = dict(os.environ, PYTHONPATH=checkout, **(_PINNED if PINNED else {}))
    env.setdefault("RNSTENSOR_COLD_START", "0")
    out = subprocess.run([sys.executable, "-c", _CHILD.format(setup=setup, expr=expr, repeat=repeat)], env=env,
                         cwd=checkout, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    add_output_options(ap)
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    ap.add_argument("--pinned-malloc", action="store_true", help="fix glibc's mmap / trim thresholds in the children")
    args = parse_args(ap)
    global PINNED
    PINNED = args.pinned_malloc
    rows = []
    cases = [c for c in CASES if not args.only or args.only in c[0]]
    bar = progress(total=len(cases) * args.rounds * 2, desc="bench_revisions", unit="child")
    for name, setup, expr in cases:
        best = {"old": float("inf"), "new": float("inf")}
        for r in range(args.rounds):
            for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
                path = args.old if which == "old" else args.new
                best[which] = min(best[which], _time(path, setup, expr, args.repeat))
                bar.update()
        rows.append({"case": name, "old_s": best["old"], "new_s": best["new"], "ratio": best["new"] / best["old"]})
        bar.write(f"{name:<44} old {best['old'] * 1e3:9.2f} ms  new {best['new'] * 1e3:9.2f} ms  "
                  f"new/old {best['new'] / best['old']:5.2f}")
    bar.close()
    print(f"\n{platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}; "
          f"best of {args.repeat} calls x {args.rounds} alternating rounds per checkout"
          + ("; malloc thresholds pinned" if PINNED else ""))
    save_result(args, "revisions", {"rows": rows})


if __name__ == "__main__":
    main()
