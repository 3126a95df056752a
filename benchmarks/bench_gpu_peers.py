"""Which call should a GPU user make? rnstensor's policies against native FP64, cuBLAS's FP64 emulation and nvmath's 8XINT8.

For DGEMM (N = 2048 ... 16384, times ``scale**(1/3)``), ZGEMM, one einsum
chain (``eijk,ai,bj,ck->eabc``) and one GEMM-shaped einsum
(``ijab,abcd->ijcd``), on U[-1, 1) and phi = 4 data, in one run on one
device:

* ``rt.dgemm`` / ``rt.zgemm`` / ``rt.einsum`` with ``moduli=None`` (the
  default), ``'fast'`` and ``'auto'`` (CuPy in, CuPy out);
* native: ``cupy.matmul`` / ``cupy.einsum`` in float64 / complex128;
* cuBLAS's own FP64 emulation (CUDA 13.0 update 2 and later): the same CuPy
  calls in a child process with ``CUBLAS_EMULATE_DOUBLE_PRECISION=1`` and
  ``CUBLAS_EMULATION_STRATEGY`` ``performant`` or ``eager``; the child reports
  the cuBLAS version, and the emulation counts as active only where its bits
  differ from native's on data where they must (else it is reported as not
  active);
* nvmath-python's 8XINT8 contraction where nvmath-python imports (never
  installed here); skipped with the reason otherwise.

Accuracy of every result on the same inputs, against exact references on
the host for a sub-block (Python integers, :mod:`rnstensor.gemm_accuracy`):
the share of correctly rounded entries, the largest componentwise error
relative to ``|A||B|``, and the share of entries less accurate than native.
:func:`verdicts` answers the user's question per size and data: the fastest
call at float64's accuracy (no entry worse than native's worst, at most
0.1 % of entries worse than native) and the fastest correctly rounded one,
with their speed against native. ``--standin`` (or the device check's dry
run) runs everything but the peers that need a real GPU, reported as
skipped.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

__all__ = ["gemm_sizes", "accuracy_of", "verdicts", "format_verdicts", "bench_peers", "emulation_child"]

SIZES = (2048, 4096, 8192, 16384)
DATA = ("uniform", "phi4")
POLICIES = (None, "fast", "auto")
STRATEGIES = ("performant", "eager")
BLOCK = 24  # rows and columns of the exactly referenced sub-block
U = 2.0**-53


def gemm_sizes(scale: float) -> list[int]:
    """The DGEMM sizes at this scale (multiples of 32, at least 32), smallest first: a short budget keeps those."""
    f = scale ** (1 / 3)
    return sorted({max(32, int(N * f) // 32 * 32) for N in SIZES})


def _generate(xp, kind: str, shape, cplx: bool = False):
    """U[-1, 1) or phi = 4 data (``(U(0,1) - 1/2) exp(4 N(0,1))``, [2610.26945] Sec. 7) drawn where it will be used
    (the device: no data-sized copy), from the generator ``xp.random`` seeded by the caller."""
    def real():
        if kind == "uniform":
            return xp.random.uniform(-1.0, 1.0, shape)
        return (xp.random.uniform(0.0, 1.0, shape) - 0.5) * xp.exp(4.0 * xp.random.standard_normal(shape))
    return real() + 1j * real() if cplx else real()


# ----- accuracy -------------------------------------------------------------------------------------


def accuracy_of(C_block: np.ndarray, refs, absprod: np.ndarray, native_err: Optional[np.ndarray]) -> dict:
    """Metrics of a result's sub-block against exact references (one per real part).

    ``refs``: :class:`~rnstensor.gemm_accuracy.ExactReference` of each part;
    ``absprod``: ``|A||B|`` of the block; ``native_err``: native's error per
    entry (``None`` for native itself). Returns the share of correctly
    rounded entries (``cr``, in [0, 1]), the largest componentwise error
    (``componentwise``) and the share of entries whose error exceeds
    native's (``worse_than_native``), and the per-entry errors (``err``).
    """
    parts = [C_block.real, C_block.imag] if np.iscomplexobj(C_block) else [C_block]
    errs = [ref.errors(np.ascontiguousarray(p)) for ref, p in zip(refs, parts)]
    err = errs[0] if len(errs) == 1 else errs[0] + errs[1]
    cr = np.mean([np.mean(np.asarray(p) == ref.rounded) for ref, p in zip(refs, parts)])
    with np.errstate(divide="ignore", invalid="ignore"):
        comp = float(np.max(np.where(absprod > 0, err / absprod, np.where(err > 0, np.inf, 0.0))))
    out = {"cr": float(cr), "componentwise": comp, "err": err}
    out["worse_than_native"] = 0.0 if native_err is None else float(np.mean(err > native_err))
    return out


def _references(A, B):
    """Exact references of ``A @ B`` (a host sub-block): one per real part, and ``|A||B|``."""
    from rnstensor.gemm_accuracy import ExactReference, exact_zgemm

    if np.iscomplexobj(A) or np.iscomplexobj(B):
        re, im = exact_zgemm(np.asarray(A, np.complex128), np.asarray(B, np.complex128))
        return [re, im], np.abs(A.real) @ np.abs(B.real) + np.abs(A.imag) @ np.abs(B.imag) + (
            np.abs(A.real) @ np.abs(B.imag) + np.abs(A.imag) @ np.abs(B.real))
    ref = ExactReference.of(A, B)
    return [ref], ref.abs_product


# ----- the verdict table ------------------------------------------------------------------------


def verdicts(rows: list[dict]) -> list[dict]:
    """Per (case, size, data): the fastest call at float64's accuracy and the fastest correctly rounded one.

    ``rows``: dicts with ``case``, ``size``, ``data``, ``call``, ``median_s``
    and ``cr``, ``componentwise``, ``worse_than_native`` (or ``skipped``).
    A call is at float64's accuracy where its largest componentwise error is
    at most native's and at most 0.1 % of its entries are less accurate than
    native's (native qualifies); correctly rounded where every referenced
    entry is. Speeds are against native in the same run.
    """
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["case"], r["size"], r["data"]), []).append(r)
    out = []
    for (case, size, data), group in groups.items():
        timed = [r for r in group if "median_s" in r and "cr" in r]
        native = next((r for r in timed if r["call"] == "native"), None)
        if native is None:
            continue

        def best(ok):
            cands = [r for r in timed if ok(r)]
            return min(cands, key=lambda r: r["median_s"]) if cands else None

        f64 = best(lambda r: r["componentwise"] <= native["componentwise"] and r["worse_than_native"] <= 0.001)
        cr = best(lambda r: r["cr"] >= 1.0)
        v = {"case": case, "size": size, "data": data, "native_s": native["median_s"]}
        for key, r in (("float64", f64), ("correctly_rounded", cr)):
            v[key] = None if r is None else {"call": r["call"], "speedup_vs_native": native["median_s"] / r["median_s"]}
        out.append(v)
    return out


def format_verdicts(table: list[dict]) -> str:
    """The user's answer as text: one line per case, size and data."""
    lines = [f"{'case':<10} {'size':>6} {'data':<8} {'fastest at float64 accuracy':<34} fastest correctly rounded"]
    for v in table:
        cells = []
        for key in ("float64", "correctly_rounded"):
            w = v[key]
            cells.append("none" if w is None else f"{w['call']} ({w['speedup_vs_native']:.2f}x native)")
        lines.append(f"{v['case']:<10} {v['size']:>6} {v['data']:<8} {cells[0]:<34} {cells[1]}")
    return "\n".join(lines)


