"""product_wgmma.cu (Hopper wgmma, sm_90a only) without a GPU: its SASS and resources, and its host SIMT emulation.

The module compiles with NVRTC for sm_90a (and is refused for other archs);
its SASS holds Hopper's integer warpgroup MMA (IGMMA) and no local memory.
wgmma_host.cpp runs the kernel's own source on CPU threads with software
cp.async and wgmma: the descriptor encoding, the shared-memory tile layout, the
pipeline's waits and barriers, the accumulator fragment layout, the fold (every
2 k-tiles in this build instead of 2047) and the epilogue execute as written,
with the asynchronous work completing either at issue (EAGER) or only at its
wait (LAZY). Results are compared bit for bit with rnstensor.arith.

Not covered here (only a GPU shows it): that the hardware reads the descriptor
and the no-swizzle layout as the PTX ISA describes (tests/gpu/test_cuda_wgmma.py),
and the kernel's speed (benchmarks/bench_gpu_product.py).
"""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

from rnstensor import arith
from rnstensor.kernels import build, tables
from residues import needs_cuobjdump, needs_nvrtc, random_planes
from sanitize import SANITIZE


KERNELS = {"rns_gemm_wgmma_n64": 64, "rns_gemm_wgmma_n128": 128}
EAGER, LAZY = 0, 1




@pytest.fixture(scope="module")
def built(tmp_path_factory):
    # the session's kernel cache, shared with tests/test_kernels.py
    cache = tmp_path_factory.getbasetemp() / "rnstensor-kernel-cache"
    cache.mkdir(exist_ok=True)
    return build.compile_module("product_wgmma", "sm_90a", cache=cache)


# ----- build, SASS, resources -------------------------------------------------------------------------


def test_module_is_sm90a_only():
    assert build.module_archs("product_wgmma") == ("sm_90a",)
    assert "product_wgmma" in build.modules_for("sm_90a")
    for arch in ("sm_80", "sm_89", "sm_90"):
        assert "product_wgmma" not in build.modules_for(arch)
        with pytest.raises(ValueError, match="product_wgmma.*sm_90a only"):
            build.compile_module("product_wgmma", arch)
    assert set(KERNELS) <= set(build.hot_kernels("sm_90a"))
    assert not set(KERNELS) & set(build.hot_kernels("sm_80"))


@needs_nvrtc
def test_ptxas_report(built):
    log = built.log or ""
    for k in KERNELS:
        assert f"Compiling entry function '{k}' for 'sm_90a'" in log or not log  # empty log: a cache hit
    for ln in log.splitlines():
        if "spill" in ln:
            assert "0 bytes spill stores, 0 bytes spill loads" in ln, ln.strip()


@needs_nvrtc
@needs_cuobjdump
def test_sass_uses_wgmma(built):
    code = build.sass(built.path, tuple(KERNELS))
    for k, bn in KERNELS.items():
        assert k in code, f"{k} missing from the product_wgmma cubin"
        lines = code[k].splitlines()
        igmma = [ln for ln in lines if "IGMMA" in ln]
        # two m64nBNk32 steps per 64-byte k-tile, all signed 8-bit with s32 accumulation
        assert len(igmma) >= 2, f"{k}: no IGMMA"
        assert all(f"IGMMA.64x{bn}x32.S8.S8" in ln for ln in igmma), igmma[:2]
        assert any("WARPGROUP.ARRIVE" in ln for ln in lines), f"{k}: no wgmma.fence"
        assert any("WARPGROUP.DEPBAR" in ln for ln in lines), f"{k}: no wgmma.wait_group"
        assert any("LDGSTS.E.BYPASS.128" in ln for ln in lines), f"{k}: no 16-byte cp.async.cg"
        assert not any("IMMA" in ln and "IGMMA" not in ln for ln in lines), f"{k}: mma.sync left in"
        # the int8 epilogue: no 32-bit global stores of accumulators (STG.E.128 of the int8 tile is fine)
        assert not any(re.search(r"\bSTG\.E(\.STRONG\.\w+)?\s", ln) for ln in lines), f"{k}: 32-bit global stores"


@needs_nvrtc
@needs_cuobjdump
def test_resources(built):
    res = build.resource_usage(built.path)
    for k in KERNELS:
        r = res[k]
        assert r.local == 0 and r.stack == 0, f"{k}: {r}"
        assert r.registers <= 255
        assert r.shared <= 48 * 1024 + 1024, f"{k}: static shared memory over 48 KiB needs an opt-in: {r}"
    # BN = 64 keeps two blocks of 256 threads per SM (launch bounds)
    assert res["rns_gemm_wgmma_n64"].registers <= 128


