"""The CUDA backend: CuPy arrays and the NVRTC-built kernels of ``rnstensor.kernels``, bit-identical to the CPU backend.

CuPy is imported when the backend is created, never at import time, so this
module imports on any machine. Arrays: CuPy in, CuPy out, nothing copied to the
host; NumPy in (the layers above still hand NumPy arrays to every backend),
the data is moved to the device for the call and the result comes back as
NumPy. Kernels are compiled for the device's arch (``sm_90a`` on Hopper) by
:func:`rnstensor.kernels.compile_module` (cached on disk) and loaded with
``cupy.RawModule``. The exact tables are built on the host once per basis
(``rnstensor.kernels.tables``) and kept on the device.

Status: written without a GPU; its kernels' arithmetic is tested on the host
(tests/test_kernels_host.py) and the backend itself by tests/gpu/ where a GPU
exists. ``decode(mode='exact')`` runs on the host (CPU backend) only for a
factor wider than the kernel's limbs (about 900 bits).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from typing import Optional

import numpy as np

from .. import arith
from ..arrays import device_module as _cupy
from ..basis import Basis
from . import elementwise_shape, exponent_runs, matmul_shape, product_layout
from ..kernels import build, tables
from .cuda_device import cuda_available, cuda_unavailable_reason, describe, device_info

__all__ = [
    "CudaBackend",
    "cuda_available",
    "cuda_unavailable_reason",
    "device_info",
    "describe",
    "PRODUCT_ENGINES",
    "PRODUCT_THRESHOLDS",
    "choose_product_engine",
    "wgmma_fits",
    "cublas_fits",
]

_BNS = (8, 16, 32, 64)
# int32 MMA accumulation is exact for 131071 terms; cuBLAS calls stay below it
_CUBLAS_MAX_K = 131071
_INT31 = (1 << 31) - 1
# columns per product launch: the kernel's int32 column index m0 + 127 must not overflow
_MAX_COLS = (1 << 31) - 256


# ----- the product engine -------------------------------------------------------------------------

#: ``product_engine`` values: 'auto' picks per shape (:func:`choose_product_engine`); the others force one
#: engine wherever its layout allows it and fall back to the mma.sync kernel elsewhere.
PRODUCT_ENGINES = ("auto", "mma", "wgmma", "cublas")

#: Thresholds of ``product_engine='auto'``. TO BE MEASURED ON THE GPU: these are first guesses from the tile
#: shapes and the bytes each engine moves, not measurements; benchmarks/bench_gpu_product.py measures the
#: crossovers (write its numbers here). Override per backend with ``CudaBackend(product_thresholds={...})``
#: (a key set to ``math.inf`` switches that engine off in 'auto'), or force one engine with
#: ``product_engine=`` / ``$RNSTENSOR_PRODUCT_ENGINE``. "macs" counts L * pre * post * n_out * n_in.
PRODUCT_THRESHOLDS: dict[str, float] = {
    # wgmma (sm_90a; the last axis, n_in % 16 == 0): 128-row x 64/128-column tiles. Below these the grid
    # cannot fill 132 SMs or the operator is too narrow for a 64-wide tile, and mma.sync does as well.
    "wgmma_min_macs": 2.0**30,
    "wgmma_min_n_out": 64,
    "wgmma_min_k": 128,
    # cuBLAS INT8 (where its layout allows): an int32 round trip and a reduction launch (9 bytes per output
    # entry against 1) that only long contractions amortize; only where wgmma does not run (never on
    # sm_90a when both fit).
    "cublas_min_macs": 2.0**32,
    "cublas_min_n_out": 256,
    "cublas_min_k": 1024,
}


def _thresholds(overrides: dict | None) -> dict:
    """:data:`PRODUCT_THRESHOLDS` with ``overrides`` applied (unknown keys are an error)."""
    t = dict(PRODUCT_THRESHOLDS)
    if overrides:
        unknown = set(overrides) - set(t)
        if unknown:
            raise ValueError(f"product_thresholds: unknown keys {sorted(unknown)}; known: {sorted(t)}")
        t.update({k: float(v) for k, v in overrides.items()})
    return t


def wgmma_fits(arch: str, pre: int, n_in: int, post: int, n_out: int, L: int) -> bool:
    """Whether the wgmma kernel (product_wgmma.cu) can run this product: sm_90a, the last axis, ``n_in % 16 == 0``.

    (The kernel reads K-major int8 tiles in 16-byte cp.async chunks; plane and row counts fit its grid.)
    The operand pointers must also be 16-byte aligned (checked at launch).
    """
    # rows and operator rows index in int32 inside the kernel (m0 + 127): the same limit as the mma.sync columns
    return (arch == "sm_90a" and post == 1 and n_in > 0 and n_in % 16 == 0 and 0 < pre <= _MAX_COLS
            and 0 < n_out <= _MAX_COLS and n_in <= _INT31 and 0 < L <= 65535 and -(-n_out // 64) <= 65535)


def cublas_fits(pre: int, n_in: int, post: int, n_out: int) -> bool:
    """Whether cuBLAS INT8 GEMM + the reduction can run this product (see ``CudaBackend._product_cublas``)."""
    if n_in > _CUBLAS_MAX_K or n_in % 4 or n_in == 0:
        return False
    return (post == 1 and pre <= _INT31 and n_out <= _INT31) or (pre == 1 and post % 4 == 0 and post <= _INT31)


def choose_product_engine(arch: str, pre: int, n_in: int, post: int, n_out: int, L: int = 1,
                          thresholds: dict | None = None) -> str:
    """The engine ``product_engine='auto'`` uses for a product of this shape: ``'wgmma'``, ``'cublas'`` or ``'mma'``.

    wgmma where it fits (:func:`wgmma_fits`) and the shape is past the ``wgmma_*`` thresholds; else cuBLAS
    where it fits and the shape is past the ``cublas_*`` thresholds; else the mma.sync kernel, which runs
    every shape. ``thresholds`` overrides entries of :data:`PRODUCT_THRESHOLDS`.
    """
    t = _thresholds(thresholds)
    macs = float(L) * pre * post * n_out * n_in
    if (wgmma_fits(arch, pre, n_in, post, n_out, L) and macs >= t["wgmma_min_macs"]
            and n_out >= t["wgmma_min_n_out"] and n_in >= t["wgmma_min_k"]):
        return "wgmma"
    if (cublas_fits(pre, n_in, post, n_out) and macs >= t["cublas_min_macs"]
            and n_out >= t["cublas_min_n_out"] and n_in >= t["cublas_min_k"]):
        return "cublas"
    return "mma"


def _cublas_bindings():
    """CuPy's thin cuBLAS wrapper (``gemmEx``, ``gemmStridedBatchedEx``, pointer modes), or ``None``."""
    try:
        from cupy_backends.cuda.libs import cublas
    except ImportError:
        try:  # where a CuPy keeps it under cupy.cuda only
            from cupy.cuda import cublas
        except ImportError:
            return None
    return cublas