# ----- the peers ----------------------------------------------------------------------------------


def _jobs(scale: float) -> list[dict]:
    jobs = []
    for N in gemm_sizes(scale):
        for data in DATA:
            jobs.append({"case": "dgemm", "size": N, "data": data, "seed": N + len(data)})
    zn = gemm_sizes(scale)[min(1, len(gemm_sizes(scale)) - 1)]
    for data in DATA:
        jobs.append({"case": "zgemm", "size": zn, "data": data, "seed": 7 + len(data)})
        jobs.append({"case": "einsum_gemm", "size": max(4, int(round(48 * scale ** (1 / 6)))), "data": data,
                     "seed": 11 + len(data)})
        jobs.append({"case": "einsum_chain", "size": 8, "data": data, "seed": 13 + len(data),
                     "elements": max(8, int((1 << 17) * scale))})
    return jobs


def _operands(job: dict, xp):
    """A job's operands, drawn on ``xp`` from its seed (the emulation child draws the same), and its contraction."""
    case, n, data = job["case"], job["size"], job["data"]
    xp.random.seed(job["seed"])
    if case in ("dgemm", "zgemm"):
        cplx = case == "zgemm"
        return (_generate(xp, data, (n, n), cplx), _generate(xp, data, (n, n), cplx)), "gemm"
    if case == "einsum_gemm":
        return (_generate(xp, data, (n, n, n, n)), _generate(xp, data, (n, n, n, n))), "ijab,abcd->ijcd"
    return (_generate(xp, data, (job["elements"], n, n, n)), _generate(xp, data, (n, n))), "eijk,ai,bj,ck->eabc"


