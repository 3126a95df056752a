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
