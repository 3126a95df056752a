"""A performance model of the chain and the DGEMM/ZGEMM pipeline from two measured ceilings ([2610.26945] Sec. 9.2 style).

Every kernel ``k`` of a run is charged the largest of three times, and a run
is the sum over its kernels plus a launch cost each:

    T_k = max( B_k / beta,  W_k / R8,  I_k / R_issue ) + tau

* ``B_k``: the fewest bytes the kernel must move through device memory (each
  input read once, each output written once), ``beta`` the measured
  device-to-device copy rate (bytes read + written per second);
* ``W_k``: its useful INT8 multiply-adds x 2, ``R8`` the measured cuBLAS INT8
  GEMM rate;
* ``I_k``: its executed warp instructions, ``R_issue`` = SMs x 4 schedulers x
  clock (one warp instruction per clock per SMSP; the clock from the measured
  FFMA rate). ``I_k`` is the per-entry count times the entries: measured by
  ``ncu`` (``smsp__inst_executed.sum``) where device_check.sh ran it, else a
  *static estimate* from the SASS (:mod:`sass_count`): operation counts of the
  algorithm (multiply-adds and reductions of the MRC digits, the extension and
  the decode, from the drop counts of the plan) times instructions per
  operation read off the kernel's innermost loops. The estimate ignores
  divergence and the MIO (shared / constant load) throughput limit, so it is a
  lower bound more often than not.
* ``tau`` a launch gap (5 us, a lead).

For the fused chain kernel, one kernel: ``B = 16`` bytes per DoF (8 in, 8 out).
For DGEMM ([2610.26945] Sec. 9.2 has T = 2mnks g/R8 + g[(16+s)(mk+kn) + (4s+8)mn]/beta
+ n_launch tau for their pipeline) the phases of bench_gpu.py's device
pipeline are charged with their own byte counts (see :func:`dgemm_phases`).

The *floor* of a run is the largest of the three totals over the whole run
(sum of bytes / beta, sum of W / R8, sum of I / R_issue): no schedule of the
same work beats it. Measured time / floor is the gap the issue asks for.

Usage:
  python benchmarks/perf_model.py                      predictions with the lead ceilings (no GPU needed)
  python benchmarks/perf_model.py --json DIR/bench_gpu.json [--ncu DIR/ncu.csv] [--out DIR/perf_model.json]
                                                        predicted vs measured, ratio (target: within 20 %)
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import sass_count  # noqa: E402

#: the fused chain kernel takes n <= 16 per axis in bench_gpu.py (its FUSED_MAX_N)
FUSED_MAX_N = 16

#: Leads, used only where bench_gpu.json has no measurement: an H200 as KINDS.md saw it
#: (copy 4.3 TB/s through PyTorch) and the datasheets (132 SMs, 1.98 GHz boost; cuBLAS INT8
#: about 1.38 POP/s on GH200 by [2606.25453], 70 % of the 1979 TOP/s dense peak).
LEAD_CEILINGS = {
    "copy_Bps": 4.3e12,
    "int8_ops_per_s": 1.38e15,
    "sms": 132,
    "clock_hz": 1.98e9,
    "launch_s": 5e-6,
    "source": "leads (no measurement)",
}

RATIO_TARGET = 0.20


# ----- ceilings ---------------------------------------------------------------------------------


def ceilings_from(bench: dict | None) -> dict:
    """The model's ceilings: bench_gpu.json's measured ones where present, else :data:`LEAD_CEILINGS`."""
    c = dict(LEAD_CEILINGS)
    m = (bench or {}).get("ceilings") or {}
    src = []
    if (m.get("copy") or {}).get("Bps"):
        c["copy_Bps"] = float(m["copy"]["Bps"])
        src.append("copy")
    if m.get("int8_ops_per_s"):
        c["int8_ops_per_s"] = float(m["int8_ops_per_s"])
        src.append("int8")
    if m.get("sms"):
        c["sms"] = int(m["sms"])
    if m.get("clock_hz_from_ffma"):
        c["clock_hz"] = float(m["clock_hz_from_ffma"])
        src.append("clock")
    if src:
        c["source"] = "measured: " + ", ".join(src) + ("" if len(src) == 3 else "; leads for the rest")
    c["issue_warp_inst_per_s"] = c["sms"] * 4 * c["clock_hz"]
    return c


def kernel_time(bytes_: float, int8_ops: float, warp_inst: float, c: dict, launches: int = 1) -> dict:
    """``max(bytes / beta, ops / R8, inst / R_issue) + launches tau`` with the three terms."""
    tb = bytes_ / c["copy_Bps"]
    tw = int8_ops / c["int8_ops_per_s"]
    ti = warp_inst / c["issue_warp_inst_per_s"]
    bound = max((tb, "bytes"), (tw, "int8"), (ti, "issue"))
    return {"s": bound[0] + launches * c["launch_s"], "bytes_s": tb, "int8_s": tw, "issue_s": ti, "bound": bound[1]}


# ----- instruction counts: static estimates from the SASS, or ncu ------------------------------


def _reports(module: str, arch: str = "sm_90a") -> dict:
    from rnstensor.kernels import build

    texts = build.sass(build.compile_module(module, arch).path)
    return {name: sass_count.kernel_report(t) for name, t in texts.items()}


def op_costs(rep: dict) -> dict:
    """Instructions per multiply-add and per reduction, read off a kernel's innermost loops.

    ``mac``: the smallest (most unrolled) ``body / (FFMA + 4 IDP)`` of the
    innermost loops with FFMAs or dp4a and no reduction (the dot-product loops); ``red``: the median
    ``body / reductions`` of the innermost loops with centered reductions
    (:func:`sass_count.is_reduction`; the body carries the loads, the conversion
    and the store of that digit or plane too); ``plain``: the smallest body per FFMA-free loop
    iteration unrolled as its loads (the fp64 Horner loop of the decode).
    """
    macs, reds, plain = [], [], []
    for lp in rep["loops"]:
        if not lp["innermost"]:
            continue
        o, tot = lp["opcodes"], lp["counts"]["total"]
        if lp.get("reductions"):
            reds.append(tot / lp["reductions"])
        elif o.get("FFMA") or o.get("IDP"):  # a dp4a is four multiply-adds
            macs.append(tot / (o.get("FFMA", 0) + 4 * o.get("IDP", 0)))
        elif o.get("DFMA") or o.get("DADD") or o.get("DMUL"):
            n = max(o.get("LDG", 0), o.get("LDS", 0), 1)
            plain.append(tot / n)
    return {"mac": min(macs) if macs else None, "red": statistics.median(reds) if reds else None,
            "plain": min(plain) if plain else None}


_FIXED = 60  # per-entry instructions outside the loops (index math, table setup), a lead


def static_counts(arch: str = "sm_90a") -> dict:
    """Per-kernel static class counts and per-operation costs of the entry (and chain, if built) modules."""
    out = {}
    mods = ["entry"]
    try:
        from rnstensor.kernels import build

        if "chain" in build.MODULES:
            mods.append("chain")
    except Exception:
        pass
    for mod in mods:
        for name, rep in _reports(mod, arch).items():
            out[name] = {"counts": rep["counts"], "costs": op_costs(rep), "loops": len(rep["loops"])}
    return out


def drop_extend_ops(g: int, s: int) -> dict:
    """Per-entry multiply-adds and reductions of one RescaleBE drop of ``g`` moduli out of ``s`` + extension back to ``s``.

    Tables as ``rnstensor.kernels.tables.drop_tables``: ``g`` digits over the
    dropped moduli, ``nr = s - g`` remaining planes, ``m = nr`` digits of the
    result over them, ``ext = g`` restored planes (``T = s`` outputs).
    """
    nr = s - g
    m = nr
    ext = g
    macs = g * (g - 1) // 2 + nr * g + m * (m - 1) // 2 + ext * m
    return {"macs": macs, "reductions": g + nr + m + ext, "kept": s - ext}


def static_per_entry(kernel: str, costs: dict, **kw) -> float:
    """Static estimate of thread instructions per entry of a per-entry kernel (see the module docstring)."""
    mac, red = costs.get("mac") or 4.5, costs.get("red") or 30.0
    if kernel == "rns_drop_extend":
        o = drop_extend_ops(kw["g"], kw["s"])
        return _FIXED + o["macs"] * mac + o["reductions"] * red + o["kept"] * 10
    if kernel == "rns_decode_fp64":
        m = kw["s"]
        return _FIXED + m * (m - 1) // 2 * mac + m * red + m * (costs.get("plain") or 7.0)
    if kernel == "rns_decode_exact":
        # the fp64 decode's digits, then a multi-limb Horner and one rounding: about three times its plain steps
        m = kw["s"]
        return _FIXED + m * (m - 1) // 2 * mac + m * red + 3 * m * (costs.get("plain") or 7.0)
    if kernel == "rns_encode":
        return _FIXED + kw["s"] * (red + 3 * mac)  # per plane three FFMA over the pieces and one reduction
    raise ValueError(f"no static estimate for {kernel}")


def parse_ncu_csv(text: str) -> list[dict]:
    """Rows ``{'kernel', 'metric', 'value'}`` of ``ncu --csv --print-units base --metrics ...`` output.

    Skips ncu's ``==PROF==`` lines and the program's own output before the
    CSV header; values lose thousands separators.
    """
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        return []
    rows = []
    for r in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        try:
            v = float(str(r.get("Metric Value", "")).replace(",", ""))
        except ValueError:
            continue
        name = r.get("Kernel Name", "")
        rows.append({"kernel": name.split("(")[0].strip(), "metric": r.get("Metric Name", ""), "value": v,
                     "id": r.get("ID")})
    return rows


def ncu_per_entry(rows: list[dict], entries: int) -> dict:
    """``{kernel: {metric: mean per launch / entries}}`` (warp and thread instructions per entry)."""
    acc: dict = {}
    for r in rows:
        acc.setdefault(r["kernel"], {}).setdefault(r["metric"], []).append(r["value"])
    return {k: {m: statistics.mean(v) / entries for m, v in ms.items()} | {"launches": max(len(v) for v in ms.values())}
            for k, ms in acc.items()}


# ----- predictions --------------------------------------------------------------------------------


def _warp_inst(kernel: str, entries: float, counts: dict, **kw) -> tuple[float, str]:
    """Warp instructions of one launch over ``entries`` entries: ncu's count per entry, else the static estimate / 32."""
    n = (counts.get("ncu") or {}).get(kernel, {})
    if "smsp__inst_executed.sum" in n:
        return n["smsp__inst_executed.sum"] * entries, "ncu"
    st = (counts.get("static") or {}).get(kernel)
    if st is None:
        return 0.0, "none"
    try:
        return static_per_entry(kernel, st["costs"], **kw) / 32 * entries, "static"
    except (ValueError, KeyError):
        return 0.0, "none"


