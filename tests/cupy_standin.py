"""A stand-in for CuPy without a GPU: device arrays are numpy arrays, kernel launches run host builds of the kernels.

Each launch is checked (grid, block, shared memory, argument types) and
emulated: encode, drop/extend, decode and the int32 reduction by the host
build of the kernels' own arithmetic (rns_arith.cuh through ctypes, with the
launch's argument list); product.cu, product_wgmma.cu and chain.cu by their
host SIMT builds (CPU threads, a software MMA) where a C++20 compiler exists,
else a numpy model of the kernel's indexing; the elementwise kernel by numpy.

Used by tests/test_kernels_backend.py (CudaBackend's host side) and, with
``RNSTENSOR_CUPY_STANDIN=1``, by tests/gpu/ as a dry run of the GPU tests on
the CPU (tests/gpu/conftest.py). What it cannot show: the device code as the
GPU runs it, or CuPy's own behaviour beyond the calls answered here.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np

from rnstensor import arith
from rnstensor.kernels import build, tables

__all__ = ["DevArray", "FakeModule", "dev", "install", "kernel_signatures", "check_launch_args"]

_LAUNCH_LOCK = threading.Lock()


# C parameter types of the kernels (rns_arith.cuh's typedefs included) as numpy dtypes
_C_DTYPES = {
    "rns_i8": "i1", "signed char": "i1", "rns_u8": "u1", "unsigned char": "u1", "rns_i32": "i4", "int": "i4",
    "rns_u32": "u4", "unsigned": "u4", "unsigned int": "u4", "rns_i64": "i8", "long long": "i8",
    "rns_u64": "u8", "unsigned long long": "u8", "float": "f4", "double": "f8",
}
_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?([\w#]+)\s*\(([^)]*)\)')


def kernel_signatures(source: str) -> dict[str, list[tuple[np.dtype, bool]]]:
    """``{kernel name pattern: [(dtype, is pointer), ...]}`` of every ``extern "C" __global__`` kernel of a source.

    A name built by token pasting (``rns_product_n##BN``) becomes the regular
    expression ``rns_product_n\\w+``.
    """
    out = {}
    for name, params in _KERNEL.findall(source.replace("\\\n", " ")):
        sig = []
        for param in params.split(","):
            words = re.sub(r"\b(const|__restrict__)\b", " ", param).replace("*", " * ").split()
            pointer = "*" in words
            ctype = " ".join(w for w in words[:-1] if w != "*")
            if ctype not in _C_DTYPES:
                raise ValueError(f"kernel {name}: parameter {param.strip()!r} has a type the stand-in does not know")
            sig.append((np.dtype(_C_DTYPES[ctype]), pointer))
        out[re.escape(name.split("##")[0]) + (r"\w+" if "##" in name else "")] = sig
    return out


@functools.lru_cache(maxsize=None)
def _module_signatures() -> dict:
    sigs = {}
    for path in sorted(Path(build.source_dir()).glob("*.cu")):
        sigs.update(kernel_signatures(path.read_text()))
    return sigs


def check_launch_args(name: str, args, signatures: dict | None = None) -> None:
    """Assert that a launch's ``args`` are what kernel ``name``'s C parameters take, one by one.

    CuPy passes each argument by its own type: a numpy scalar of the wrong width
    (an ``int64`` where the kernel has ``int``) shifts every later parameter on
    the GPU. A pointer takes a device array (or ``None``) of the pointee's
    width; a scalar, a numpy scalar of the parameter's width and kind (integer
    or floating point).
    """
    sigs = _module_signatures() if signatures is None else signatures
    sig = next((v for k, v in sigs.items() if re.fullmatch(k, name)), None)
    assert sig is not None, f"no kernel {name} in the sources"
    assert len(args) == len(sig), f"{name}: {len(args)} arguments for {len(sig)} parameters"
    for i, (a, (dtype, pointer)) in enumerate(zip(args, sig)):
        if pointer:
            assert a is None or (isinstance(a, DevArray) and a.dtype.itemsize == dtype.itemsize), (
                f"{name} argument {i}: a pointer to {dtype} takes a device array of that width, not {type(a)} "
                f"{getattr(a, 'dtype', '')}")
        else:
            got = getattr(a, "dtype", None)
            assert isinstance(a, (np.integer, np.floating)) and got.itemsize == dtype.itemsize and (
                got.kind == "f") == (dtype.kind == "f"), f"{name} argument {i}: {dtype} takes a numpy {dtype}, not {type(a)}"


class DevArray(np.ndarray):
    """A numpy array standing in for a device array."""

    def __new__(cls, shape, dtype=float, memptr=None):
        if memptr is not None:  # cupy.ndarray(shape, dtype, memptr) over a module global
            assert memptr.dtype == np.dtype(dtype) and memptr.shape == tuple(np.atleast_1d(shape))
            return memptr
        return np.zeros(shape, dtype).view(cls)

    @property
    def data(self):  # cupy.ndarray.data is a MemoryPointer: the backend reads .ptr (alignment, cuBLAS)
        return _MemoryPointer(self)

    def set(self, arr):
        self[...] = arr
        time.sleep(1e-4)  # a host-to-device copy takes a while: other host threads run meanwhile

    def get(self):
        return np.array(self)


class _MemoryPointer:
    """cupy.cuda.MemoryPointer of a DevArray: its address, and device-to-device copies between two."""

    def __init__(self, a: np.ndarray):
        self.a, self.ptr = a, a.ctypes.data

    def copy_from_device_async(self, src: "_MemoryPointer", size: int, stream=None) -> None:
        ctypes.memmove(self.ptr, src.ptr, size)


def dev(a, dtype=None):
    return np.array(a, dtype=dtype).view(DevArray)


def _ptr(a):
    return np.asarray(a).ctypes.data_as(ctypes.c_void_p)


class FakeModule:
    simt = None  # the SIMT build of product.cu (ctypes), set by _host_libraries where a C++20 compiler exists
    wgmma = None  # the SIMT build of product_wgmma.cu (wgmma_host.cpp), likewise
    chain = None  # the SIMT build of chain.cu (chain_host.cpp), likewise
    # launches of more multiply-adds run the numpy model instead of the SIMT builds, None: no limit (the
    # dry run of tests/gpu sets one: a software MMA on CPU threads does ~10^6 a second)
    simt_max_macs = None

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
            check_launch_args(name, args)  # each a device array, None or a numpy scalar, as the C parameter
            self.launches.append(name)
            with _LAUNCH_LOCK:  # one launch at a time, as on one stream: the SIMT builds keep global state
                self._emulate(name, grid, block, args, shared_mem)

        return launch

    def _emulate(self, name, grid, block, args, shared_mem):
        method = "_rns_product3m" if name.startswith("rns_product3m") else (
                "_rns_product" if name.startswith("rns_product") else "_" + name)
        getattr(self, method)(grid, block, args, shared_mem, name)

    def _small(self, macs: int) -> bool:
        return self.simt_max_macs is None or macs <= self.simt_max_macs

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
        if self.simt is not None and self._small(M * int(n_in) * int(n_out) * grid[2]):
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
        if self.wgmma is not None and self._small(int(M) * int(N) * int(K) * grid[2]):
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
        if self.simt is not None and self._small(M * int(n_in) * int(n_out) * grid[2]):
            u = ctypes.c_uint
            assert self.simt.emu_product(bn, u(grid[0]), u(grid[1]), u(grid[2]), _ptr(X), _ptr(A), _ptr(out), int(pre),
                                         int(n_in), int(post), int(n_out), ctypes.c_int64(xplane),
                                         ctypes.c_int64(oplane), _ptr(P), _ptr(IP), _ptr(H), _ptr(C16)) == 0
            return
        for l in range(grid[2]):
            Xl = np.asarray(X[l * xplane : l * xplane + M * n_in]).reshape(pre, n_in, post).astype(np.int64)
            acc = np.einsum("jk,akt->ajt", A[l].astype(np.int64), Xl)
            out[l * oplane : l * oplane + pre * n_out * post] = arith.centered_mod(acc, int(P[l])).reshape(-1)


class _Event:
    """cupy.cuda.Event: launches complete when they return here, so an event is done once recorded."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.recorded = False
        self.t = None

    def record(self, stream=None):
        self.recorded, self.t = True, time.perf_counter()

    def synchronize(self):
        pass