def test_fold_period_keeps_int32_exact():
    src = (build.source_dir() / "product_wgmma.cu").read_text()
    period = int(re.search(r"#define RNS_WG_FOLD_TILES (\d+)", src).group(1))
    bk = int(re.search(r"#define RNS_WG_BK (\d+)", src).group(1))
    # residues <= 128 in magnitude: products <= 2^14; a folded accumulator is <= 128
    assert period * bk * 2**14 + 128 < 2**31 <= (period + 1) * bk * 2**14 + 128


# ----- host SIMT emulation ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    try:
        lib = ctypes.CDLL(str(build.wgmma_library(cache=tmp_path_factory.mktemp("wgmma-host"), sanitize=SANITIZE)))
    except build.KernelBuildError as exc:  # pragma: no cover - CI images have g++ >= 11
        pytest.skip(f"no C++20 host compiler for the SIMT build of product_wgmma.cu: {exc}")
    assert lib.emu_wgmma_fold_tiles() == 2
    return lib


def _p(a):
    return np.asarray(a).ctypes.data_as(ctypes.c_void_p)


def run_wgmma(lib, bn, X, A, moduli, mode=EAGER, skew=0):
    """Launch rns_gemm_wgmma_n<bn> on (L, M, K) x (L, N, K) as the backend does; the (L, M, N) int8 result."""
    L, M, K = X.shape
    N = A.shape[1]
    X, A = np.ascontiguousarray(X), np.ascontiguousarray(A)
    out = np.full((L, M, N), 99, np.int8)  # 99 is no residue: an entry the kernel misses shows
    u = ctypes.c_uint
    consts = [_p(c) for c in tables.reduce_consts(tuple(moduli))]
    rc = lib.emu_gemm_wgmma(bn, mode, skew, u(-(-M // 128)), u(-(-N // bn)), u(L), _p(X), _p(A), _p(out), M, N, K,
                            ctypes.c_int64(M * K), ctypes.c_int64(N * K), ctypes.c_int64(M * N), *consts)
    assert rc == 0, f"emulation error {rc} (1: bad descriptor, 2: async work left, 3: bad cp.async)"
    return out


def reference(X, A, moduli):
    return arith.product_ref(A, X, moduli, 1)  # out[l, m, n] = [sum_k A[l, n, k] X[l, m, k]]_p


@pytest.mark.parametrize("mode", [EAGER, LAZY], ids=["eager", "lazy"])
@pytest.mark.parametrize(
    "bn, M, N, K",
    [
        (128, 128, 128, 64),  # one full tile, one k-tile
        (128, 200, 150, 80),  # ragged M and N, a partial k-tile (80 = 64 + 16)
        (64, 130, 70, 272),  # K > 255: the int32 epilogue; 5 k-tiles fold twice (every 2 here)
        (64, 64, 64, 16),  # one k-chunk: most of the tile zero-filled
        (128, 257, 16, 48),  # N = 16 < BN (byte stores), three row tiles
    ],
)
def test_kernel_matches_reference(emu, bn, M, N, K, mode):
    moduli = (256, 255, 7, 2)
    rng = np.random.default_rng(M * 1000 + N + K)
    X = random_planes(rng, moduli, (M, K))
    A = random_planes(rng, moduli, (N, K))
    assert np.array_equal(run_wgmma(emu, bn, X, A, moduli, mode), reference(X, A, moduli))


@pytest.mark.parametrize("K", [240, 256])  # 240 <= 255: the float epilogue at its largest sums; 256: int32 path
@pytest.mark.parametrize("edge", ["min", "max", "mixed"])
def test_kernel_range_edges(emu, K, edge):
    # every residue at +-floor(p/2): the largest accumulators; with the fold every 2 k-tiles (128 terms)
    moduli = (256, 255, 253, 3)
    rng = np.random.default_rng(K)
    X = random_planes(rng, moduli, (128, K), edge)
    A = random_planes(rng, moduli, (64, K), edge)
    assert np.array_equal(run_wgmma(emu, 64, X, A, moduli, LAZY), reference(X, A, moduli))


def test_kernel_folds_long_contractions(emu):
    # 16 k-tiles at the range edge fold 8 times (RNS_WG_FOLD_TILES = 2 in this build); the device
    # period (2047 tiles) keeps int32 exact between folds (test_fold_period_keeps_int32_exact)
    moduli = (256, 255)
    K = 64 * 15 + 48
    X = random_planes(None, moduli, (64, K), "min")
    A = random_planes(None, moduli, (128, K), "min")
    assert np.array_equal(run_wgmma(emu, 128, X, A, moduli, EAGER), reference(X, A, moduli))


def test_output_plane_alignment(emu):
    # N % 16 != 0: 16-byte stores only where a chunk is whole and aligned, bytes elsewhere
    moduli = (251, 241)
    rng = np.random.default_rng(3)
    X = random_planes(rng, moduli, (129, 32))
    A = random_planes(rng, moduli, (100, 32))
    assert np.array_equal(run_wgmma(emu, 64, X, A, moduli, LAZY), reference(X, A, moduli))


def test_lazy_mode_catches_a_broken_pipeline(emu):
    # the emulation is sensitive: a cp.async wait one group short reads stages before they land
    moduli = (256, 255)
    rng = np.random.default_rng(9)
    X = random_planes(rng, moduli, (128, 320))
    A = random_planes(rng, moduli, (64, 320))
    ref = reference(X, A, moduli)
    assert np.array_equal(run_wgmma(emu, 64, X, A, moduli, EAGER, skew=1), ref)  # eager copies hide it
    assert not np.array_equal(run_wgmma(emu, 64, X, A, moduli, LAZY, skew=1), ref)


# ----- the dispatch rule (CudaBackend product_engine='auto'; no CuPy needed) -------------------------


def test_choose_product_engine():
    import math

    from rnstensor.backends.cuda import PRODUCT_THRESHOLDS, choose_product_engine, cublas_fits, wgmma_fits

    big = dict(pre=16384, n_in=16384, post=1, n_out=16384, L=15)
    assert choose_product_engine("sm_90a", **big) == "wgmma"
    assert choose_product_engine("sm_89", **big) == "cublas"  # no wgmma off Hopper
    assert choose_product_engine("sm_90", **big) == "cublas"  # plain sm_90 has no wgmma either
    assert choose_product_engine("sm_90a", **{**big, "n_in": 16376}) == "cublas"  # n_in % 16 != 0, % 4 == 0
    assert choose_product_engine("sm_90a", **{**big, "n_in": 16383}) == "mma"  # neither layout
    assert choose_product_engine("sm_90a", **{**big, "post": 2}) == "mma"  # a middle axis
    assert choose_product_engine("sm_90a", pre=1000, n_in=8, post=1, n_out=8, L=15) == "mma"  # tiny operator
    # overrides: math.inf switches an engine off; lowered thresholds switch it on
    assert choose_product_engine("sm_90a", **big, thresholds={"wgmma_min_macs": math.inf}) == "cublas"
    assert choose_product_engine("sm_90a", pre=256, n_in=64, post=1, n_out=64, L=1,
                                 thresholds={"wgmma_min_macs": 0, "wgmma_min_k": 0}) == "wgmma"
    with pytest.raises(ValueError, match="unknown keys"):
        choose_product_engine("sm_90a", **big, thresholds={"min_macs": 1})
    assert set(PRODUCT_THRESHOLDS) == {f"{e}_min_{w}" for e in ("wgmma", "cublas") for w in ("macs", "n_out", "k")}
    assert wgmma_fits("sm_90a", 1, 16, 1, 1, 1) and not wgmma_fits("sm_90a", 1, 16, 1, 1, 70000)
    assert cublas_fits(1, 8, 12, 5) and not cublas_fits(2, 8, 12, 5) and not cublas_fits(3, 131072, 1, 5)


def test_thresholds_are_marked_unmeasured():
    # the table must say it is a guess until the GPU benchmark replaces it
    src = (build.source_dir().parent / "backends" / "cuda.py").read_text()
    i = src.index("PRODUCT_THRESHOLDS: dict")
    assert "TO BE MEASURED ON THE GPU" in src[i - 1200 : i]


# ----- the GPU benchmark script imports and plans without a GPU ----------------------------------------


def test_bench_gpu_product_imports_without_gpu():
    import importlib.util

    path = build.source_dir().parents[1] / "benchmarks" / "bench_gpu_product.py"
    spec = importlib.util.spec_from_file_location("bench_gpu_product", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # no CuPy import at module level
    assert callable(mod.main)
    shapes = mod.plan_shapes()
    assert [s.floor_s() for s in shapes] == sorted(s.floor_s() for s in shapes)  # cheapest first (the budget)
    labels = {s.label for s in shapes}
    assert {"gemm 1024", "gemm 16384", "mode n=8", "mode n=128"} <= labels
    assert all(s.L == 15 for s in shapes)
    row = dict(shapes[0].as_dict(), floor_s=1e-3, mma=dict(s=2e-3, tops=1.0, of_floor=0.5, equal_mma=True), wgmma=None)
    text = mod._table({"device": {"name": "x", "arch": "sm_90a"}, "shapes": [row], "skipped": []})
    assert "n/a" in text and "50.0%" in text and "ok" in text