def predict_chain(row: dict, c: dict, counts: dict) -> dict:
    """Predicted seconds of the chain variants of one bench_gpu.json chain row (fused, unfused steps, composed)."""
    n, dofs, s = row["n"], row["dofs"], row.get("s", 15)
    drops = row.get("drops") or []
    ops_per_product = 2.0 * n * s * dofs
    parts = {}
    wi, src = _warp_inst("rns_encode", dofs, counts, s=s)
    parts["encode"] = kernel_time(dofs * (8 + s), 0, wi, c) | {"inst_src": src}
    for i, g in enumerate(drops):
        wi_p, src_p = _warp_inst("rns_product_n8" if n <= 8 else f"rns_product_n{min(64, 1 << (n - 1).bit_length())}",
                                 dofs, counts)
        parts[f"product{i}"] = kernel_time(dofs * 2 * s, ops_per_product, wi_p, c) | {"inst_src": src_p}
        if g:
            wi, src = _warp_inst("rns_drop_extend", dofs, counts, g=g, s=s)
            parts[f"drop_extend{i}"] = kernel_time(dofs * 2 * s, 0, wi, c) | {"inst_src": src}
    wi, src = _warp_inst("rns_decode_fp64", dofs, counts, s=s)
    parts["decode"] = kernel_time(dofs * (s + 8), 0, wi, c) | {"inst_src": src}
    steps = sum(p["s"] for p in parts.values())
    floor = max(sum(p["bytes_s"] for p in parts.values()), sum(p["int8_s"] for p in parts.values()),
                sum(p["issue_s"] for p in parts.values()))
    out = {"steps": steps, "unfused": steps, "parts": parts, "floor_unfused": floor}
    # composed: per product an encode, the product and an fp64 decode, on all s moduli
    comp = 0.0
    for _ in drops:
        comp += parts["encode"]["s"] + parts["product0"]["s"] + parts["decode"]["s"]
    out["composed"] = comp
    spec = (counts.get("fused_per_dof") or {}).get(n)
    if spec and "rns_chain_fused" not in (counts.get("ncu") or {}):
        # the plan's specialized build: instructions per DoF read off its SASS (benchmarks/chain_sass.py)
        wi, src = spec / 32 * dofs, "sass-specialized"
    else:
        wi, src = _warp_inst("rns_chain_fused", dofs, counts)
    fused = kernel_time(16.0 * dofs, ops_per_product * len(drops), wi, c)
    out["fused"] = fused["s"]
    out["fused_parts"] = fused | {"inst_src": src}
    out["floor_fused"] = max(fused["bytes_s"], fused["int8_s"], fused["issue_s"])
    return out