def _elapsed_ms(a: _Event, b: _Event) -> float:
    return (b.t - a.t) * 1e3


class _Stream:
    """cupy.cuda.Stream: one, in order; waiting on an event checks that it was recorded."""

    def wait_event(self, event):
        assert isinstance(event, _Event) and event.recorded, "waiting on an event that was never recorded"

    def synchronize(self):
        pass


_STREAM = _Stream()


def _host_libraries(root: Path):
    """The host build of the per-entry arithmetic and the SIMT builds of the MMA kernels (None where no C++20)."""
    lib = ctypes.CDLL(str(build.host_library(cache=root / "host-lib")))
    lib.h_decode_fp64.restype = ctypes.c_int
    lib.h_drop_extend.restype = ctypes.c_int
    lib.h_decode_exact.restype = ctypes.c_int
    for attr, make in (("simt", build.simt_library), ("wgmma", build.wgmma_library),
                       ("chain", build.chain_simt_library)):
        try:
            setattr(FakeModule, attr, ctypes.CDLL(str(make(cache=root / f"{attr}-lib"))))
        except build.KernelBuildError:  # pragma: no cover - no C++20 compiler: the numpy models
            setattr(FakeModule, attr, None)
    return lib


def _on_device(f):
    """numpy's ``f`` with array and scalar results returned as DevArrays."""

    def call(*args, **kwargs):
        r = f(*args, **kwargs)
        return np.asarray(r).view(DevArray) if isinstance(r, (np.ndarray, np.generic)) else r

    return call


