"""CudaBackend's host side without a GPU: a stand-in for CuPy runs each launch through an emulation of its kernel.

The stand-in gives numpy arrays a device type and answers the few CuPy calls
the backend makes; each kernel launch is checked (grid, block, shared memory)
and emulated: encode, drop/extend, decode and the int32 reduction by the host
build of the kernels' own arithmetic (rns_arith.cuh through ctypes, with the
launch's argument list), the product and the elementwise kernels by plain
numpy on the kernel's indexing model (plane strides, pre/post columns, tiles).
The product launches run product.cu itself through its host SIMT build
(simt_host.cpp: CPU threads, a software MMA) where a C++20 compiler exists,
else a numpy model of the kernel's indexing. What this proves: the backend
builds its tables, exponent runs, argument lists and launch shapes so that the
kernels compute CpuBackend's bits. What it does not: the device code as the GPU
runs it (tests/gpu/) or CuPy's own API.
"""

from __future__ import annotations

import ctypes
import sys
import types

import numpy as np
import pytest

from rnstensor import arith
from rnstensor.backends.cpu import CpuBackend
from rnstensor.basis import Basis, int8_pool
from rnstensor.kernels import build, tables

CPU = CpuBackend()
POOL = int8_pool()


class DevArray(np.ndarray):
    """A numpy array standing in for a device array."""

    def __new__(cls, shape, dtype=float, memptr=None):
        if memptr is not None:  # cupy.ndarray(shape, dtype, memptr) over a module global
            assert memptr.dtype == np.dtype(dtype) and memptr.shape == tuple(np.atleast_1d(shape))
            return memptr
        return np.zeros(shape, dtype).view(cls)

    @property
    def data(self):  # cupy.ndarray.data is a MemoryPointer: the backend reads .ptr (alignment, cuBLAS)
        return types.SimpleNamespace(ptr=self.ctypes.data)

    def set(self, arr):
        self[...] = arr

    def get(self):
        return np.array(self)


def dev(a, dtype=None):
    return np.array(a, dtype=dtype).view(DevArray)


def _ptr(a):
    return np.asarray(a).ctypes.data_as(ctypes.c_void_p)