def dgemm_phases(N: int, s: int, c: dict, counts: dict, cplx: bool = False) -> dict:
    """Predicted phase seconds of the public ``rt.dgemm`` on device arrays, N x N x N (ZGEMM with ``cplx``).

    Bytes per element of an N x N operand, as rnstensor.gemm runs it on the
    device (the TN layout): the exponent scan (isfinite 8 in 1 out, |x| 8 in 8
    out, the row maximum 8 in) per operand and the transposing copy of b (16);
    encode (8 in, s out) per operand; products: s (N^2 + N^2) in and s N^2
    out, ``2 s N^3`` INT8 work; the exact decode (s in, the exponent of every
    entry 8 out and 16 for its runs, 8 out) and the transposing copy into C
    (16). Complex: float passes on 16-byte elements, two stacked encodes of
    both parts, 3 products (3M) plus the two residue sums inside product_3m,
    two exact decodes per alpha part and the complex store (32).
    """
    n2 = float(N) * N
    if not cplx:
        enc_b = n2 * (2 * (9 + 16 + 8) + 16 + 2 * (8 + s))
        prod_b = n2 * 3 * s
        w = 2.0 * s * N**3
        dec_b = n2 * (s + 24 + 8 + 16)
        ndec, nenc = 1, 2
    else:
        enc_b = n2 * (2 * (17 + 32 + 8) + 32 + 2 * 2 * (8 + s))
        prod_b = n2 * (3 * 3 * s + 2 * 3 * s)
        w = 3 * 2.0 * s * N**3
        dec_b = n2 * (2 * (s + 24 + 8) + 32)
        ndec, nenc = 2, 4
    wi_e, se = _warp_inst("rns_encode", n2 * nenc, counts, s=s)
    wi_d, sd = _warp_inst("rns_decode_exact", n2 * ndec, counts, s=s)
    ph = {
        "encode": kernel_time(enc_b, 0, wi_e, c, launches=6 + 2 * nenc) | {"inst_src": se},
        "products": kernel_time(prod_b, w, 0, c, launches=3 if cplx else 1),
        "decode": kernel_time(dec_b, 0, wi_d, c, launches=2 * ndec + 1) | {"inst_src": sd},
    }
    total = sum(p["s"] for p in ph.values())
    floor = max(sum(p["bytes_s"] for p in ph.values()), w / c["int8_ops_per_s"], sum(p["issue_s"] for p in ph.values()))
    return {"phases": ph, "total": total, "floor": floor}