class CudaBackend:
    """INT8 tensor-core residue products and fused per-entry kernels on CuPy arrays; bit-identical to :class:`CpuBackend`.

    Parameters
    ----------
    product_engine : {'auto', 'mma', 'wgmma', 'cublas'}, optional
        Default ``$RNSTENSOR_PRODUCT_ENGINE`` or ``'mma'`` (until the engines
        are measured on a GPU). ``'auto'``: per shape, by
        :func:`choose_product_engine` and :data:`PRODUCT_THRESHOLDS`.
        ``'mma'``: the fused ``mma.sync`` kernel (product.cu) for every product.
        ``'wgmma'`` (sm_90a devices only): the fused Hopper wgmma kernel
        (product_wgmma.cu) where it fits (the last axis, ``n_in % 16 == 0``),
        the mma.sync kernel elsewhere.
        ``'cublas'``: ``cublasGemmStridedBatchedEx`` (INT8 in, INT32 out) plus
        a separate reduction kernel where the layout allows it (contracting
        the last axis with ``n_in % 4 == 0``, or the first axis of a 2-D
        tensor), the fused kernel elsewhere; the baseline for large shapes.
        Every engine computes the same bits.
    product_thresholds : dict, optional
        Overrides of :data:`PRODUCT_THRESHOLDS` for ``'auto'``.
    specialize_chains : {'auto', True, False}
        ``True``: the fused kernel is compiled once per program (a chain plan,
        a FEM operator) with the program as compile-time constants (unrolled
        loops, tables as immediates, digits in registers;
        :func:`rnstensor.kernels.fused.spec_header`), cached on disk.
        ``False``: one generic kernel reads every program from memory.
        ``'auto'`` (default): specialized up to
        :data:`rnstensor.kernels.fused.SPEC_MAX_OPS` ops (chains, the mass
        operator), generic beyond (the Poisson operator, whose unrolled build
        takes about two minutes to compile on 2 cores).
    """

    name = "cuda"
    #: GEMMs hand the product ``op(b)`` K-contiguous (C^T = B^T A^T, the TN layout), the layout the wgmma and cuBLAS
    #: INT8 engines read
    gemm_layout = "TN"

    def __init__(
        self, product_engine: str | None = None, product_thresholds: dict | None = None,
        specialize_chains: bool | str = "auto",
    ):
        source = "product_engine"
        if product_engine is None:
            # 'mma' until the engines are measured on a GPU ('auto' picks by untested thresholds)
            product_engine = os.environ.get("RNSTENSOR_PRODUCT_ENGINE") or "mma"
            source = "$RNSTENSOR_PRODUCT_ENGINE" if os.environ.get("RNSTENSOR_PRODUCT_ENGINE") else source
        if product_engine not in PRODUCT_ENGINES:
            raise ValueError(f"{source} must be one of {', '.join(map(repr, PRODUCT_ENGINES))}; got {product_engine!r}")
        _thresholds(product_thresholds)  # unknown keys fail here, not at the first product
        cp = _cupy()
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("the 'cuda' backend found no CUDA device; use backend 'cpu'")
        self._cp = cp
        self.xp = cp  # the array module it computes with
        info = device_info()
        self.device_name = info["name"]
        self.arch = info["arch"]
        if product_engine == "wgmma" and self.arch != "sm_90a":
            raise ValueError(
                f"{source}='wgmma' needs a Hopper device (sm_90a); this one ({self.device_name}) is {self.arch}: "
                "use 'auto', 'mma' or 'cublas'"
            )
        self.product_engine = product_engine
        self.product_thresholds = dict(product_thresholds or {})
        self._modules: dict = {}
        self._dev_tables: dict = {}
        if specialize_chains not in ("auto", True, False):
            raise ValueError(f"specialize_chains must be 'auto', True or False; got {specialize_chains!r}")
        self.specialize_chains = specialize_chains
        self._spec_modules: dict = {}
        self._drop_lock = threading.Lock()
        self._drop_done = None  # the event after the last drop_extend launch (its tables are in use until then)

    # ----- plumbing ---------------------------------------------------------------------------

    def _module(self, name: str, options: tuple = (), headers: dict | None = None):
        key = (name, options, tuple(sorted((headers or {}).items())))
        mod = self._modules.get(key)
        if mod is None:
            built = build.compile_module(name, self.arch, options, headers=headers)
            mod = self._cp.RawModule(path=str(built.path))
            self._modules[key] = mod
        return mod

    def _fn(self, module: str, name: str):
        return self._module(module).get_function(name)

    def built_kernels(self) -> dict[str, str]:
        """``{module: cubin path}`` of the modules built for this device (compiling them if needed)."""
        return {m: str(build.compile_module(m, self.arch).path) for m in build.modules_for(self.arch)}

    def constants(self, key, make):
        """A device copy of host tables ``make()`` (a tuple of arrays), made once per ``key`` and cached."""
        return self._dev(key, make)

    def _dev(self, key, make):
        """A device copy of host tables ``make()`` (a tuple of arrays), cached under ``key``."""
        hit = self._dev_tables.get(key)
        if hit is None:
            hit = tuple(self._cp.asarray(np.ascontiguousarray(a)) for a in make())
            if len(self._dev_tables) > 512:
                self._dev_tables.clear()
            self._dev_tables[key] = hit
        return hit

    def _in(self, *arrays):
        """Device arrays for the inputs, and whether the results go back to the host (no input was on the device)."""
        cp = self._cp
        host = not any(isinstance(a, cp.ndarray) for a in arrays)
        return [a if isinstance(a, cp.ndarray) else cp.asarray(a) for a in arrays], host

    def _contig(self, a, dtype=None):
        """``a`` C-contiguous (and of ``dtype``), copying only if needed; 0-d arrays stay 0-d."""
        if dtype is not None and a.dtype != dtype:
            a = a.astype(dtype)
        return a if a.flags.c_contiguous else a.copy(order="C")

    def _out(self, arr, host: bool):
        return self._cp.asnumpy(arr) if host else arr

    @staticmethod
    def _grid(n: int, block: int, cap: int = 1 << 20) -> int:
        return max(1, min(-(-n // block), cap))

    # ----- encode -------------------------------------------------------------------------

    def encode(self, x, exponent, moduli: Sequence[int], bits: int):
        cp = self._cp
        (xd,), host = self._in(x)
        xd = self._contig(xd, cp.float64)
        mods = tuple(int(p) for p in moduli)
        out = cp.empty((len(mods),) + xd.shape, cp.int8)
        # the runs are built on the device (a host exponent, small, is copied over)
        evd, inner = exponent_runs(exponent, xd.shape, cp)
        if not mods or xd.size == 0:
            return self._out(out, host)
        P, IP, H, CP, pw, pa, per = self._dev(("enc", mods), lambda: tables.encode_tables(mods))
        n = xd.size
        self._fn("entry", "rns_encode")(
            (self._grid(n, 256),), (256,),
            (xd.reshape(-1).view(cp.uint64), np.int64(n), evd, np.int64(inner), np.int32(len(mods)),
             P, IP, H, CP, pw, np.int32(pw.shape[1]), pa, per, out),
        )
        return self._out(out, host)

    # ----- products -----------------------------------------------------------------------

    def _product_args(self, op_planes, planes, moduli, axis, what="product"):
        """Checked device operands and the layout ``(op, X, L, pre, n_in, post, n_out, oshape)``."""
        cp = self._cp
        mods = tuple(int(p) for p in moduli)
        L = len(mods)
        op = self._contig(op_planes)
        X = self._contig(planes)
        if op.dtype != cp.int8 or X.dtype != cp.int8:
            raise TypeError(f"{what}: op_planes and planes must be int8; got {op.dtype} and {X.dtype}")
        axis, n_out, n_in, pre, post, oshape = product_layout(op.shape, X.shape, L, axis, what)
        return mods, op, X, L, pre, n_in, post, n_out, oshape

    def product(self, op_planes, planes, moduli: Sequence[int], axis: int):
        cp = self._cp
        (op_planes, planes), host = self._in(op_planes, planes)
        mods, op, X, L, pre, n_in, post, n_out, oshape = self._product_args(op_planes, planes, moduli, axis)
        out = cp.empty((L,) + oshape, cp.int8)
        if out.size == 0:
            return self._out(out, host)
        if n_in == 0:
            out[...] = 0
            return self._out(out, host)
        consts = self._dev(("red", mods), lambda: tables.reduce_consts(mods))
        engine = self.product_engine_for(pre, n_in, post, n_out, L)
        if engine == "wgmma" and self._product_wgmma(op, X, out, pre, n_in, post, n_out, L, consts):
            return self._out(out, host)
        if engine == "cublas" and self._product_cublas(op, X, out, pre, n_in, post, n_out, L, consts):
            return self._out(out, host)
        self._product_mma(op, X, out, pre, n_in, post, n_out, L, consts)
        return self._out(out, host)

    def product_engine_for(self, pre: int, n_in: int, post: int, n_out: int, L: int) -> str:
        """The engine :meth:`product` tries first for a tensor seen as ``(L, pre, n_in, post)`` and ``n_out`` rows.

        ``'wgmma'`` and ``'cublas'`` still fall back to ``'mma'`` where the layout or alignment does not allow them.
        """
        if self.product_engine == "auto":
            return choose_product_engine(self.arch, pre, n_in, post, n_out, L, self.product_thresholds)
        return self.product_engine

    def product_3m(self, op_re, op_im, re, im, moduli: Sequence[int], axis: int):
        """The exact 3M complex mode product in one fused kernel: ``(out_re, out_im)`` residue planes.

        Equal bit for bit to the composition of contract calls
        ``P0 = product(op_re, re)``, ``P1 = product(op_im, im)``,
        ``P2 = product(add(op_re, op_im), add(re, im))``,
        ``out_re = add(P0, P1, subtract=True)``, ``out_im = P2 - P0 - P1``
        ([2606.25453] Sec. IV-B): three K loops through one accumulator, the
        partial products kept as residues in registers.
        """
        cp = self._cp
        (op_re, op_im, re, im), host = self._in(op_re, op_im, re, im)
        mods, ore, xre, L, pre, n_in, post, n_out, oshape = self._product_args(op_re, re, moduli, axis, "product_3m")
        _, oim, xim, *_ = self._product_args(op_im, im, moduli, axis, "product_3m")
        if oim.shape != ore.shape or xim.shape != xre.shape:
            raise ValueError(f"product_3m: real and imaginary parts differ in shape: {ore.shape}/{oim.shape}, {xre.shape}/{xim.shape}")
        out_re = cp.empty((L,) + oshape, cp.int8)
        out_im = cp.empty((L,) + oshape, cp.int8)
        if out_re.size == 0 or n_in == 0:
            out_re[...] = 0
            out_im[...] = 0
            return self._out(out_re, host), self._out(out_im, host)
        osum = self.add(ore, oim, mods)
        xsum = self.add(xre, xim, mods)
        consts = self._dev(("red", mods), lambda: tables.reduce_consts(mods))
        if post > _MAX_COLS or n_in > _INT31 or n_out > _INT31:
            raise ValueError(f"product_3m: dimensions beyond 2**31 - 1 are not supported on the GPU (post {post}, n {n_in})")
        bn = 8 if n_out <= 8 else 32  # the 3M kernels come in two tile widths
        fn = self._fn("product", f"rns_product3m_n{bn}")
        xplane, oplane = pre * n_in * post, pre * n_out * post
        flat = [a.reshape(-1) for a in (xre, xim, xsum)]
        outs = [out_re.reshape(-1), out_im.reshape(-1)]
        rows = max(1, _MAX_COLS // post)
        for a0 in range(0, pre, rows):
            pc = min(rows, pre - a0)
            xo, oo = a0 * n_in * post, a0 * n_out * post
            grid = (-(-(pc * post) // 128), -(-n_out // bn), L)
            fn(grid, (128,),
               (*(f[xo:] for f in flat), ore, oim, osum, *(o[oo:] for o in outs), np.int32(pc), np.int32(n_in),
                np.int32(post), np.int32(n_out), np.int64(xplane), np.int64(oplane), *consts))
        return self._out(out_re, host), self._out(out_im, host)

    def _product_mma(self, op, X, out, pre, n_in, post, n_out, L, consts):
        if post > _MAX_COLS or n_in > _INT31 or n_out > _INT31:
            raise ValueError(f"product: dimensions beyond 2**31 - 1 are not supported on the GPU (post {post}, n {n_in})")
        bn = next((b for b in _BNS if b >= n_out), 64)
        fn = self._fn("product", f"rns_product_n{bn}")
        xplane, oplane = pre * n_in * post, pre * n_out * post
        Xf, Of = X.reshape(-1), out.reshape(-1)
        # the kernel indexes columns pre * post in int32: split pre where needed
        rows = max(1, _MAX_COLS // post)
        for a0 in range(0, pre, rows):
            pc = min(rows, pre - a0)
            M = pc * post
            grid = (-(-M // 128), -(-n_out // bn), L)
            fn(grid, (128,),
               (Xf[a0 * n_in * post:], op, Of[a0 * n_out * post:], np.int32(pc), np.int32(n_in), np.int32(post),
                np.int32(n_out), np.int64(xplane), np.int64(oplane), *consts))

    def _product_wgmma(self, op, X, out, pre, n_in, post, n_out, L, consts) -> bool:
        """The Hopper wgmma kernel (product_wgmma.cu) on the last axis; False where it does not fit.

        out[l, a, j] = [sum_k op[l, j, k] X[l, a, k]]_p is the kernel's C = X A^T with M = pre, N = n_out,
        K = n_in; it wants 16-byte aligned operands (cp.async of 16 bytes) and n_in % 16 == 0.
        """
        if not wgmma_fits(self.arch, pre, n_in, post, n_out, L):
            return False
        if int(X.data.ptr) % 16 or int(op.data.ptr) % 16:
            return False  # a view at an odd offset: the mma.sync kernel reads any alignment
        bn = 64 if n_out <= 64 else 128
        fn = self._fn("product_wgmma", f"rns_gemm_wgmma_n{bn}")
        grid = (-(-pre // 128), -(-n_out // bn), L)
        fn(grid, (256,),
           (X, op, out, np.int32(pre), np.int32(n_out), np.int32(n_in), np.int64(pre * n_in), np.int64(n_out * n_in),
            np.int64(pre * n_out), *consts))
        return True

    def _product_cublas(self, op, X, out, pre, n_in, post, n_out, L, consts) -> bool:
        """cuBLAS INT8 GEMM (int32 out) + the reduction kernel; False where the layout does not allow it."""
        cp = self._cp
        cublas = _cublas_bindings()
        if cublas is None:  # a CuPy without its cuBLAS bindings: the fused kernel computes the same bits
            return False

        if n_in > _CUBLAS_MAX_K or n_in % 4:
            return False
        OP_N, OP_T = 0, 1
        R8I = getattr(cp.cuda.runtime, "CUDA_R_8I", 3)
        R32I = getattr(cp.cuda.runtime, "CUDA_R_32I", 10)
        COMPUTE_32I = getattr(cublas, "CUBLAS_COMPUTE_32I", 72)
        if post == 1:
            # out (pre, n_out) row-major = column-major (n_out x pre): op^T (TN) times X
            if pre > _INT31 or n_out > _INT31:
                return False
            m, n, ta, tb = n_out, pre, OP_T, OP_N
            A, lda, sa, B, ldb, sb, ldc = op, n_in, n_out * n_in, X, n_in, pre * n_in, n_out
        elif pre == 1 and post % 4 == 0:
            # out (n_out, post) row-major = column-major (post x n_out): X (NN) times op
            m, n, ta, tb = post, n_out, OP_N, OP_N
            A, lda, sa, B, ldb, sb, ldc = X, post, n_in * post, op, n_in, n_out * n_in, post
        else:
            return False
        acc = cp.empty((L, out[0].size), cp.int32)
        one = np.array(1, np.int32)
        zero = np.array(0, np.int32)
        handle = cp.cuda.device.get_cublas_handle()
        mode = None
        try:
            # alpha and beta are host int32 scalars
            if hasattr(cublas, "getPointerMode"):
                mode = cublas.getPointerMode(handle)
                cublas.setPointerMode(handle, getattr(cublas, "CUBLAS_POINTER_MODE_HOST", 0))
            cublas.gemmStridedBatchedEx(
                handle, ta, tb, m, n, n_in, one.ctypes.data, A.data.ptr, R8I, lda, sa, B.data.ptr, R8I, ldb, sb,
                zero.ctypes.data, acc.data.ptr, R32I, ldc, m * n, L, COMPUTE_32I, -1,
            )
        except Exception:
            return False
        finally:
            if mode is not None:
                cublas.setPointerMode(handle, mode)
        total = acc.size
        self._fn("product", "rns_reduce_i32")(
            (self._grid(total, 256),), (256,), (acc, out, np.int64(acc.shape[1]), np.int32(L), *consts)
        )
        return True

    def matmul(self, a_planes, b_planes, moduli: Sequence[int]):
        """Batched residue matrix product (the einsum GEMM step): float64 GEMMs, exact, then the centered reduction.

        Every product of two residues is at most ``2**14`` and every partial
        sum an integer below ``k * 2**14 < 2**53`` (``k < 2**39``), so cuBLAS
        DGEMM computes the integer sums exactly in any order; ``fmod`` is exact.
        """
        cp = self._cp
        mods = tuple(int(p) for p in moduli)
        L = len(mods)
        (a, b), host = self._in(a_planes, b_planes)
        if a.dtype != cp.int8 or b.dtype != cp.int8:
            raise TypeError(f"matmul: planes must be int8; got {a.dtype} and {b.dtype}")
        _, _, K, _ = matmul_shape(a.shape, b.shape, L)
        if K >= 1 << 39:
            raise ValueError(f"matmul: k = {K} exceeds the exact float64 accumulation limit 2**39")
        acc = cp.matmul(a.astype(cp.float64), b.astype(cp.float64))
        (p,) = self._dev(("moduli_f64", mods), lambda: (np.array(mods, np.float64),))
        p = p.reshape((L,) + (1,) * (acc.ndim - 1))
        r = cp.fmod(acc, p)
        r = cp.where(r >= cp.floor((p + 1) / 2), r - p, r)
        r = cp.where(r < -cp.floor(p / 2), r + p, r)
        return self._out(r.astype(cp.int8), host)

    # ----- elementwise --------------------------------------------------------------------

    def _elementwise(self, a, b, moduli, mode, what):
        cp = self._cp
        mods = tuple(int(p) for p in moduli)
        L = len(mods)
        (a, b), host = self._in(a, b)
        if a.dtype != cp.int8 or b.dtype != cp.int8:
            raise TypeError(f"{what}: residue planes must be int8; got {a.dtype} and {b.dtype}")
        shape = elementwise_shape(a.shape, b.shape, L, mode, what)
        sa, sb = a.shape[1:], b.shape[1:]
        out = cp.empty((L,) + shape, cp.int8)
        if out.size == 0:
            return self._out(out, host)
        nd = len(shape)
        A = self._contig(cp.broadcast_to(a.reshape((L,) + (1,) * (nd - len(sa)) + sa), out.shape))
        B = self._contig(cp.broadcast_to(b.reshape((L,) + (1,) * (nd - len(sb)) + sb), out.shape))
        P, IP, H = self._dev(("mod", mods), lambda: tables.mod_consts(mods))
        n = out[0].size
        self._fn("entry", "rns_elementwise")(
            (self._grid(out.size, 256),), (256,), (A, B, out, np.int64(n), np.int32(L), np.int32(mode), P, IP, H)
        )
        return self._out(out, host)

    def hadamard(self, planes, field_planes, moduli: Sequence[int]):
        return self._elementwise(planes, field_planes, moduli, 0, "hadamard")

    def add(self, a, b, moduli: Sequence[int], subtract: bool = False):
        return self._elementwise(a, b, moduli, 2 if subtract else 1, "add")

    # ----- drop and base extension --------------------------------------------------------

    def drop_extend(self, planes, active: Sequence[int], basis: Basis, drops, extend: bool):
        cp = self._cp
        active = tuple(int(p) for p in active)
        if isinstance(drops, (int, np.integer)) and drops < 0:
            raise ValueError(f"drop_extend: drops must be a non-negative count or a tuple of moduli; got {drops}")
        (X,), host = self._in(planes)
        if X.dtype != cp.int8:
            raise TypeError(f"planes must be int8; got {X.dtype}")
        if X.ndim < 1 or X.shape[0] != len(active):
            raise ValueError(f"planes must have shape (L, ...) with L = {len(active)}; got {X.shape}")
        order = arith.drop_order(active, drops)
        shape = X.shape[1:]
        if not order and not extend:
            return self._out(X.copy(), host), active
        N = math.prod(shape)
        if len(order) >= len(active) or N == 0:
            out, act = arith.drop_extend_ref(cp.asnumpy(X), active, basis, drops, extend)
            return self._out(cp.asarray(out), host), act
        ib, fb, out_active, ndig, nrem = tables.drop_tables(active, basis.moduli, drops, extend)
        if ib.size > tables.DROP_IB_MAX or fb.size > tables.DROP_FB_MAX:
            raise ValueError(f"drop_extend: tables for {len(active)} moduli exceed the kernel's constant bank")
        mod = self._module("entry")
        cib = cp.ndarray((tables.DROP_IB_MAX,), cp.int32, mod.get_global("rns_drop_ib"))
        cfb = cp.ndarray((tables.DROP_FB_MAX,), cp.float32, mod.get_global("rns_drop_fb"))
        Xc = self._contig(X).reshape(len(active), N)
        out = cp.empty((len(out_active), N), cp.int8)
        block = 128 if (ndig + nrem) * 128 * 4 <= 48 * 1024 else 64
        # the tables are one __constant__ bank per module, filled from device copies made once per drop
        # schedule (no host copy per call). Callers on other threads (Dask's threaded scheduler) take turns,
        # and the copies wait on the device until the previous launch, on whatever stream, is done reading it
        dib, dfb = self._dev(("drop", active, tuple(basis.moduli), order, extend), lambda: (ib, fb))
        with self._drop_lock:
            stream = cp.cuda.get_current_stream()
            if self._drop_done is not None:
                stream.wait_event(self._drop_done)
            cib.data.copy_from_device_async(dib.data, ib.nbytes, stream)
            cfb.data.copy_from_device_async(dfb.data, fb.nbytes, stream)
            mod.get_function("rns_drop_extend")(
                (self._grid(N, block),), (block,), (Xc, np.int64(N), out), shared_mem=(ndig + nrem) * block * 4
            )
            self._drop_done = cp.cuda.Event(block=False, disable_timing=True)
            self._drop_done.record(stream)
        return self._out(out.reshape((len(out_active),) + shape), host), tuple(out_active)

    # ----- the fused chain --------------------------------------------------------------------

    def _specializes(self, program) -> bool:
        """Whether ``program`` runs in its own specialized build (else the generic one), per :attr:`specialize_chains`."""
        from ..kernels import fused

        spec = self.specialize_chains
        return spec is True or (spec == "auto" and fused.specialize_by_default(program))

    def _chain_module(self, program):
        """The loaded module of ``program``'s kernel: its own specialized build, or the generic one."""
        from ..kernels import fused

        if not self._specializes(program):
            return self._module("chain")
        hit = self._spec_modules.get(program)
        if hit is None:  # the header is generated on a miss only (milliseconds: not on every call)
            if len(self._spec_modules) > 64:
                self._spec_modules.clear()
            hit = self._spec_modules[program] = self._module("chain", fused.SPEC_OPTIONS, fused.spec_header(program))
        return hit

    def prebuild(self, programs: Sequence = (), jobs: int | None = None) -> int:
        """Compile this device's modules and the fused kernels of ``programs`` side by side, ahead of use.

        The first call of a plan on this backend otherwise waits for NVRTC:
        about 5-25 s for each specialized fused kernel and 30 s for the
        modules, one after the other. This builds them all at once, one
        process per core (:func:`rnstensor.kernels.build.compile_modules`),
        into the disk cache that later calls (and later processes) read.

        Parameters
        ----------
        programs : sequence of ChainProgram
            Fused programs (:func:`rnstensor.kernels.fused.compile_request` of
            a plan's :meth:`~rnstensor.ChainPlan.fusion_request` or a FEM
            operator's); each gets the build :attr:`specialize_chains` selects (the
            generic module is among this device's modules).
        jobs : int, optional
            Worker processes (default: every core this process may use).

        Returns
        -------
        int
            The number of distinct builds (cached ones included).

        Examples
        --------
        >>> import numpy as np, rnstensor as rt
        >>> from rnstensor.kernels import fused
        >>> plan = rt.plan_chain([np.eye(8)] * 3, [0, 1, 2])
        >>> be = rt.backends.get_backend("cuda")  # doctest: +SKIP
        >>> be.prebuild([fused.compile_request(plan.fusion_request((8, 8, 8)))])  # doctest: +SKIP
        5
        """
        from ..kernels import fused

        requests = [(m, self.arch) for m in build.modules_for(self.arch)]
        for program in programs:
            if not isinstance(program, fused.ChainProgram):
                raise TypeError(
                    f"programs must hold ChainProgram objects (rnstensor.kernels.fused.compile_request(request), "
                    f"request = plan.fusion_request(shape) or op.fusion_request()); got {type(program).__name__}"
                )
            if self._specializes(program):
                requests.append(("chain", self.arch, fused.SPEC_OPTIONS, fused.spec_header(program)))
        return len({b.path for b in build.compile_modules(requests, jobs)})

    def compile_program(self, request, decode: str):
        """``(program, None)``: a :class:`~rnstensor.ir.lower.FusionRequest` (a chain plan's, an einsum's, a FEM
        operator's residue program) as :meth:`chain`'s kernel program, or ``(None, reason)``."""
        from ..kernels import fused  # noqa: PLC0415 - the kernels package imports the backends

        return self._on_this_device(fused.program_or_reason(lambda: fused.compile_request(request), decode))

    def fuses(self, program, tensors: int) -> Optional[str]:
        """Why :meth:`chain` should not run ``tensors`` tensors of ``program`` (``None``: it should; a block of
        threads per tensor group, so no size the device's own measurements have yet ruled out)."""
        return None

    def _on_this_device(self, found: tuple) -> tuple:
        """``found`` (``(program, reason)``), or ``(None, reason)`` where this device's arch cannot launch the program."""
        from ..kernels.limits import ARCH_LIMITS, launch_use  # noqa: PLC0415

        prog, why = found
        if prog is None or self.arch.rstrip("a") not in ARCH_LIMITS:  # an arch without a table: its launch says
            return found
        use = launch_use("rns_chain_fused", self.arch, prog.threads, prog.shared_bytes)
        return found if use.fits else (None, f"on this {self.arch} device: {use.problem}")

    def chain(self, program, x, decode: str, field=None, fexp=None):
        """A whole chain in one kernel (``chain.cu``): ``x`` ``(B, *program.in_shape)`` -> ``(B, *program.out_shape)``.

        ``program`` is :func:`rnstensor.kernels.fused.compile_request` of a
        front end's fusion request (a FEM operator's with its encoded ``field`` ``(planes, B, components, entries)`` int8 and the
        field's exponent per tensor ``fexp`` ``(B,)``); the result is bitwise
        ``plan.run(x, decode)`` on any backend. CuPy in,
        CuPy out; a non-finite input raises ``ValueError`` after the launch
        (the kernel flags it while it loads; reading the flag synchronizes).
        """
        cp = self._cp
        if decode not in ("fp64", "exact"):
            raise ValueError(f"decode must be 'fp64' or 'exact'; got {decode!r}")
        exact = decode == "exact"
        if exact and program.F is None:
            raise ValueError("this program's factor is too wide for the exact decode's limbs; run the plan unfused")
        (xd,), host = self._in(x)
        xd = self._contig(xd, cp.float64)
        if tuple(xd.shape[1:]) != tuple(program.in_shape):
            raise ValueError(f"x must have shape (B, *{program.in_shape}); got {xd.shape}")
        B = xd.shape[0]
        out = cp.empty((B,) + tuple(program.out_shape), cp.float64)
        if B == 0:
            return self._out(out, host)
        pi, pf, qd, ops, dexp = self._dev(
            ("chain", program, decode),
            lambda: (program.ints, program.floats, program.qd, program.ops,
                     program.dexp_exact if exact else program.dexp_fp64),
        )
        flags = cp.zeros(1, cp.int32)
        grid = -(-B // program.nb)
        name = "rns_chain_fused_exact" if exact else "rns_chain_fused"
        fn = self._chain_module(program).get_function(name)
        if program.shared_bytes > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = program.shared_bytes
        xb = xd.reshape(-1).view(cp.uint64)
        if program.nfield:
            if field is None or fexp is None:
                raise ValueError("this program has Hadamard steps: pass its field and the field's exponents")
            fd = self._contig(field if isinstance(field, cp.ndarray) else cp.asarray(field), cp.int8)
            fe = self._contig(fexp if isinstance(fexp, cp.ndarray) else cp.asarray(fexp), cp.int32)
            if fd.shape[1:] != (B, program.nfield, program.nq) or fe.shape != (B,):
                raise ValueError(f"field must be (planes, {B}, {program.nfield}, {program.nq}) and fexp ({B},); "
                                 f"got {fd.shape} and {fe.shape}")
            fargs = (fd, np.int64(B * program.nfield * program.nq), fe)
        else:  # never read (the program has no field components); CuPy takes no null pointers
            fargs = (*self._dev(("nofield",), lambda: (np.zeros(16, np.int8),)), np.int64(0),
                     *self._dev(("nofexp",), lambda: (np.zeros(1, np.int32),)))
        if exact:
            (F,) = self._dev(("flimbs", program), lambda: (program.F,))
            args = (xb, np.int64(B), out, pi, pf, qd, ops, dexp, F, np.int32(F.size), np.int32(program.fneg), *fargs,
                    flags)
        else:
            args = (xb, np.int64(B), out, pi, pf, qd, ops, dexp, np.float64(program.f), np.float64(program.g), *fargs, flags)
        fn((grid,), (program.threads,), args, shared_mem=program.shared_bytes)
        if int(flags.get()[0]):
            raise ValueError("X has non-finite entries (NaN or inf); residues hold finite values only")
        return self._out(out, host)

    # ----- decode -------------------------------------------------------------------------

    def decode(self, planes, active: Sequence[int], exponent, factor: int, mode: str):
        cp = self._cp
        active = tuple(int(p) for p in active)
        (X,), host = self._in(planes)
        shape = X.shape[1:]
        N = math.prod(shape)
        if mode not in ("fp64", "exact"):
            raise ValueError(f"decode: mode must be 'fp64' or 'exact'; got {mode!r}")
        exact = mode == "exact"
        if not active or N == 0 or (exact and int(factor) != 0 and not tables.exact_decode_fits(active, factor)):
            # nothing to launch, or a factor too wide for the kernel's limbs: the CPU backend on the host
            from .cpu import CpuBackend

            e = cp.asnumpy(exponent) if isinstance(exponent, cp.ndarray) else exponent
            res = CpuBackend().decode(cp.asnumpy(X), active, e, factor, mode)
            return self._out(cp.asarray(res), host)
        if exact and int(factor) == 0:
            exponent_runs(exponent, shape, cp)  # the same argument check
            return self._out(cp.zeros(shape, cp.float64), host)
        evd, inner = exponent_runs(exponent, shape, cp)
        ib, fb, qd = self._dev(("dec", active), lambda: tables.decode_tables(active))
        out = cp.empty(N, cp.float64)
        m = len(active)
        block = 128 if m * 128 * 4 <= 48 * 1024 else 64
        Xm = self._contig(X).reshape(m, N)
        if exact:
            Fh, t2, neg = tables.factor_limbs(int(factor))
            (F,) = self._dev(("flimbs", int(factor)), lambda: (Fh,))
            args = (Xm, np.int64(N), ib, fb, qd, F, np.int32(F.size), np.int32(neg), evd, np.int64(inner), np.int64(t2), out)
            name = "rns_decode_exact"
        else:
            f, g, k = arith.float_factor(factor)
            args = (Xm, np.int64(N), ib, fb, qd, np.float64(f), np.float64(g), evd, np.int64(inner), np.int64(k), out)
            name = "rns_decode_fp64"
        self._fn("entry", name)((self._grid(N, block),), (block,), args, shared_mem=m * block * 4)
        return self._out(out.reshape(shape), host)