def _host(x) -> np.ndarray:
    return x.get() if hasattr(x, "get") else np.asarray(x)


def _call(xp, how: str, ops):
    if how == "gemm":
        return xp.matmul(*ops)
    if how == "ijab,abcd->ijcd":
        return xp.einsum(how, *ops)
    X, A = ops
    return xp.einsum(how, X, A, A, A)


def _rt_call(how: str, ops, moduli):
    import rnstensor as rt

    if how == "gemm":
        return (rt.zgemm if ops[0].dtype.kind == "c" else rt.dgemm)(*ops, moduli=moduli)
    if how == "ijab,abcd->ijcd":
        return rt.einsum(how, *ops, moduli=moduli)
    X, A = ops
    return rt.einsum(how, X, A, A, A, moduli=moduli)


#: tensors and outputs of the chain's exactly referenced block (its exact sums run in Fractions)
CHAIN_BLOCK = (4, BLOCK)


def _result_block(how: str, ops, y) -> np.ndarray:
    """The referenced sub-block of a result, on the host: the GEMM's first rows and columns; the chain's first
    tensors' first outputs (sliced where the result lives, then copied: a few hundred entries)."""
    if how == "gemm":
        return _host(y[:BLOCK, :BLOCK])
    if how == "ijab,abcd->ijcd":
        n = ops[0].shape[0]
        return _host(y.reshape(n * n, n * n)[:BLOCK, :BLOCK])
    e, m = CHAIN_BLOCK
    return _host(y[:e].reshape(e, -1)[:, :m])


def _exact_chain_block(X, A):
    """Exact references of the chain's block: ``Y[e, abc] = sum A_ai A_bj A_ck X_eijk`` in Fractions, per entry."""
    from fractions import Fraction

    from rnstensor.gemm_accuracy import ExactReference

    e, m = CHAIN_BLOCK
    n = A.shape[0]
    FA = [[Fraction(float(v)) for v in row] for row in A]
    S = np.zeros((e, m), dtype=object)
    ex = np.zeros((e, m), dtype=np.int64)
    absprod = np.zeros((e, m))
    for t in range(e):
        FX = np.vectorize(lambda v: Fraction(float(v)), otypes=[object])(X[t])
        for o in range(m):
            a, b, c = np.unravel_index(o, (n, n, n))
            w = np.array([[[FA[a][i] * FA[b][j] * FA[c][k] for k in range(n)] for j in range(n)] for i in range(n)],
                         dtype=object)
            v = (w * FX).sum()
            den = v.denominator  # a power of two: the value is S * 2**-log2(den)
            S[t, o], ex[t, o] = v.numerator, -(den.bit_length() - 1)
            absprod[t, o] = float((np.abs(w) * np.abs(FX)).sum())
    return [ExactReference(S, ex, absprod)], absprod