# ----- compare with measurements ------------------------------------------------------------------


def compare(bench: dict, counts: dict) -> dict:
    """Predicted vs measured for every timed row of bench_gpu.json: ``rows`` of (what, measured, predicted, ratio)."""
    c = ceilings_from(bench)
    rows = []
    unmodelled: list = []  # measured phases the model has no term for

    def add(what, measured, predicted, floor=None):
        if measured and predicted:
            rows.append({"what": what, "measured_s": measured, "predicted_s": predicted,
                         "ratio": measured / predicted, "floor_s": floor,
                         "over_floor": (measured / floor) if floor else None})

    for row in bench.get("chain") or []:
        if "dofs" not in row or "error" in row:
            continue
        p = predict_chain(row, c, counts)
        for v in ("fused", "unfused", "steps", "composed"):
            m = (row.get(v) or {}).get("median_s")
            fl = p["floor_fused"] if v == "fused" else p["floor_unfused"]
            add(f"chain n={row['n']} {v}", m, p[v], fl)
        ks = (row.get("steps") or {}).get("kernels_s") or {}
        for k, t in ks.items():
            if k in p["parts"]:
                q = p["parts"][k]
                add(f"chain n={row['n']} kernel {k} ({q['bound']}, {q.get('inst_src', '-')})", t, q["s"],
                    max(q["bytes_s"], q["int8_s"], q["issue_s"]))
    for key, cplx in (("dgemm", False), ("zgemm", True)):
        for row in bench.get(key) or []:
            if "s" not in row or row.get("api") or "skipped" in row:
                continue
            m = row.get("mma") or {}
            if "median_s" not in m:
                continue
            p = dgemm_phases(row["N"], row["s"], c, counts, cplx)
            add(f"{key} N={row['N']} s={row['s']}", m["median_s"], p["total"], p["floor"])
            for ph, t in (m.get("phases_s") or {}).items():
                if ph in p["phases"]:  # the model's phases; the rest (the scan, "other") it does not predict
                    add(f"{key} N={row['N']} s={row['s']} {ph}", t, p["phases"][ph]["s"])
                else:
                    unmodelled.append({"what": f"{key} N={row['N']} s={row['s']} {ph}", "measured_s": t})
    within = [r for r in rows if abs(r["ratio"] - 1) <= RATIO_TARGET]
    return {"ceilings": c, "rows": rows, "within_target": len(within), "compared": len(rows),
            "unmodelled": unmodelled}


