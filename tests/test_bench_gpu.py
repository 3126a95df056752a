"""The GPU benchmark's bookkeeping (benchmarks/bench_gpu.py, bench_gpu_product.py): what counts as a failure, the
infeasible points it skips, and the short table device_check.sh prints last. No GPU needed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import rnstensor as rt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_gpu  # noqa: E402
import bench_gpu_product  # noqa: E402


def test_failures_are_errors_not_skips():
    res = {
        "chain": [{"n": 8, "fused": {"median_s": 1.0}}, {"n": 4, "skipped": "budget"}],
        "dgemm": [{"N": 64, "s": 8, "skipped": "infeasible: ..."}, {"N": 64, "s": 12, "mma": {"error": "KeyError: 'x'"}}],
        "ceilings": {"int8_skipped": "the CuPy stand-in", "int8_error": "RuntimeError: no cuBLAS"},
        "fem_error": "ValueError: boom",
    }
    assert sorted(bench_gpu.failures(res)) == sorted([
        "dgemm.1.mma.error: KeyError: 'x'", "ceilings.int8_error: RuntimeError: no cuBLAS", "fem_error: ValueError: boom"])
    assert bench_gpu.failures({"chain": [{"n": 8, "skipped": "budget"}]}) == []


@pytest.mark.parametrize("key, k, s", [("dgemm", 4096, 8), ("dgemm", 4096, 12), ("zgemm", 4096, 14), ("dgemm", 320, 8)])
def test_infeasible_points_match_the_library(key, k, s):
    # the benchmark skips exactly the points the public call refuses, with the reason
    why = bench_gpu._infeasible(key, k, s)
    x = np.ones((2, k)) + (1j if key == "zgemm" else 0)
    f = rt.zgemm if key == "zgemm" else rt.dgemm
    try:
        f(x, x.T.copy(), moduli=s)
        refused = None
    except rt.PlanError as exc:
        refused = str(exc)
    assert (why is None) == (refused is None), (why, refused)
    if why:
        assert "min_bits" in why and str(s) in why


def test_summary_table_and_json(tmp_path):
    res = {"ceilings": {"copy": {"Bps": 3.2e12}, "int8_ops_per_s": 1.2e15, "ffma_rate": {"thread_ops_per_s": 6e13}},
           "chain": [{"n": 8, "dofs": 1 << 20, "fused": {"gdofs": 12.5}, "f64_einsum": {"gdofs": 3.0}}],
           "dgemm": [{"N": 4096, "s": 14, "f64": {"tflops": 50.0}, "mma": {"tflops": 80.0, "vs_f64": 1.6}},
                     {"N": 8192, "s": 8, "skipped": "infeasible"}],
           "accuracy_phi4": {"cupy_f64": {"normwise": 8e-16, "max_ulp": 600.0}},
           "zgemm_error": "RuntimeError: x"}
    (tmp_path / "bench_gpu.json").write_text(json.dumps(res))
    out = bench_gpu.summary(str(tmp_path))
    text = "\n".join(out["lines"])
    assert "copy 3.20 TB/s" in text and "cuBLAS INT8 1200 TOP/s" in text
    assert "chain n=8" in text and "fused 12.50" in text and "f64_einsum 3.00" in text
    assert "dgemm N=4096   s=14     80.0 TFLOP/s = 1.60x CuPy (50.0)" in text
    assert "FAILED zgemm_error: RuntimeError: x" in text
    assert json.loads((tmp_path / "summary.json").read_text())["failures"] == ["zgemm_error: RuntimeError: x"]
    (tmp_path / "empty").mkdir()
    assert bench_gpu.summary(str(tmp_path / "empty"))["lines"][0].startswith("no bench_gpu.json")


def test_product_bench_mismatches():
    res = {"shapes": [{"label": "gemm 1024", "mma": {"equal_mma": True}, "wgmma": {"equal_mma": False},
                       "cublas": {"tops": 1.0}}, {"label": "mode n=8", "mma": {"equal_mma": True}, "wgmma": None}]}
    assert bench_gpu_product.mismatches(res) == ["gemm 1024 wgmma"]


import bench_gpu_peers  # noqa: E402


def test_verdicts_pick_the_fastest_call_per_promise():
    def row(call, t, cr, comp, worse, case="dgemm", size=4096, data="phi4"):
        return {"case": case, "size": size, "data": data, "call": call, "median_s": t, "cr": cr,
                "componentwise": comp, "worse_than_native": worse}

    rows = [row("native", 1.0, 0.3, 1e-15, 0.0), row("rt fast", 0.5, 0.01, 1e-9, 0.4),  # fast but inaccurate
            row("rt default", 0.8, 0.9, 5e-16, 0.0005), row("rt auto", 1.6, 1.0, 1e-16, 0.0),
            row("cuBLAS emulation eager", 0.7, 0.2, 2e-15, 0.01),  # worse than native in its worst entry
            {"case": "dgemm", "size": 4096, "data": "phi4", "call": "nvmath", "skipped": "not installed"},
            row("native", 2.0, 0.5, 1e-16, 0.0, data="uniform"), row("rt auto", 1.0, 1.0, 1e-17, 0.0, data="uniform")]
    table = {(v["data"]): v for v in bench_gpu_peers.verdicts(rows)}
    assert table["phi4"]["float64"] == {"call": "rt default", "speedup_vs_native": 1.0 / 0.8}
    assert table["phi4"]["correctly_rounded"] == {"call": "rt auto", "speedup_vs_native": 1.0 / 1.6}
    assert table["uniform"]["float64"]["call"] == "rt auto" and table["uniform"]["float64"]["speedup_vs_native"] == 2.0
    text = bench_gpu_peers.format_verdicts(list(table.values()))
    assert "rt default (1.25x native)" in text and "rt auto (0.62x native)" in text
    # no native row: no verdict (nothing to compare with)
    assert bench_gpu_peers.verdicts([row("rt auto", 1.0, 1.0, 0.0, 0.0)]) == []


def test_accuracy_of_against_the_exact_product():
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((6, 50)), rng.standard_normal((50, 5))
    refs, absprod = bench_gpu_peers._references(A, B)
    native = bench_gpu_peers.accuracy_of(A @ B, refs, absprod, None)
    cr = bench_gpu_peers.accuracy_of(rt.dgemm(A, B, moduli="auto"), refs, absprod, native["err"])
    assert cr["cr"] == 1.0 and cr["worse_than_native"] == 0.0 and cr["componentwise"] <= native["componentwise"]
    off = (A @ B) * (1 + 2.0**-40)
    bad = bench_gpu_peers.accuracy_of(off, refs, absprod, native["err"])
    assert bad["cr"] == 0.0 and bad["worse_than_native"] == 1.0 and bad["componentwise"] > 1e-13
    za = A[:, :10] + 1j * A[:, 10:20]
    zb = B[:10] - 1j * B[10:20]
    zrefs, zabs = bench_gpu_peers._references(za, zb)
    assert bench_gpu_peers.accuracy_of(rt.zgemm(za, zb, moduli="auto"), zrefs, zabs, None)["cr"] == 1.0


def test_the_chains_exact_block_is_exact():
    rng = np.random.default_rng(4)
    X, A = rng.standard_normal((5, 3, 3, 3)), rng.standard_normal((3, 3))
    saved = bench_gpu_peers.CHAIN_BLOCK
    bench_gpu_peers.CHAIN_BLOCK = (2, 5)
    try:
        refs, _ = bench_gpu_peers._exact_chain_block(X, A)
        y = rt.einsum("eijk,ai,bj,ck->eabc", X, A, A, A, moduli="auto")
        block = bench_gpu_peers._result_block("eijk,ai,bj,ck->eabc", (X, A), y)
        assert bench_gpu_peers._references_of("eijk,ai,bj,ck->eabc", (X, A))[0][0].rounded.shape == (2, 5)
    finally:
        bench_gpu_peers.CHAIN_BLOCK = saved
    assert np.array_equal(refs[0].rounded, block)


def test_peer_sizes_follow_the_scale():
    assert bench_gpu_peers.gemm_sizes(1.0) == [2048, 4096, 8192, 16384]
    assert bench_gpu_peers.gemm_sizes(1e-5)[0] == 32 and len(bench_gpu_peers.gemm_sizes(1e-5)) == 4