def _references_of(how: str, ops):
    """Exact references of a job's referenced block (one per real part) and its magnitudes, from host copies of the
    operands' rows and columns it reads."""
    if how == "gemm":
        A, B = ops
        return _references(_host(A[:BLOCK]), _host(B[:, :BLOCK]))
    if how == "ijab,abcd->ijcd":
        a, b = ops
        n = a.shape[0]
        return _references(_host(a.reshape(n * n, n * n)[:BLOCK]), _host(b.reshape(n * n, n * n)[:, :BLOCK]))
    X, A = ops
    return _exact_chain_block(_host(X[:CHAIN_BLOCK[0]]), _host(A))


def emulation_child(strategy: str, jobs_path: str, out_path: str) -> None:
    """The child of one emulation strategy: the native CuPy calls of every job, timed, with their sub-blocks saved.

    Run with ``CUBLAS_EMULATE_DOUBLE_PRECISION=1`` and
    ``CUBLAS_EMULATION_STRATEGY`` set before CuPy loads cuBLAS.
    """
    import cupy as cp
    from _gpu_env import Env

    env = Env()
    res: dict = {"strategy": strategy, "results": []}
    try:
        handle = cp.cuda.device.get_cublas_handle()
        res["cublas_version"] = int(cp.cuda.cublas.getVersion(handle))
    except Exception as exc:  # noqa: BLE001 - reported, the timings still run
        res["cublas_version_error"] = f"{type(exc).__name__}: {exc}"
    for job in json.load(open(jobs_path)):
        dev, how = _operands(job, cp)
        t = env.time(lambda: _call(cp, how, dev), reps=3, max_s=4.0)
        block = os.path.join(os.path.dirname(out_path), f"{strategy}-{len(res['results'])}.npy")
        np.save(block, _result_block(how, dev, _call(cp, how, dev)))
        del dev
        cp.get_default_memory_pool().free_all_blocks()
        res["results"].append({**job, **t, "block": block})
    with open(out_path, "w") as f:
        json.dump(res, f)


def _emulation(strategy: str, jobs: list[dict], env, timeout: float) -> dict:
    """Run :func:`emulation_child` for ``strategy``; ``{'skipped': reason}`` where it cannot run here."""
    if env.cpu or env.standin:
        return {"skipped": "needs a real GPU and its cuBLAS (the CuPy stand-in / CPU run has neither)"}
    work = tempfile.mkdtemp(prefix="rnstensor-emulation-")
    jobs_path, out_path = os.path.join(work, "jobs.json"), os.path.join(work, "out.json")
    json.dump(jobs, open(jobs_path, "w"))
    child_env = dict(os.environ, CUBLAS_EMULATE_DOUBLE_PRECISION="1", CUBLAS_EMULATION_STRATEGY=strategy)
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", strategy, jobs_path, out_path],
                              env=child_env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"skipped": f"the child ran past its {timeout:.0f} s"}
    if proc.returncode != 0 or not os.path.exists(out_path):
        return {"skipped": f"the child failed: {proc.stderr.strip()[-400:]}"}
    return json.load(open(out_path))


def _nvmath_skip_reason() -> Optional[str]:
    try:
        import nvmath  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"nvmath-python does not import here ({type(exc).__name__}); it is not installed on the device"
    return None