class FakeModule:
    simt = None  # the SIMT build of product.cu (ctypes), set by the fixture when it builds
    wgmma = None  # the SIMT build of product_wgmma.cu (wgmma_host.cpp), likewise
    chain = None  # the SIMT build of chain.cu (chain_host.cpp), likewise

    def __init__(self, path, lib, launches):
        data = open(path, "rb").read(4)
        assert data == b"\x7fELF", "RawModule must get a cubin"
        self.lib, self.launches = lib, launches
        self.globals = {
            "rns_drop_ib": dev(np.zeros(tables.DROP_IB_MAX, np.int32)),
            "rns_drop_fb": dev(np.zeros(tables.DROP_FB_MAX, np.float32)),
        }

    def get_global(self, name):
        return self.globals[name]

    def get_function(self, name):
        def launch(grid, block, args, shared_mem=0):
            assert all(isinstance(g, (int, np.integer)) and 0 < g for g in grid), grid
            assert len(block) == 1 and block[0] % 32 == 0 and block[0] <= 1024
            # above 48 KiB a kernel must have opted in (cudaFuncAttributeMaxDynamicSharedMemorySize)
            assert shared_mem <= max(48 * 1024, getattr(launch, "max_dynamic_shared_size_bytes", 0))
            for a in args:  # every argument a device array or a sized numpy scalar (or None: a null pointer)
                assert a is None or isinstance(a, (DevArray, np.integer, np.floating)), (name, type(a))
            self.launches.append(name)
            method = "_rns_product3m" if name.startswith("rns_product3m") else (
                "_rns_product" if name.startswith("rns_product") else "_" + name)
            getattr(self, method)(grid, block, args, shared_mem, name)

        return launch

    # ----- emulations ---------------------------------------------------------------------------

    def _rns_encode(self, grid, block, args, smem, name):
        xbits, N, ev, inner, L, P, IP, H, CP, pw, ldpw, pa, per, out = args
        assert xbits.dtype == np.uint64 and ev.dtype == np.int64 and out.dtype == np.int8
        assert pw.dtype == np.float32 and pa.dtype == per.dtype == np.int32 and pw.shape[1] == ldpw
        self.lib.h_encode(_ptr(xbits), ctypes.c_int64(N), _ptr(ev), ctypes.c_int64(inner), ctypes.c_int(L), _ptr(P),
                          _ptr(IP), _ptr(H), _ptr(CP), _ptr(pw), ctypes.c_int(ldpw), _ptr(pa), _ptr(per),
                          _ptr(out))

    def _rns_drop_extend(self, grid, block, args, smem, name):
        X, N, out = args
        ib, fb = self.globals["rns_drop_ib"], self.globals["rns_drop_fb"]
        nr, wg, wm = int(ib[1]), int(ib[4]), int(ib[5])
        assert smem >= (max(wg, wm) + max(nr, 1)) * block[0] * 4, "too little scratch"
        assert X.flags.c_contiguous and out.shape == (int(ib[3]), N)
        assert self.lib.h_drop_extend(_ptr(X), ctypes.c_int64(N), _ptr(ib), _ptr(fb), _ptr(out)) == 0

    def _rns_decode_fp64(self, grid, block, args, smem, name):
        X, N, ib, fb, qd, f, ev, inner, k, out = args
        assert smem >= int(ib[0]) * block[0] * 4
        assert qd.dtype == np.float64 and ev.dtype == np.int64 and isinstance(f, np.float64)
        assert self.lib.h_decode_fp64(_ptr(X), ctypes.c_int64(N), _ptr(ib), _ptr(fb), _ptr(qd), ctypes.c_double(f),
                                      _ptr(ev), ctypes.c_int64(inner), ctypes.c_int64(k), _ptr(out)) == 0

    def _rns_decode_exact(self, grid, block, args, smem, name):
        X, N, ib, fb, qd, F, nf, fneg, ev, inner, k, out = args
        assert smem >= int(ib[0]) * block[0] * 4 and F.dtype == np.uint32 and F.size == nf
        assert self.lib.h_decode_exact(_ptr(X), ctypes.c_int64(N), _ptr(ib), _ptr(fb), _ptr(qd), _ptr(F),
                                       ctypes.c_int(nf), ctypes.c_int(fneg), _ptr(ev), ctypes.c_int64(inner),
                                       ctypes.c_int64(k), _ptr(out)) == 0

    def _rns_chain_fused(self, grid, block, args, smem, name):
        xb, B, out, pi, pf, qd, ops, dexp, f, field, fstride, fexp, flags = args
        self._chain(grid, block, smem, xb, B, out, pi, pf, qd, ops, dexp, 0, f, np.zeros(1, np.uint32), 0, 0,
                    field, fstride, fexp, flags)

    def _rns_chain_fused_exact(self, grid, block, args, smem, name):
        xb, B, out, pi, pf, qd, ops, dexp, F, nf, fneg, field, fstride, fexp, flags = args
        assert F.dtype == np.uint32 and F.size == nf
        self._chain(grid, block, smem, xb, B, out, pi, pf, qd, ops, dexp, 1, 1.0, F, nf, fneg, field, fstride, fexp,
                    flags)

    def _chain(self, grid, block, smem, xb, B, out, pi, pf, qd, ops, dexp, mode, f, F, nf, fneg, field, fstride,
               fexp, flags):
        assert self.chain is not None, "the SIMT build of chain.cu is needed"
        assert xb.dtype == np.uint64 and out.dtype == np.float64 and pi.dtype == np.int32 and pf.dtype == np.float32
        assert qd.dtype == np.float64 and ops.dtype == np.int8 and dexp.dtype == np.int32 and flags.dtype == np.int32
        nb = int(pi[4])
        assert block[0] == 256 and grid[0] == -(-int(B) // nb) and out.shape[0] == int(B)
        if int(pi[18]):  # a program with Hadamard steps: its field and the field's exponents, on the device
            assert isinstance(field, DevArray) and field.dtype == np.int8 and isinstance(fexp, DevArray)
            assert fexp.dtype == np.int32 and fexp.shape == (int(B),) and int(fstride) == field[0].size
        fptr, eptr = (None, None) if field is None else (_ptr(field), _ptr(fexp))
        assert self.chain.emu_chain(_ptr(xb), ctypes.c_int64(B), _ptr(out), _ptr(pi), _ptr(pf), _ptr(qd), _ptr(ops),
                                    _ptr(dexp), mode, ctypes.c_double(f), _ptr(F), int(nf), int(fneg), fptr,
                                    ctypes.c_int64(fstride), eptr, _ptr(flags), ctypes.c_int64(smem), 0x5A) == 0

    def _rns_reduce_i32(self, grid, block, args, smem, name):
        acc, out, n, L, P, IP, H, C16 = args
        for l in range(L):
            self.lib.h_reduce_i32(_ptr(acc[l]), ctypes.c_int64(n), ctypes.c_float(P[l]), ctypes.c_float(IP[l]),
                                  ctypes.c_float(H[l]), ctypes.c_float(C16[l]), _ptr(out.reshape(L, n)[l]))

    def _rns_elementwise(self, grid, block, args, smem, name):
        a, b, out, n, L, mode, P, IP, H = args
        for l in range(L):
            x, y = a.reshape(L, -1)[l].astype(np.int64), b.reshape(L, -1)[l].astype(np.int64)
            t = x * y if mode == 0 else (x + y if mode == 1 else x - y)
            out.reshape(L, -1)[l] = arith.centered_mod(t, int(P[l]))

    def _rns_product3m(self, grid, block, args, smem, name):
        Xre, Xim, Xs, Are, Aim, As, Ore, Oim, pre, n_in, post, n_out, xplane, oplane, P, IP, H, C16 = args
        bn = int(name.rsplit("n", 1)[1])
        M = int(pre) * int(post)
        assert grid[0] * 128 >= M and grid[1] * bn >= n_out and grid[2] == Are.shape[0] and bn <= 32
        if self.simt is not None:
            u = ctypes.c_uint
            assert self.simt.emu_product3m(bn, u(grid[0]), u(grid[1]), u(grid[2]), *map(_ptr, args[:8]), int(pre),
                                           int(n_in), int(post), int(n_out), ctypes.c_int64(xplane),
                                           ctypes.c_int64(oplane), *map(_ptr, args[14:])) == 0
            return
        for l in range(grid[2]):
            p = int(P[l])

            def mm(X, A):
                Xl = np.asarray(X[l * xplane : l * xplane + M * n_in]).reshape(pre, n_in, post).astype(np.int64)
                return arith.centered_mod(np.einsum("jk,akt->ajt", A[l].astype(np.int64), Xl), p)

            t1, t2, t3 = mm(Xre, Are), mm(Xim, Aim), mm(Xs, As)
            Ore[l * oplane : l * oplane + pre * n_out * post] = arith.centered_mod(t1 - t2, p).reshape(-1)
            Oim[l * oplane : l * oplane + pre * n_out * post] = arith.centered_mod(t3 - t1 - t2, p).reshape(-1)

    def _rns_gemm_wgmma(self, grid, block, args, smem, name):
        X, A, out, M, N, K, xplane, aplane, oplane, P, IP, H, C16 = args
        bn = int(name.rsplit("n", 1)[1])
        assert block == (256,) and smem == 0 and K % 16 == 0
        assert grid[0] * 128 >= M and grid[1] * bn >= N and grid[2] == A.shape[0]
        assert X.dtype == A.dtype == out.dtype == np.int8 and X.flags.c_contiguous and A.flags.c_contiguous
        assert X.ctypes.data % 16 == 0 and A.ctypes.data % 16 == 0
        assert xplane == M * K and aplane == N * K and oplane == M * N and X.size >= grid[2] * xplane
        if self.wgmma is not None:
            u = ctypes.c_uint
            assert self.wgmma.emu_gemm_wgmma(bn, 1, 0, u(grid[0]), u(grid[1]), u(grid[2]), _ptr(X), _ptr(A), _ptr(out),
                                             int(M), int(N), int(K), ctypes.c_int64(xplane), ctypes.c_int64(aplane),
                                             ctypes.c_int64(oplane), *map(_ptr, args[9:])) == 0
            return
        for l in range(grid[2]):
            Xl = np.asarray(X).reshape(-1)[l * xplane : (l + 1) * xplane].reshape(M, K).astype(np.int64)
            acc = Xl @ np.asarray(A[l]).astype(np.int64).reshape(N, K).T
            np.asarray(out).reshape(-1)[l * oplane : (l + 1) * oplane] = arith.centered_mod(acc, int(P[l])).reshape(-1)

    _rns_gemm_wgmma_n64 = _rns_gemm_wgmma
    _rns_gemm_wgmma_n128 = _rns_gemm_wgmma

    def _rns_product(self, grid, block, args, smem, name):
        X, A, out, pre, n_in, post, n_out, xplane, oplane, P, IP, H, C16 = args
        bn = int(name.rsplit("n", 1)[1])
        M = int(pre) * int(post)
        assert M < 2**31 and block == (128,)
        assert grid[0] * 128 >= M and grid[1] * bn >= n_out and grid[2] == A.shape[0]
        assert X.ndim == out.ndim == 1 and X.dtype == out.dtype == np.int8 and A.flags.c_contiguous
        if self.simt is not None:
            u = ctypes.c_uint
            assert self.simt.emu_product(bn, u(grid[0]), u(grid[1]), u(grid[2]), _ptr(X), _ptr(A), _ptr(out), int(pre),
                                         int(n_in), int(post), int(n_out), ctypes.c_int64(xplane),
                                         ctypes.c_int64(oplane), _ptr(P), _ptr(IP), _ptr(H), _ptr(C16)) == 0
            return
        for l in range(grid[2]):
            Xl = np.asarray(X[l * xplane : l * xplane + M * n_in]).reshape(pre, n_in, post).astype(np.int64)
            acc = np.einsum("jk,akt->ajt", A[l].astype(np.int64), Xl)
            out[l * oplane : l * oplane + pre * n_out * post] = arith.centered_mod(acc, int(P[l])).reshape(-1)


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    try:
        build.nvrtc_version()
    except build.KernelBuildError:  # pragma: no cover
        pytest.skip("NVRTC (the 'test' extras) is not installed")
    try:
        lib = ctypes.CDLL(str(build.host_library(cache=tmp_path_factory.mktemp("host-lib"))))
    except build.KernelBuildError as exc:  # pragma: no cover
        pytest.skip(f"no host C++ compiler: {exc}")
    lib.h_decode_fp64.restype = ctypes.c_int
    lib.h_drop_extend.restype = ctypes.c_int
    lib.h_decode_exact.restype = ctypes.c_int
    try:
        FakeModule.simt = ctypes.CDLL(str(build.simt_library(cache=tmp_path_factory.mktemp("simt-lib"))))
    except build.KernelBuildError:  # pragma: no cover - no C++20 compiler: the numpy model of the kernel
        FakeModule.simt = None
    try:
        FakeModule.wgmma = ctypes.CDLL(str(build.wgmma_library(cache=tmp_path_factory.mktemp("wgmma-lib"))))
    except build.KernelBuildError:  # pragma: no cover
        FakeModule.wgmma = None
    try:
        FakeModule.chain = ctypes.CDLL(str(build.chain_simt_library(cache=tmp_path_factory.mktemp("chain-lib"))))
    except build.KernelBuildError:  # pragma: no cover
        FakeModule.chain = None
    launches: list[str] = []
    cp = types.ModuleType("cupy")
    cp.ndarray = DevArray
    for t in ("int8", "int32", "int64", "uint64", "float32", "float64"):
        setattr(cp, t, getattr(np, t))
    cp.asarray = lambda a, dtype=None: a if isinstance(a, DevArray) and dtype is None else dev(a, dtype)
    cp.asnumpy = lambda a: np.array(a)
    cp.empty = lambda shape, dtype=float: np.empty(shape, dtype).view(DevArray)
    cp.zeros = lambda shape, dtype=float: np.zeros(shape, dtype).view(DevArray)
    cp.broadcast_to = lambda a, shape: np.broadcast_to(a, shape).view(DevArray)
    props = {"major": 9, "minor": 0, "name": b"Fake H200"}
    cp.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, getDeviceProperties=lambda i: props),
        Device=lambda: types.SimpleNamespace(id=0),
    )
    cp.RawModule = lambda path: FakeModule(path, lib, launches)
    saved = sys.modules.get("cupy")
    sys.modules["cupy"] = cp
    import os

    old_cache = os.environ.get("RNSTENSOR_KERNEL_CACHE")
    # the session's kernel cache, shared with tests/test_kernels.py
    shared = tmp_path_factory.getbasetemp() / "rnstensor-kernel-cache"
    shared.mkdir(exist_ok=True)
    os.environ["RNSTENSOR_KERNEL_CACHE"] = str(shared)
    try:
        from rnstensor.backends.cuda import CudaBackend

        yield CudaBackend(), launches
    finally:
        if saved is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = saved
        if old_cache is None:
            os.environ.pop("RNSTENSOR_KERNEL_CACHE", None)
        else:
            os.environ["RNSTENSOR_KERNEL_CACHE"] = old_cache