def predictions_only(counts: dict, c: dict | None = None) -> dict:
    """Predictions for the issue's sizes with the lead ceilings (what this prints without a GPU run)."""
    c = c or ceilings_from(None)
    import rnstensor as rt
    import numpy as np

    rng = np.random.default_rng(8)
    out = {"ceilings": c, "chain": [], "dgemm": [], "zgemm": []}
    for n in (4, 8, 16, 32, 64, 128):
        ops = [rng.uniform(-1, 1, (n, n)) for _ in range(3)]
        plan = rt.plan_chain(ops, [0, 1, 2], method="rescale_be")
        dofs = ((1 << 24) // n**3) * n**3
        p = predict_chain({"n": n, "dofs": dofs, "s": 15, "drops": [len(st.dropped) for st in plan.schedule.steps]}, c, counts)
        out["chain"].append({"n": n, "dofs": dofs, "drops": list(plan.drops), **{k: p[k] for k in ("steps", "composed", "fused", "floor_unfused", "floor_fused")},
                             "bounds": {k: v["bound"] for k, v in p["parts"].items()}})
    for N in (4096, 8192, 16384):
        for s in (8, 12, 14, 16):
            p = dgemm_phases(N, s, c, counts)
            out["dgemm"].append({"N": N, "s": s, "total": p["total"], "tflops": 2.0 * N**3 / p["total"] / 1e12,
                                 "phases": {k: v["s"] for k, v in p["phases"].items()}})
        p = dgemm_phases(N, 14, c, counts, cplx=True)
        out["zgemm"].append({"N": N, "s": 14, "total": p["total"], "tflops": 8.0 * N**3 / p["total"] / 1e12})
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="bench_gpu.json of a GPU run")
    ap.add_argument("--ncu", help="ncu --csv output of the bench_gpu.py --probe run")
    ap.add_argument("--probe-json", help="the probe's own JSON line (dofs); default 2^20 DoFs")
    ap.add_argument("--out", help="write the comparison here (JSON)")
    ap.add_argument("--arch", default="sm_90a")
    args = ap.parse_args(argv)
    counts: dict = {}
    try:
        counts["static"] = static_counts(args.arch)
    except Exception as exc:  # no NVRTC / cuobjdump: the model runs without instruction terms
        print(f"static SASS counts unavailable: {type(exc).__name__}: {exc}")
    try:  # the fused chain's specialized builds (NVRTC, a few seconds each): instructions per DoF
        import chain_sass

        counts["fused_per_dof"] = {n: chain_sass.measure(n)["specialized"]["instructions_per_dof"] for n in (4, 8, 16)}
        print("fused chain, specialized build, instructions per DoF: "
              + ", ".join(f"n={n}: {v:.0f}" for n, v in counts["fused_per_dof"].items()))
    except Exception as exc:
        print(f"fused chain SASS counts unavailable: {type(exc).__name__}: {exc}")
    if args.ncu and os.path.exists(args.ncu):
        entries = 1 << 20
        if args.probe_json and os.path.exists(args.probe_json):
            try:
                entries = int(json.load(open(args.probe_json)).get("dofs", entries))
            except Exception:
                pass
        counts["ncu"] = ncu_per_entry(parse_ncu_csv(open(args.ncu).read()), entries)
    for k in ("rns_drop_extend", "rns_decode_fp64", "rns_encode", "rns_chain_fused"):
        st = (counts.get("static") or {}).get(k)
        nc = (counts.get("ncu") or {}).get(k)
        if st or nc:
            est = ""
            if st and k == "rns_drop_extend":
                est = f"; static estimate per entry (g=7 of 15): {static_per_entry(k, st['costs'], g=7, s=15):.0f} thread instr"
            line = f"{k}: static {st['counts']['total'] if st else '-'} instr in SASS{est}"
            if nc:
                line += f"; ncu per entry: {nc.get('smsp__inst_executed.sum', float('nan')) * 32:.0f} thread-slot instr (warp x 32)"
            print(line)
    if args.json and os.path.exists(args.json):
        bench = json.load(open(args.json))
        res = compare(bench, counts)
        c = res["ceilings"]
        print(f"ceilings ({c['source']}): copy {c['copy_Bps'] / 1e12:.2f} TB/s, INT8 {c['int8_ops_per_s'] / 1e12:.0f} TOP/s, "
              f"issue {c['issue_warp_inst_per_s'] / 1e12:.2f} T warp-instr/s")
        print(f"{'what':<58} {'measured':>10} {'model':>10} {'meas/model':>10} {'meas/floor':>10}")
        for r in res["rows"]:
            of = f"{r['over_floor']:.2f}" if r.get("over_floor") else "-"
            print(f"{r['what']:<58} {r['measured_s'] * 1e3:>8.3f}ms {r['predicted_s'] * 1e3:>8.3f}ms {r['ratio']:>10.2f} {of:>10}")
        for r in res["unmodelled"]:
            print(f"{r['what']:<58} {r['measured_s'] * 1e3:>8.3f}ms {'(not modelled)':>10}")
        print(f"within {RATIO_TARGET:.0%}: {res['within_target']} of {res['compared']}")
    else:
        res = predictions_only(counts)
        c = res["ceilings"]
        print(f"no GPU measurement given: predictions with {c['source']} (copy {c['copy_Bps'] / 1e12:.1f} TB/s, "
              f"INT8 {c['int8_ops_per_s'] / 1e12:.0f} TOP/s, issue {c['issue_warp_inst_per_s'] / 1e12:.2f} T warp-instr/s)")
        for r in res["chain"]:
            print(f"chain n={r['n']:<4} steps {r['dofs'] / r['steps'] / 1e9:6.2f} GDoF/s  composed {r['dofs'] / r['composed'] / 1e9:6.2f}  "
                  + (f"fused {r['dofs'] / r['fused'] / 1e9:6.2f}" if r["n"] <= FUSED_MAX_N else "fused      -")
                  + f"  (floor unfused {r['dofs'] / r['floor_unfused'] / 1e9:.2f}); bounds {r['bounds']}")
        for r in res["dgemm"]:
            print(f"dgemm N={r['N']:<6} s={r['s']:<3} {r['tflops']:7.1f} TFLOP/s  phases ms " +
                  "/".join(f"{v * 1e3:.2f}" for v in r["phases"].values()))
        for r in res["zgemm"]:
            print(f"zgemm N={r['N']:<6} s={r['s']:<3} {r['tflops']:7.1f} TFLOP/s")
    res["counts"] = counts
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return res


if __name__ == "__main__":
    main()
