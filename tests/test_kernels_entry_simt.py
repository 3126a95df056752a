"""entry.cu run on the CPU (entry_host.cpp: one thread per CUDA thread) against the numpy reference, bit for bit.

The per-entry kernels (encode, elementwise, drop/extend, both decodes) as
written: the grid-stride loops (grids smaller than the data, so a thread
takes several entries), the thread-to-entry mapping, the digit scratch in
shared memory (one column per thread, stride ``blockDim.x``, filled with
garbage before the launch) and the drop tables in the module's constant
bank. tests/test_kernels_host.py checks the same arithmetic in a plain loop;
this runs the kernels around it.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from rnstensor import arith
from rnstensor.basis import Basis, int8_pool
from rnstensor.kernels import build, tables
from sanitize import SANITIZE
from test_kernels_host import _encode_inputs, _random_planes, _same_bits

POOL = int8_pool()
U, I64, F64 = ctypes.c_uint, ctypes.c_int64, ctypes.c_double


@pytest.fixture(scope="module")
def entry(tmp_path_factory):
    try:
        lib = ctypes.CDLL(str(build.entry_simt_library(cache=tmp_path_factory.mktemp("entry"), sanitize=SANITIZE)))
    except build.KernelBuildError as exc:  # pragma: no cover - CI images have g++ >= 11
        pytest.skip(f"no C++20 host compiler for the SIMT build of entry.cu: {exc}")
    for name in ("emu_encode", "emu_elementwise", "emu_set_drop_tables", "emu_drop_extend", "emu_decode_fp64",
                 "emu_decode_exact"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def _p(a):
    return np.asarray(a).ctypes.data_as(ctypes.c_void_p)


# (blocks, threads): fewer threads than entries (each thread loops), one block, and a partial last stride
GRIDS = [(3, 64), (1, 256), (5, 96)]


@pytest.mark.parametrize("blocks, threads", GRIDS)
@pytest.mark.parametrize("moduli", [POOL[:15], (255, 256, 7)])
def test_encode_kernel(entry, blocks, threads, moduli):
    rng = np.random.default_rng(blocks * threads + len(moduli))
    n = 1000
    x = _encode_inputs(rng, n)
    ev = rng.integers(-300, 300, n // 4).astype(np.int64)  # an exponent per run of 4 entries
    P, IP, H, CP, pw, pa, per = tables.encode_tables(tuple(moduli))
    pw = np.ascontiguousarray(pw)
    out = np.full((len(moduli), n), 99, np.int8)
    assert entry.emu_encode(U(blocks), U(threads), _p(x.view(np.uint64)), I64(n), _p(ev), I64(4), len(moduli), _p(P),
                            _p(IP), _p(H), _p(CP), _p(pw), pw.shape[1], _p(pa), _p(per), _p(out)) == 0
    assert np.array_equal(out, arith.encode_ref(x, np.repeat(ev, 4), moduli, 53))


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_elementwise_kernel(entry, mode):
    moduli = POOL[:15]
    rng = np.random.default_rng(mode)
    n = 777
    a, b = _random_planes(rng, moduli, n), _random_planes(rng, moduli, n)
    P, IP, H, _ = tables.reduce_consts(moduli)
    out = np.zeros_like(a)
    assert entry.emu_elementwise(U(4), U(64), _p(a), _p(b), _p(out), I64(n), len(moduli), mode, _p(P), _p(IP),
                                 _p(H)) == 0
    x, y = a.astype(np.int64), b.astype(np.int64)
    t = x * y if mode == 0 else (x + y if mode == 1 else x - y)
    want = np.stack([arith.centered_mod(t[i], p) for i, p in enumerate(moduli)]).astype(np.int8)
    assert np.array_equal(out, want)


@pytest.mark.parametrize("basis, drops, extend, threads", [
    (POOL[:15], 3, True, 128),
    (POOL[:15], (256, 253), True, 64),  # the even modulus first; the backend's 64-thread blocks
    (POOL[:49], 5, True, 64),
    (POOL[:15], 2, False, 128),
    ((255, 256, 7, 11), 0, True, 96),
])
def test_drop_extend_kernel(entry, basis, drops, extend, threads):
    basis = Basis(basis)
    rng = np.random.default_rng(len(basis) + threads)
    active = tuple(rng.permutation(basis.moduli).tolist())
    n = 900
    X = _random_planes(rng, active, n)
    ib, fb, out_active, ndig, nrem = tables.drop_tables(active, basis.moduli, drops, extend)
    assert entry.emu_set_drop_tables(_p(ib), I64(ib.size), _p(fb), I64(fb.size)) == 0
    out = np.zeros((len(out_active), n), np.int8)
    smem = (max(ndig, 1) + max(nrem, 1)) * threads * 4  # what the backend asks for (at least)
    assert entry.emu_drop_extend(U(3), U(threads), I64(smem), 0x5A, _p(X), I64(n), _p(out)) == 0
    ref, ref_active = arith.drop_extend_ref(X, active, basis, drops, extend)
    assert tuple(out_active) == tuple(ref_active)
    assert np.array_equal(out, ref)


@pytest.mark.parametrize("active", [POOL[:15], POOL[:49], (7, 5, 3, 2)])
@pytest.mark.parametrize("factor", [1, -(253 * 251), (1 << 80) + 12345])
def test_decode_kernels(entry, active, factor):
    rng = np.random.default_rng(len(active) + factor % 1000)
    n = 700
    X = _random_planes(rng, active, n)
    ev = rng.integers(-200, 200, n).astype(np.int64)
    ev[:40] = rng.integers(-1500, -900, 40)  # subnormal and vanishing results
    ev[40:70] = rng.integers(900, 1300, 30)  # overflow
    ib, fb, qd = tables.decode_tables(tuple(active))
    smem = len(active) * 128 * 4
    f, g, k = arith.float_factor(factor)
    out = np.empty(n, np.float64)
    assert entry.emu_decode_fp64(U(2), U(128), I64(smem), 0x5A, _p(X), I64(n), _p(ib), _p(fb), _p(qd), F64(f), F64(g),
                                 _p(ev), I64(1), I64(k), _p(out)) == 0
    with np.errstate(over="ignore"):
        _same_bits(out, arith.decode_fp64_ref(X, active, ev, factor))
    F, t2, neg = tables.factor_limbs(factor)
    out = np.empty(n, np.float64)
    assert entry.emu_decode_exact(U(2), U(128), I64(smem), 0x5A, _p(X), I64(n), _p(ib), _p(fb), _p(qd), _p(F),
                                  int(F.size), int(neg), _p(ev), I64(1), I64(t2), _p(out)) == 0
    _same_bits(out, arith.decode_exact_ref(X, active, ev, factor))


def test_launch_is_refused_outside_cuda_limits(entry):
    x = np.zeros(4)
    out = np.zeros((1, 4), np.int8)
    P, IP, H, CP, pw, pa, per = tables.encode_tables((7,))
    pw = np.ascontiguousarray(pw)
    ev = np.zeros(4, np.int64)
    for blocks, threads in ((0, 32), (1, 2048), (1, 48)):  # no block, more than 1024 threads, not whole warps
        assert entry.emu_encode(U(blocks), U(threads), _p(x.view(np.uint64)), I64(4), _p(ev), I64(1), 1, _p(P),
                                _p(IP), _p(H), _p(CP), _p(pw), pw.shape[1], _p(pa), _p(per), _p(out)) == -1