def planes(rng, moduli, shape):
    return np.stack([rng.integers(-(p // 2), (p + 1) // 2, shape) for p in moduli]).astype(np.int8)


def same(a, b):
    a = np.asarray(a)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


def test_device_and_arch(fake):
    be, _ = fake
    assert be.arch == "sm_90a" and be.device_name == "Fake H200"
    assert set(be.built_kernels()) == set(build.MODULES)


def test_encode(fake):
    be, launches = fake
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, 7)) * np.exp2(rng.integers(-50, 50, (20, 7)))
    x.reshape(-1)[:6] = [0.0, -0.0, 5e-324, 2.5, -3.5, 1e300]
    moduli = POOL[:15]
    for e in (np.int64(30), rng.integers(-80, 1200, (20, 1)), rng.integers(-80, 80, (20, 7))):
        same(be.encode(dev(x), e, moduli, 53), CPU.encode(x, e, moduli, 53))
        same(be.encode(x, e, moduli, 53), CPU.encode(x, e, moduli, 53))  # numpy in, numpy out
    same(be.encode(dev(np.array(1.5)), np.int64(3), moduli, 53), CPU.encode(np.array(1.5), np.int64(3), moduli, 53))
    assert "rns_encode" in launches


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("n_in, n_out", [(1, 1), (8, 8), (9, 17), (40, 33), (64, 70)])
def test_product(fake, axis, n_in, n_out):
    be, launches = fake
    rng = np.random.default_rng(axis * 1000 + n_in * 10 + n_out)
    moduli = POOL[:4]
    shape = [3, 5, 4]
    shape[axis] = n_in
    X = planes(rng, moduli, tuple(shape))
    A = planes(rng, moduli, (n_out, n_in))
    got = be.product(dev(A), dev(X), moduli, axis)
    assert isinstance(got, DevArray)
    same(got, CPU.product(A, X, moduli, axis))
    bn = next((b for b in (8, 16, 32, 64) if b >= n_out), 64)
    assert launches[-1] == f"rns_product_n{bn}"


@pytest.mark.parametrize("n_in, n_out, kernel", [(16, 5, "rns_gemm_wgmma_n64"), (48, 64, "rns_gemm_wgmma_n64"),
                                                 (80, 65, "rns_gemm_wgmma_n128"), (272, 130, "rns_gemm_wgmma_n128")])
def test_product_wgmma(fake, n_in, n_out, kernel):
    # product_engine='wgmma' on the (fake) sm_90a device: the last axis with n_in % 16 == 0 runs the wgmma
    # kernel (product_wgmma.cu through its SIMT build), every other product the mma.sync kernel
    from rnstensor.backends.cuda import CudaBackend

    _, launches = fake
    be = CudaBackend(product_engine="wgmma")
    rng = np.random.default_rng(n_in + n_out)
    moduli = POOL[:3]
    X = planes(rng, moduli, (3, 50, n_in))
    A = planes(rng, moduli, (n_out, n_in))
    same(be.product(dev(A), dev(X), moduli, 2), CPU.product(A, X, moduli, 2))
    assert launches[-1] == kernel
    Xm = X.transpose(0, 1, 3, 2).copy()  # (L, 3, n_in, 50)
    same(be.product(dev(A), dev(Xm), moduli, 1), CPU.product(A, Xm, moduli, 1))
    assert launches[-1].startswith("rns_product_n")  # a middle axis: mma.sync
    Xo = planes(rng, moduli, (3, 50, n_in + 4))
    Ao = planes(rng, moduli, (n_out, n_in + 4))
    same(be.product(dev(Ao), dev(Xo), moduli, 2), CPU.product(Ao, Xo, moduli, 2))
    assert launches[-1].startswith("rns_product_n")  # n_in % 16 != 0: mma.sync
    # a view 1 byte into a buffer: not 16-byte aligned, so mma.sync
    buf = dev(np.zeros(X.size + 1, np.int8))
    Xv = buf[1:].reshape(X.shape)
    Xv[...] = X
    same(be.product(dev(A), Xv, moduli, 2), CPU.product(A, X, moduli, 2))
    assert launches[-1].startswith("rns_product_n")


def test_product_auto_dispatch(fake, monkeypatch):
    from rnstensor.backends import cuda as cuda_mod

    default, launches = fake
    assert default.product_engine == "mma"  # until the engines are measured on a GPU
    be = cuda_mod.CudaBackend(product_engine="auto")
    rng = np.random.default_rng(4)
    moduli = POOL[:2]
    X = planes(rng, moduli, (300, 64))
    A = planes(rng, moduli, (64, 64))
    # the default thresholds keep this small product on mma.sync
    assert be.product_engine_for(300, 64, 1, 64, 2) == "mma"
    same(be.product(dev(A), dev(X), moduli, 1), CPU.product(A, X, moduli, 1))
    assert launches[-1] == "rns_product_n64"
    # lowered thresholds (an override) send it to wgmma
    low = cuda_mod.CudaBackend(product_engine="auto", product_thresholds={"wgmma_min_macs": 0, "wgmma_min_k": 16})
    assert low.product_engine_for(300, 64, 1, 64, 2) == "wgmma"
    same(low.product(dev(A), dev(X), moduli, 1), CPU.product(A, X, moduli, 1))
    assert launches[-1] == "rns_gemm_wgmma_n64"
    # the environment forces an engine
    monkeypatch.setenv("RNSTENSOR_PRODUCT_ENGINE", "mma")
    assert cuda_mod.CudaBackend().product_engine_for(10**6, 4096, 1, 4096, 15) == "mma"
    monkeypatch.setenv("RNSTENSOR_PRODUCT_ENGINE", "fast")
    with pytest.raises(ValueError, match=r"\$RNSTENSOR_PRODUCT_ENGINE must be one of"):
        cuda_mod.CudaBackend()
    with pytest.raises(ValueError, match="unknown keys"):
        cuda_mod.CudaBackend(product_engine="auto", product_thresholds={"wgmma_rows": 1})


@pytest.mark.parametrize("axis, n_in, n_out", [(0, 8, 8), (1, 9, 40), (2, 33, 5)])
def test_product_3m(fake, axis, n_in, n_out):
    be, launches = fake
    rng = np.random.default_rng(axis + n_in)
    moduli = POOL[:4]
    shape = [3, 5, 4]
    shape[axis] = n_in
    re, im = planes(rng, moduli, tuple(shape)), planes(rng, moduli, tuple(shape))
    ore, oim = planes(rng, moduli, (n_out, n_in)), planes(rng, moduli, (n_out, n_in))
    P0, P1 = CPU.product(ore, re, moduli, axis), CPU.product(oim, im, moduli, axis)
    P2 = CPU.product(CPU.add(ore, oim, moduli), CPU.add(re, im, moduli), moduli, axis)
    got_re, got_im = be.product_3m(dev(ore), dev(oim), dev(re), dev(im), moduli, axis)
    same(got_re, CPU.add(P0, P1, moduli, subtract=True))
    same(got_im, CPU.add(CPU.add(P2, P0, moduli, subtract=True), P1, moduli, subtract=True))
    assert launches[-1].startswith("rns_product3m_n")


def test_product_splits_long_column_ranges(fake, monkeypatch):
    # columns pre * post beyond int32 are split along pre: shrink the limit to see it
    from rnstensor.backends import cuda as cuda_mod

    be, launches = fake
    monkeypatch.setattr(cuda_mod, "_MAX_COLS", 10)
    rng = np.random.default_rng(7)
    moduli = POOL[:4]
    X = planes(rng, moduli, (7, 6, 3))
    A = planes(rng, moduli, (5, 6))
    n0 = len(launches)
    same(be.product(dev(A), dev(X), moduli, 1), CPU.product(A, X, moduli, 1))
    assert len(launches) - n0 == 3  # pre = 7 in chunks of 10 // 3 = 3 rows


@pytest.mark.parametrize("basis", [Basis.int8(15), Basis((7, 5, 3, 2)), Basis((255, 256, 7))], ids=str)
def test_elementwise(fake, basis):
    be, _ = fake
    rng = np.random.default_rng(len(basis))
    a = planes(rng, basis.moduli, (4, 3, 5))
    b = planes(rng, basis.moduli, (4, 3, 5))
    f = planes(rng, basis.moduli, (3, 5))
    same(be.hadamard(dev(a), dev(f), basis.moduli), CPU.hadamard(a, f, basis.moduli))
    same(be.hadamard(a, b, basis.moduli), CPU.hadamard(a, b, basis.moduli))
    same(be.add(dev(a), dev(b), basis.moduli, subtract=True), CPU.add(a, b, basis.moduli, subtract=True))
    with pytest.raises(ValueError, match="does not broadcast"):
        be.add(dev(f), dev(a), basis.moduli)


@pytest.mark.parametrize(
    "basis, drops, extend",
    [(Basis.int8(15), 3, True), (Basis.int8(15), (256, 241), False), (Basis.int8(49), 6, True),
     (Basis.int8(15), 0, True), (Basis.int8(15), 0, False), (Basis((7, 5, 3)), 3, False)],
)
def test_drop_extend(fake, basis, drops, extend):
    be, _ = fake
    rng = np.random.default_rng(11)
    active = tuple(rng.permutation(basis.moduli).tolist())
    X = planes(rng, active, (9, 13))
    ref, ref_act = CPU.drop_extend(X, active, basis, drops, extend)
    got, act = be.drop_extend(dev(X), active, basis, drops, extend)
    assert tuple(act) == tuple(ref_act)
    same(got, ref)


@pytest.mark.parametrize("mode", ["fp64", "exact"])
def test_decode(fake, mode):
    be, launches = fake
    launches.clear()
    rng = np.random.default_rng(12)
    for active in (POOL[:15], POOL[:49], (7, 5, 3, 2)):
        X = planes(rng, active, (10, 6))
        ev = rng.integers(-1100, 1100, (10, 1))
        for factor in (1, 253 * 251, -(1 << 70), 0, 3**700):
            with np.errstate(over="ignore"):
                ref = CPU.decode(X, active, ev, factor, mode)
            same(be.decode(dev(X), active, ev, factor, mode), ref)
    # 3 tensors x 5 factors, less the zero factor (no launch) and 3**700 on 49 moduli (too wide: the CPU)
    assert launches.count("rns_decode_exact") == (11 if mode == "exact" else 0)


def test_chain_through_the_backend(fake, monkeypatch):
    # a whole RescaleBE chain: encode, products on every axis, drops with extension, decode
    import rnstensor as rt
    from rnstensor import backends

    be, launches = fake
    monkeypatch.setitem(backends._BACKENDS, "cuda", be)
    rng = np.random.default_rng(2)
    plan = rt.plan_chain([rng.uniform(-1, 1, (8, 8)) for _ in range(3)], [0, 1, 2])
    X = rng.uniform(-1, 1, (3, 8, 8, 8))
    for decode in ("fp64", "exact"):
        want = plan.run(X, decode, backend="cpu")
        same(plan.run(X, decode, backend="cuda", fused=False), want)  # one kernel per step
        same(plan.run(X, decode, backend="cuda"), want)  # the fused kernel (its plan-specialized build)
        assert launches[-1] == ("rns_chain_fused_exact" if decode == "exact" else "rns_chain_fused")
        monkeypatch.setattr(DevArray, "__module__", "cupy")  # how ChainPlan.run recognizes CuPy input
        got = plan.run(dev(X), decode)  # device input: the cuda backend, a device array out
        monkeypatch.setattr(DevArray, "__module__", __name__)
        assert isinstance(got, DevArray) and launches[-1].startswith("rns_chain_fused")
        same(got, want)
    be.specialize_chains = False  # the generic kernel (a chain is specialized by default)
    same(plan.run(X, backend="cuda", fused=True), plan.run(X, backend="cpu"))
    X[1, 2, 3, 4] = np.nan
    monkeypatch.setattr(DevArray, "__module__", "cupy")
    with pytest.raises(ValueError, match="non-finite"):
        plan.run(dev(X))
    monkeypatch.setattr(DevArray, "__module__", __name__)
    a, b = rng.standard_normal((9, 40)), rng.standard_normal((40, 7))
    same(rt.dgemm(a, b, backend="cuda"), rt.dgemm(a, b, backend="cpu"))


def test_prebuild_fills_the_cache(fake, monkeypatch):
    # every build a program needs, made side by side before the first launch; the runs then compile nothing
    import rnstensor as rt
    from rnstensor import backends
    from rnstensor.fem import PoissonOperator, TensorBasis, box_mesh
    from rnstensor.kernels import fused

    be, launches = fake
    monkeypatch.setitem(backends._BACKENDS, "cuda", be)
    monkeypatch.setattr(be, "specialize_chains", "auto")  # the default (another test switches it off)
    rng = np.random.default_rng(11)
    plan = rt.plan_chain([rng.uniform(-1, 1, (4, 4)) for _ in range(3)], [0, 1, 2])  # fresh operators: a new build
    basis = TensorBasis(3)
    poisson = fused.operator_program(PoissonOperator(basis, box_mesh(basis, shape=(2, 1, 1)).G))
    chain = fused.chain_program(plan, (4, 4, 4))
    assert fused.specialize_by_default(chain) and not fused.specialize_by_default(poisson)
    # the modules of the arch, the chain's own build; Poisson runs the generic chain module (counted once)
    assert be.prebuild([chain, poisson, chain], jobs=2) == len(build.modules_for("sm_90a")) + 1

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled after prebuild")

    monkeypatch.setattr(build, "_nvrtc_compile", no_compile)
    X = rng.uniform(-1, 1, (2, 4, 4, 4))
    same(plan.run(X, backend="cuda", fused=True), plan.run(X, backend="cpu"))
    assert launches[-1] == "rns_chain_fused"
    for m in build.modules_for("sm_90a"):
        build.compile_module(m, "sm_90a")
    with pytest.raises(TypeError, match="ChainProgram"):
        be.prebuild([plan])


def test_fused_fem_operators_through_the_backend(fake, monkeypatch):
    # the mass and Poisson operators as one kernel: their fields (w detJ, G residues) and exponents go to the device
    from rnstensor import backends
    from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

    be, launches = fake
    monkeypatch.setitem(backends._BACKENDS, "cuda", be)
    basis = TensorBasis(3)
    mesh = box_mesh(basis, shape=(3, 1, 1), curved=0.1)
    u = np.random.default_rng(5).standard_normal((mesh.nelem, 3, 3, 3))
    cpu = MassOperator(basis, mesh.qdata, backend="cpu")
    gpu = MassOperator(basis, mesh.qdata, backend="cuda")
    for decode in ("fp64", "exact"):
        same(gpu.apply(u, decode), cpu.apply(u, decode))
        assert launches[-1].startswith("rns_chain_fused")
        same(gpu.apply(u, decode, fused=False), cpu.apply(u, decode))
        assert not launches[-1].startswith("rns_chain_fused")
    poisson = PoissonOperator(basis, mesh.G, backend="cuda")
    same(poisson.apply(u, fused=True), PoissonOperator(basis, mesh.G, backend="cpu").apply(u))
    assert launches[-1] == "rns_chain_fused"
    with pytest.raises(ValueError, match="fused=True"):
        cpu.apply(u, fused=True)  # the cpu backend has no fused kernel
