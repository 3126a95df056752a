"""product.cu run on the CPU (simt_host.cpp: one thread per CUDA thread, software MMA) against the numpy reference.

The device code's tile loaders (contiguous, 8-byte vector and strided), the
mma.sync fragment packing, the int32 fold of long contractions, both epilogue
reductions and the fused 3M combination execute as written; only the tensor
core is emulated (after the PTX ISA fragment layout of m16n8k32 .s8), and the
fold runs every 2 k-steps instead of 4095 so that short contractions fold.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from rnstensor import arith
from rnstensor.basis import int8_pool
from rnstensor.kernels import build, tables
from residues import random_planes
from sanitize import SANITIZE

POOL = int8_pool()


@pytest.fixture(scope="module")
def simt(tmp_path_factory):
    try:
        return ctypes.CDLL(str(build.simt_library(cache=tmp_path_factory.mktemp("simt"), sanitize=SANITIZE)))
    except build.KernelBuildError as exc:  # pragma: no cover - CI images have g++ >= 11
        pytest.skip(f"no C++20 host compiler for the SIMT build of product.cu: {exc}")


def _p(a):
    return np.asarray(a).ctypes.data_as(ctypes.c_void_p)


def _run(simt, bn, X, A, moduli, three_m=None):
    L, pre, n_in, post = X.shape
    n_out = A.shape[1]
    out = np.zeros((L, pre, n_out, post), np.int8)
    M = pre * post
    grid = [ctypes.c_uint(-(-M // 128)), ctypes.c_uint(-(-n_out // bn)), ctypes.c_uint(L)]
    dims = [pre, n_in, post, n_out, ctypes.c_int64(pre * n_in * post), ctypes.c_int64(pre * n_out * post)]
    consts = [_p(c) for c in tables.reduce_consts(tuple(moduli))]
    if three_m is None:
        assert simt.emu_product(bn, *grid, _p(X), _p(A), _p(out), *dims, *consts) == 0
        return out
    Xim, Aim = three_m
    Xs = np.stack([arith.centered_mod(X[l].astype(np.int64) + Xim[l], p) for l, p in enumerate(moduli)]).astype(np.int8)
    As = np.stack([arith.centered_mod(A[l].astype(np.int64) + Aim[l], p) for l, p in enumerate(moduli)]).astype(np.int8)
    out_im = np.zeros_like(out)
    assert simt.emu_product3m(bn, *grid, _p(X), _p(Xim), _p(Xs), _p(A), _p(Aim), _p(As), _p(out), _p(out_im), *dims,
                              *consts) == 0
    return out, out_im


@pytest.mark.parametrize(
    "pre, n_in, post, n_out, bn",
    [
        (300, 8, 1, 8, 8),  # the n = 8 mode product, last axis: 8-byte vector loads
        (7, 37, 1, 16, 16),  # contiguous rows, byte loads (n_in % 8 != 0)
        (3, 40, 50, 20, 32),  # strided columns (a middle axis)
        (1, 33, 130, 70, 64),  # first axis, two column tiles, n_out over two operator tiles
        (2, 300, 9, 5, 8),  # n_in > 255: the int32 epilogue path
    ],
)
def test_product_kernel_matches_reference(simt, pre, n_in, post, n_out, bn):
    moduli = (256, 255, 7, 2)
    rng = np.random.default_rng(pre * n_in + post)
    X = random_planes(rng, moduli, (pre, n_in, post))
    A = random_planes(rng, moduli, (n_out, n_in))
    assert np.array_equal(_run(simt, bn, X, A, moduli), arith.product_ref(A, X, moduli, 1))


@pytest.mark.parametrize("n_in", [255, 256])
@pytest.mark.parametrize("edge", ["min", "max"])
def test_product_kernel_range_edges(simt, n_in, edge):
    # every residue at the end of its range: the largest accumulators on both epilogue paths
    moduli = (256, 255, 253)
    X = random_planes(None, moduli, (130, n_in, 1), edge)
    A = random_planes(None, moduli, (8, n_in), edge)
    assert np.array_equal(_run(simt, 8, X, A, moduli), arith.product_ref(A, X, moduli, 1))


def test_product_kernel_folds_long_contractions(simt):
    # the SIMT build folds every 2 k-steps (RNS_FOLD_STEPS=2): a long contraction at the range
    # edge folds many times; the device period keeps int32 exact between folds
    import re

    src = (build.source_dir() / "product.cu").read_text()
    period = int(re.search(r"#define RNS_FOLD_STEPS (\d+)", src).group(1))
    assert period * 32 * 2**14 + 128 < 2**31 <= (period + 1) * 32 * 2**14 + 128 + 2**20
    moduli = (256, 255)
    n_in = 32 * 7 + 5
    X = random_planes(None, moduli, (1, n_in, 1), "min")
    A = random_planes(None, moduli, (1, n_in), "min")
    assert np.array_equal(_run(simt, 8, X, A, moduli), arith.product_ref(A, X, moduli, 1))


@pytest.mark.parametrize("pre, n_in, post, n_out, bn", [(40, 8, 1, 8, 8), (3, 33, 7, 20, 32), (2, 270, 3, 9, 32)])
def test_product3m_kernel_matches_reference(simt, pre, n_in, post, n_out, bn):
    moduli = (256, 251, 3)
    rng = np.random.default_rng(n_in + n_out)
    Xr, Xi = random_planes(rng, moduli, (pre, n_in, post)), random_planes(rng, moduli, (pre, n_in, post))
    Ar, Ai = random_planes(rng, moduli, (n_out, n_in)), random_planes(rng, moduli, (n_out, n_in))
    re, im = _run(simt, bn, Xr, Ar, moduli, three_m=(Xi, Ai))
    P0, P1 = arith.product_ref(Ar, Xr, moduli, 1), arith.product_ref(Ai, Xi, moduli, 1)
    P2 = arith.product_ref(arith.add_ref(Ar, Ai, moduli), arith.add_ref(Xr, Xi, moduli), moduli, 1)
    assert np.array_equal(re, arith.add_ref(P0, P1, moduli, subtract=True))
    assert np.array_equal(im, arith.add_ref(arith.add_ref(P2, P0, moduli, subtract=True), P1, moduli, subtract=True))


def test_reduce_i32_kernel(simt):
    moduli = (256, 255, 3)
    rng = np.random.default_rng(5)
    acc = rng.integers(-(1 << 31), 1 << 31, (3, 1000), dtype=np.int64).astype(np.int32)
    out = np.zeros((3, 1000), np.int8)
    consts = [_p(c) for c in tables.reduce_consts(moduli)]
    assert simt.emu_reduce_i32(ctypes.c_uint(4), _p(acc), _p(out), ctypes.c_int64(1000), 3, *consts) == 0
    ref = np.stack([arith.centered_mod(acc[l], p) for l, p in enumerate(moduli)]).astype(np.int8)
    assert np.array_equal(out, ref)