def bench_peers(env, res: dict, rows: list, scale: float, deadline: float) -> None:
    """Every job: native, rt's policies, both emulation strategies (children) and nvmath; accuracy; verdicts."""
    xp = env.xp
    jobs = _jobs(scale)
    if env.standin:  # a dry run checks the code paths, not the speeds: the two smallest DGEMM sizes do that
        jobs = [j for j in jobs if j["case"] != "dgemm" or j["size"] <= gemm_sizes(scale)[:2][-1]]
    out: dict = {"jobs": [], "peers": {}}
    res["peers"] = out
    table_rows: list = []
    done = []
    for job in jobs:
        if time.perf_counter() > deadline:
            out["jobs"].append({**job, "skipped": "budget"})
            continue
        dev, how = _operands(job, xp)
        refs, absprod = _references_of(how, dev)
        entry = {**job, "calls": {}}
        out["jobs"].append(entry)
        t = env.time(lambda: _call(xp, how, dev), reps=3, max_s=4.0)
        native_block = _result_block(how, dev, _call(xp, how, dev))
        native = accuracy_of(native_block, refs, absprod, None)
        entry["calls"]["native"] = {**t, **{k: v for k, v in native.items() if k != "err"}}
        for pol in POLICIES:
            name = f"rt {pol or 'default'}"
            try:
                t = env.time(lambda: _rt_call(how, dev, pol), reps=3, max_s=4.0)
                yb = _result_block(how, dev, _rt_call(how, dev, pol))
                acc = accuracy_of(yb, refs, absprod, native["err"])
                entry["calls"][name] = {**t, **{k: v for k, v in acc.items() if k != "err"}}
            except Exception as exc:  # a refusal (e.g. 'auto' splitting on the host) is a row, not a failure
                entry["calls"][name] = {"skipped": f"{type(exc).__name__}: {exc}"[:300]}
        entry["native_err"] = native["err"]
        done.append((entry, refs, absprod, native_block))
        del dev
        env.free()
    # the emulation children, one per strategy, over the jobs the budget kept
    kept = [{k: v for k, v in e.items() if k not in ("calls", "native_err")} for e, *_ in done]
    for strategy in STRATEGIES:
        left = deadline - time.perf_counter()
        em = _emulation(strategy, kept, env, max(10.0, left)) if kept else {"skipped": "no job left in the budget"}
        out["peers"][f"cublas_emulation_{strategy}"] = {k: v for k, v in em.items() if k != "results"}
        if "results" not in em:
            continue
        active = False
        for (entry, refs, absprod, native_block), r in zip(done, em["results"]):
            yb = np.load(r["block"])
            acc = accuracy_of(yb, refs, absprod, entry["native_err"])
            differs = bool(np.any(np.ascontiguousarray(yb).view(np.uint8)
                                  != np.ascontiguousarray(native_block).view(np.uint8)))
            active = active or differs
            entry["calls"][f"cuBLAS emulation {strategy}"] = {
                "median_s": r["median_s"], "min_s": r["min_s"], "runs": r["runs"], "bits_differ_from_native": differs,
                **{k: v for k, v in acc.items() if k != "err"}}
        out["peers"][f"cublas_emulation_{strategy}"]["active"] = active
        if not active:  # the variables changed nothing: not emulation, and not reported as a call
            out["peers"][f"cublas_emulation_{strategy}"]["note"] = "bits equal to native everywhere: not active"
            for entry, *_ in done:
                entry["calls"].pop(f"cuBLAS emulation {strategy}", None)
    why = _nvmath_skip_reason()
    out["peers"]["nvmath_8xint8"] = {"skipped": why} if why else {
        "skipped": "nvmath-python imports, but its 8XINT8 contraction is not wired into this benchmark yet"}
    for entry, *_ in done:
        entry.pop("native_err", None)
        for call, r in entry["calls"].items():
            table_rows.append({"case": entry["case"], "size": entry["size"], "data": entry["data"], "call": call, **r})
    out["verdicts"] = verdicts(table_rows)
    text = format_verdicts(out["verdicts"])
    out["table"] = text.splitlines()
    rows.append(("peers: which call to make", f"{len(out['verdicts'])} cases", "see the table below"))
    for peer, info in out["peers"].items():
        if "skipped" in info:
            rows.append((f"peer {peer}", "skipped", info["skipped"][:90]))
    print(text, flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        emulation_child(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit("usage: the peers run inside bench_gpu.py (device_check.sh); --child STRATEGY JOBS OUT is internal")