class _SourceModule:
    """cupy.RawModule(code=...): its kernels' launches are recorded and do nothing."""

    def __init__(self, launches: list, code: str):
        self.launches, self.signatures = launches, kernel_signatures(code)

    def get_function(self, name):
        def launch(grid, block, args, shared_mem=0):
            check_launch_args(name, args, self.signatures)
            self.launches.append(name)

        return launch


def _module(lib, launches: list) -> types.ModuleType:
    cp = types.ModuleType("cupy")
    cp.ndarray = DevArray
    cp.asarray = lambda a, dtype=None: a if isinstance(a, DevArray) and dtype is None else dev(a, dtype)
    cp.asnumpy = lambda a: np.array(a)
    cp.empty = lambda shape, dtype=float: np.empty(shape, dtype).view(DevArray)
    cp.zeros = lambda shape, dtype=float: np.zeros(shape, dtype).view(DevArray)
    cp.broadcast_to = lambda a, shape: np.broadcast_to(a, shape).view(DevArray)
    props = {"major": 9, "minor": 0, "name": b"Fake H200", "multiProcessorCount": 132, "l2CacheSize": 60 << 20}
    cp.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, getDeviceProperties=lambda i: props),
        Device=lambda: types.SimpleNamespace(id=0, synchronize=lambda: None),
        Event=_Event,
        get_elapsed_time=_elapsed_ms,
        get_current_stream=lambda: _STREAM,
    )
    cp.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
    # a module from a cubin runs the emulations; one from CUDA source (a benchmark's micro kernels) only
    # records its launches: the stand-in compiles no CUDA C++
    cp.RawModule = lambda path=None, code=None: (
        FakeModule(path, lib, launches) if path is not None else _SourceModule(launches, code))
    cp.random = types.SimpleNamespace(**{
        name: _on_device(getattr(np.random, name)) for name in ("random", "randint", "standard_normal", "uniform")})

    def numpy_fallback(name: str):
        # everything else (dtypes, nan, matmul, fmod, Dask's take and nannumel, ...) is numpy's, with arrays
        # and reductions returned as device arrays, as CuPy returns them
        f = getattr(np, name)
        return _on_device(f) if callable(f) and not isinstance(f, type) else f

    cp.__getattr__ = numpy_fallback  # a module's __getattr__ (PEP 562) answers the names it lacks
    return cp


def install(root: Path, cache: Path, device_arrays_are_cupy: bool = False, simt_max_macs: int | None = None):
    """Put the stand-in in ``sys.modules['cupy']`` and point the kernel cache at ``cache``.

    Returns ``(cupy module, launches, restore)``: ``launches`` lists every
    kernel name launched, ``restore()`` undoes both changes. With
    ``device_arrays_are_cupy`` a :class:`DevArray` reports module ``cupy``,
    so the library takes it for CuPy input (the dry run of tests/gpu);
    ``simt_max_macs`` sends larger product launches to the numpy model.
    Raises :class:`rnstensor.kernels.KernelBuildError` without NVRTC or a
    host C++ compiler.
    """
    build.nvrtc_version()
    lib = _host_libraries(Path(root))
    launches: list = []
    saved = sys.modules.get("cupy")
    old_cache = os.environ.get("RNSTENSOR_KERNEL_CACHE")
    old_module, old_limit = DevArray.__module__, FakeModule.simt_max_macs
    FakeModule.simt_max_macs = simt_max_macs
    sys.modules["cupy"] = cp = _module(lib, launches)
    os.environ["RNSTENSOR_KERNEL_CACHE"] = str(cache)
    if device_arrays_are_cupy:
        DevArray.__module__ = "cupy"

    def restore() -> None:
        DevArray.__module__, FakeModule.simt_max_macs = old_module, old_limit
        if saved is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = saved
        if old_cache is None:
            os.environ.pop("RNSTENSOR_KERNEL_CACHE", None)
        else:
            os.environ["RNSTENSOR_KERNEL_CACHE"] = old_cache

    return cp, launches, restore
