"""A stand-in for CuPy without a GPU: device arrays wrap numpy arrays, kernel launches run host builds of the kernels.

Device arrays (:class:`DevArray`) hold a numpy array behind CuPy's
interface; they are not numpy arrays. In strict mode (``install(...,
strict=True)``) they keep CuPy's rules: ``numpy.asarray(x)`` and numpy
operations mixing host and device arrays raise ``TypeError``. Every
host <-> device copy is recorded with its size in ``cupy.transfers``
(:class:`Transfers`), so a test can check that nothing data-sized crossed.

Each launch is checked (grid, block, shared memory, argument types) and
emulated: every kernel by the host SIMT build of its own source (CPU
threads, a software MMA: entry.cu, product.cu, product_wgmma.cu, chain.cu)
where a C++20 compiler exists; larger launches (``simt_max_macs``,
``simt_max_blocks``) and machines without one by the host build of the
kernels' per-entry arithmetic (rns_arith.cuh through ctypes) or a numpy model
of the kernel's indexing.

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
from rnstensor.kernels.layout import RC

__all__ = ["DevArray", "FakeModule", "Transfers", "dev", "install", "install_for_process", "installed",
           "kernel_signatures", "check_launch_args"]

_LAUNCH_LOCK = threading.Lock()


# C parameter types of the kernels (rns_arith.cuh's typedefs included) as numpy dtypes
_C_DTYPES = {
    "rns_i8": "i1", "signed char": "i1", "rns_u8": "u1", "unsigned char": "u1", "rns_i32": "i4", "int": "i4",
    "rns_u32": "u4", "unsigned": "u4", "unsigned int": "u4", "rns_i64": "i8", "long long": "i8",
    "rns_u64": "u8", "unsigned long long": "u8", "float": "f4", "double": "f8",
}
_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\(([^)]*)\)\s*)?([\w#]+)\s*\(([^)]*)\)')
_DEFINE = re.compile(r"^\s*#define\s+(\w+)\s+(\d+)\s*$", re.M)


def kernel_signatures(source: str) -> dict[str, list[tuple[np.dtype, bool]]]:
    """``{kernel name pattern: [(dtype, is pointer), ...]}`` of every ``extern "C" __global__`` kernel of a source.

    A name built by token pasting (``rns_product_n##BN``) becomes the regular
    expression ``rns_product_n\\w+``.
    """
    out = {}
    for _bounds, name, params in _KERNEL.findall(source.replace("\\\n", " ")):
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


def launch_bounds(source: str, defines: dict | None = None) -> dict[str, int]:
    """``{kernel name pattern: the most threads a block may have}`` from each kernel's ``__launch_bounds__``.

    A launch with more threads than its kernel was compiled for fails on the
    GPU (too many resources requested). Macro bounds are read from
    ``defines`` (``#define NAME number`` of the sources).
    """
    text = source.replace("\\\n", " ")
    names = dict(defines or {})
    names.update((k, int(v)) for k, v in _DEFINE.findall(text))
    out = {}
    for bounds, name, _params in _KERNEL.findall(text):
        if not bounds:
            continue
        first = bounds.split(",")[0].strip()
        value = int(first) if first.isdigit() else names.get(first)
        if value is not None:
            out[re.escape(name.split("##")[0]) + (r"\w+" if "##" in name else "")] = value
    return out


@functools.lru_cache(maxsize=None)
def _module_bounds() -> dict:
    texts = [p.read_text() for p in sorted(Path(build.source_dir()).glob("*.cu*"))]
    defines = {k: int(v) for t in texts for k, v in _DEFINE.findall(t)}
    out = {}
    for t in texts:
        out.update(launch_bounds(t, defines))
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


class Transfers:
    """Every host <-> device copy the stand-in sees: ``(direction, bytes, what)``, direction ``'h2d'`` or ``'d2h'``.

    Explicit copies (``cupy.asarray`` of a host array, ``.set``, ``.get``,
    ``cupy.asnumpy``), host arrays stored into or used to index device
    arrays, and scalars read back (``bool(x)``, ``int(x)``, ``x.item()``)
    are all recorded; outside strict mode so are implicit conversions
    (``numpy.asarray(device_array)``).
    """

    def __init__(self):
        self.events: list[tuple[str, int, str]] = []

    def record(self, direction: str, nbytes: int, what: str) -> None:
        self.events.append((direction, int(nbytes), what))

    def reset(self) -> None:
        self.events.clear()

    def total(self, direction: str | None = None) -> int:
        """Bytes moved (in ``direction``, or both)."""
        return sum(n for d, n, _ in self.events if direction in (None, d))

    def largest(self, direction: str | None = None) -> int:
        """The largest single copy in bytes (0 if none)."""
        return max((n for d, n, _ in self.events if direction in (None, d)), default=0)

    def at_least(self, nbytes: int) -> list[tuple[str, int, str]]:
        """The copies of ``nbytes`` or more (the data-sized ones, for a threshold of the caller's choice)."""
        return [e for e in self.events if e[1] >= nbytes]

    def __repr__(self) -> str:
        return f"Transfers({len(self.events)} copies, h2d {self.total('h2d')} B, d2h {self.total('d2h')} B)"


class _State:
    """What the installed stand-in enforces and records (one per process)."""

    strict = False
    transfers = Transfers()


_IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy array "
             "explicitly.")


def _host_operand(what: str):
    return TypeError(f"Unsupported type <class 'numpy.ndarray'> ({what}): CuPy does not mix host (NumPy) and "
                     "device arrays; move it with cupy.asarray or .get()")


def _unwrap(x, what: str):
    """Device arrays to the numpy arrays behind them (recursively in lists, tuples and dicts).

    A host ndarray among device operands is CuPy's ``TypeError`` in strict mode.
    """
    if isinstance(x, DevArray):
        return x._a
    if isinstance(x, np.ndarray):
        if _State.strict:
            raise _host_operand(what)
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, what) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v, what) for k, v in x.items()}
    return x


def _wrap(r):
    """numpy results as device arrays (scalars as 0-d arrays, as CuPy returns them)."""
    if isinstance(r, np.ndarray):
        return DevArray._wrap(r)
    if isinstance(r, np.generic):
        return DevArray._wrap(np.asarray(r))
    if isinstance(r, tuple):
        return tuple(_wrap(v) for v in r)
    if isinstance(r, list):
        return [_wrap(v) for v in r]
    return r


def _index(key):
    """An index into a device array: device index arrays unwrapped, host ones counted (CuPy copies them over)."""
    if isinstance(key, tuple):
        return tuple(_index(k) for k in key)
    if isinstance(key, DevArray):
        return key._a
    if isinstance(key, np.ndarray):
        _State.transfers.record("h2d", key.nbytes, "index array")
    return key


class DevArray:
    """A device array of the stand-in: a numpy array behind CuPy's interface, never a numpy array itself.

    ``numpy.asarray(x)`` and ufuncs mixing it with numpy arrays raise
    CuPy's ``TypeError`` in strict mode (:func:`install`); numpy functions
    and ufuncs on device arrays alone return device arrays (CuPy's
    ``__array_ufunc__`` / ``__array_function__``).
    """

    __slots__ = ("_a", "__weakref__")
    __array_priority__ = 100.0  # numpy's binary operators defer to ours

    def __new__(cls, shape=(), dtype=float, memptr=None):
        if memptr is not None:  # cupy.ndarray(shape, dtype, memptr) over a module global
            src = memptr.a if isinstance(memptr, _MemoryPointer) else memptr
            assert src.dtype == np.dtype(dtype) and src.shape == tuple(np.atleast_1d(shape))
            return src
        return cls._wrap(np.zeros(shape, dtype))

    @classmethod
    def _wrap(cls, a: np.ndarray) -> "DevArray":
        obj = object.__new__(cls)
        obj._a = a
        return obj

    # ----- numpy interoperation -----------------------------------------------------------------

    def __array__(self, dtype=None, copy=None):
        if _State.strict:
            raise TypeError(_IMPLICIT)
        _State.transfers.record("d2h", self._a.nbytes, "implicit numpy conversion")
        return self._a if dtype is None else self._a.astype(dtype)

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        args = _unwrap(inputs, f"numpy.{ufunc.__name__}")
        if ufunc is np.matmul and method == "__call__" and out is None and not kwargs:
            return _wrap(_device_matmul(*args))
        if out is not None:
            kwargs["out"] = _unwrap(out, f"numpy.{ufunc.__name__} out")
        r = getattr(ufunc, method)(*args, **kwargs)
        return out[0] if out is not None and len(out) == 1 else (out if out is not None else _wrap(r))

    def __array_function__(self, func, types, args, kwargs):
        return _wrap(func(*_unwrap(args, f"numpy.{func.__name__}"), **_unwrap(kwargs, f"numpy.{func.__name__}")))

    # ----- attributes -----------------------------------------------------------------------

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: DevArray._wrap(self._a.T))

    @property
    def real(self):
        return DevArray._wrap(self._a.real)

    @property
    def imag(self):
        return DevArray._wrap(self._a.imag)

    @property
    def data(self):  # cupy.ndarray.data is a MemoryPointer: the backend reads .ptr (alignment, cuBLAS)
        return _MemoryPointer(self)

    # ----- copies to and from the host ---------------------------------------------------------

    def get(self, stream=None, order="C", out=None):
        _State.transfers.record("d2h", self._a.nbytes, "get")
        return np.array(self._a, order=order)

    def set(self, arr, stream=None):
        arr = np.asarray(arr)
        _State.transfers.record("h2d", arr.nbytes, "set")
        self._a[...] = arr
        time.sleep(1e-4)  # a host-to-device copy takes a while: other host threads run meanwhile

    def _scalar(self):
        if self._a.size != 1:
            raise ValueError("only a one-element device array converts to a Python scalar")
        _State.transfers.record("d2h", self._a.itemsize, "scalar")
        return self._a.reshape(-1)[0]

    def item(self):
        return self._scalar().item()

    def tolist(self):
        _State.transfers.record("d2h", self._a.nbytes, "tolist")
        return self._a.tolist()

    def __bool__(self):
        return bool(self._scalar())

    def __int__(self):
        return int(self._scalar())

    def __float__(self):
        return float(self._scalar())

    def __complex__(self):
        return complex(self._scalar())

    def __index__(self):
        if self._a.dtype.kind not in "iu":
            raise TypeError("only integer device arrays can be used as an index")
        return int(self._scalar())

    # ----- views and copies on the device -------------------------------------------------------

    def reshape(self, *shape, order="C"):
        return DevArray._wrap(self._a.reshape(*shape, order=order))

    def transpose(self, *axes):
        return DevArray._wrap(self._a.transpose(*axes))

    def swapaxes(self, a, b):
        return DevArray._wrap(self._a.swapaxes(a, b))

    def squeeze(self, axis=None):
        return DevArray._wrap(self._a.squeeze(axis))

    def ravel(self, order="C"):
        return DevArray._wrap(self._a.ravel(order))

    def flatten(self, order="C"):
        return DevArray._wrap(self._a.flatten(order))

    def view(self, dtype=None):
        return DevArray._wrap(self._a.view(dtype))

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        return DevArray._wrap(self._a.astype(dtype, order=order, copy=copy))

    def copy(self, order="C"):
        return DevArray._wrap(self._a.copy(order=order))

    def conj(self):
        return DevArray._wrap(self._a.conj())

    conjugate = conj

    def fill(self, value):
        self._a.fill(value)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (_wrap(v) for v in self._a)

    def __getitem__(self, key):
        return _wrap(self._a[_index(key)])

    def __setitem__(self, key, value):
        if isinstance(value, DevArray):
            value = value._a
        elif isinstance(value, np.ndarray):  # CuPy copies a host value over
            _State.transfers.record("h2d", value.nbytes, "setitem")
        self._a[_index(key)] = value

    def __repr__(self):
        return "DevArray(" + repr(self._a)[6:]

    __hash__ = None

    def __neg__(self):
        return np.negative(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return np.absolute(self)

    def __invert__(self):
        return np.invert(self)


def _device_matmul(a, b):
    """``a @ b`` as the device computes it: numpy's, except float32 GEMMs (cuBLAS SGEMM), which sum in another order
    than the host's BLAS (here: the two halves of ``k`` apart, then added) and flush subnormal results to zero.

    So a decision the library takes from a float32 GEMM's last bits (the
    default GEMM width's measured magnitudes) meets, in the dry run, the
    difference it would meet on a GPU.
    """
    a, b = np.asarray(a), np.asarray(b)
    if not (a.dtype == b.dtype == np.float32 and a.ndim >= 2 and b.ndim >= 2 and a.shape[-1] >= 2):
        return np.matmul(a, b)
    h = a.shape[-1] // 2
    r = np.matmul(a[..., :h], b[..., :h, :]) + np.matmul(a[..., h:], b[..., h:, :])
    r[np.abs(r) < np.finfo(np.float32).tiny] = 0  # flush to zero, keeping the sign's zero positive like FTZ does
    return r


def _method(name: str):
    def method(self, *args, **kwargs):
        return _wrap(getattr(self._a, name)(*_unwrap(args, name), **_unwrap(kwargs, name)))

    method.__name__ = name
    return method


def _binary(ufunc, reflected: bool = False):
    if reflected:
        return lambda self, other: ufunc(other, self)
    return lambda self, other: ufunc(self, other)


def _inplace(ufunc):
    def op(self, other):
        ufunc(self, other, out=(self,))
        return self

    return op


# reductions and element-wise methods: numpy's, on the device
for _name in ("sum", "prod", "max", "min", "any", "all", "mean", "argmax", "argmin", "cumsum", "nonzero", "clip",
              "round", "dot", "take", "repeat"):
    setattr(DevArray, _name, _method(_name))
# arithmetic through the ufuncs (host operands refused in strict mode, as by CuPy)
for _name, _ufunc in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.true_divide),
                      ("floordiv", np.floor_divide), ("mod", np.remainder), ("pow", np.power), ("matmul", np.matmul),
                      ("and", np.bitwise_and), ("or", np.bitwise_or), ("xor", np.bitwise_xor),
                      ("lshift", np.left_shift), ("rshift", np.right_shift)):
    setattr(DevArray, f"__{_name}__", _binary(_ufunc))
    setattr(DevArray, f"__r{_name}__", _binary(_ufunc, True))
    setattr(DevArray, f"__i{_name}__", _inplace(_ufunc))
for _name, _ufunc in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                      ("gt", np.greater), ("ge", np.greater_equal)):
    setattr(DevArray, f"__{_name}__", _binary(_ufunc))
del _name, _ufunc


class _MemoryPointer:
    """cupy.cuda.MemoryPointer of a DevArray: its address, and device-to-device copies between two."""

    def __init__(self, a: "DevArray"):
        self.a, self.ptr = a, a._a.ctypes.data

    def copy_from_device_async(self, src: "_MemoryPointer", size: int, stream=None) -> None:
        ctypes.memmove(self.ptr, src.ptr, size)


def dev(a, dtype=None) -> DevArray:
    """A device copy of ``a`` (a host-to-device transfer, counted)."""
    a = np.array(a, dtype=dtype)
    _State.transfers.record("h2d", a.nbytes, "dev")
    return DevArray._wrap(a)


def _ptr(a):
    return np.asarray(a).ctypes.data_as(ctypes.c_void_p)


#: what the stand-in's device (a Hopper part) allows a launch: CUDA's limits for compute capability 9.0
DEVICE_ARCH = "sm_90"
GRID_MAX = (2**31 - 1, 65535, 65535)
BLOCK_MAX = 1024
DEFAULT_SHARED = 48 * 1024


class _Function:
    """cupy.RawModule.get_function's result: a launch checked against the device's limits, then emulated.

    A launch fails as on the GPU where its grid or block is out of range,
    its block exceeds the kernel's ``__launch_bounds__``, or it asks for
    more than 48 KiB of dynamic shared memory without the kernel's opt-in
    (``max_dynamic_shared_size_bytes``, which itself may not exceed the
    device's per-block limit).
    """

    def __init__(self, name: str, run):
        self.name, self._run, self._opt_in = name, run, 0

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self._opt_in

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value) -> None:
        from rnstensor.kernels.limits import arch_limits

        limit = arch_limits(DEVICE_ARCH).shared_per_block
        assert isinstance(value, (int, np.integer)) and 0 <= value <= limit, (
            f"{self.name}: cudaFuncSetAttribute(MaxDynamicSharedMemorySize, {value}) fails: this device allows at "
            f"most {limit} bytes a block")
        self._opt_in = int(value)

    def __call__(self, grid, block, args, shared_mem=0):
        assert 1 <= len(grid) <= 3 and all(isinstance(g, (int, np.integer)) and 0 < g <= m
                                            for g, m in zip(grid, GRID_MAX)), f"{self.name}: grid {grid} out of range"
        assert len(block) == 1 and block[0] % 32 == 0 and 0 < block[0] <= BLOCK_MAX, f"{self.name}: block {block}"
        bound = next((v for k, v in _module_bounds().items() if re.fullmatch(k, self.name)), None)
        assert bound is None or block[0] <= bound, (
            f"{self.name}: {block[0]} threads a block, but the kernel is compiled for at most {bound} (__launch_bounds__)")
        # above 48 KiB a kernel must have opted in (cudaFuncAttributeMaxDynamicSharedMemorySize)
        assert shared_mem <= max(DEFAULT_SHARED, self._opt_in), (
            f"{self.name}: {shared_mem} bytes of dynamic shared memory without opting in (at most {DEFAULT_SHARED}; "
            f"set max_dynamic_shared_size_bytes first)")
        self._run(grid, block, args, shared_mem)


class FakeModule:
    simt = None  # the SIMT build of product.cu (ctypes), set by _host_libraries where a C++20 compiler exists
    wgmma = None  # the SIMT build of product_wgmma.cu (wgmma_host.cpp), likewise
    chain = None  # the SIMT build of chain.cu (chain_host.cpp), likewise
    entry = None  # the SIMT build of entry.cu (entry_host.cpp), likewise
    # per-entry launches of more blocks run the kernels' per-entry arithmetic in a plain loop (host_check.cpp)
    # instead of entry.cu's grid on CPU threads (a barrier a block costs about as much as a block's work)
    simt_max_blocks = 16
    # launches of more multiply-adds run the numpy model instead of the SIMT builds, None: no limit (the
    # dry run of tests/gpu sets one: a software MMA on CPU threads does ~10^6 a second)
    simt_max_macs = None

    def __init__(self, path, lib, launches):
        data = open(path, "rb").read(4)
        assert data == b"\x7fELF", "RawModule must get a cubin"
        self.lib, self.launches = lib, launches
        self.globals = {  # __constant__ banks: device memory of the module, no copy
            "rns_drop_ib": DevArray._wrap(np.zeros(tables.DROP_IB_MAX, np.int32)),
            "rns_drop_fb": DevArray._wrap(np.zeros(tables.DROP_FB_MAX, np.float32)),
        }

    def get_global(self, name):
        return self.globals[name]

    def get_function(self, name):
        module = self

        def run(grid, block, args, shared_mem):
            check_launch_args(name, args)  # each a device array, None or a numpy scalar, as the C parameter
            module.launches.append(name)
            # the emulations see the numpy arrays behind the device arrays (the kernels write into them)
            raw = tuple(a._a if isinstance(a, DevArray) else a for a in args)
            with _LAUNCH_LOCK:  # one launch at a time, as on one stream: the SIMT builds keep global state
                module._emulate(name, grid, block, raw, shared_mem)

        return _Function(name, run)

    def _emulate(self, name, grid, block, args, shared_mem):
        method = "_rns_product3m" if name.startswith("rns_product3m") else (
                "_rns_product" if name.startswith("rns_product") else "_" + name)
        getattr(self, method)(grid, block, args, shared_mem, name)

    def _small(self, macs: int) -> bool:
        return self.simt_max_macs is None or macs <= self.simt_max_macs

    # ----- emulations ---------------------------------------------------------------------------

    def _entry_simt(self, grid) -> bool:
        return self.entry is not None and grid[0] <= self.simt_max_blocks

    def _rns_encode(self, grid, block, args, smem, name):
        xbits, N, ev, inner, L, P, IP, H, CP, pw, ldpw, pa, per, out = args
        assert xbits.dtype == np.uint64 and ev.dtype == np.int64 and out.dtype == np.int8
        assert pw.dtype == np.float32 and pa.dtype == per.dtype == np.int32 and pw.shape[1] == ldpw
        if self._entry_simt(grid):
            assert self.entry.emu_encode(ctypes.c_uint(grid[0]), ctypes.c_uint(block[0]), _ptr(xbits),
                                         ctypes.c_int64(N), _ptr(ev), ctypes.c_int64(inner), int(L),
                                         *map(_ptr, (P, IP, H, CP, pw)), int(ldpw), _ptr(pa), _ptr(per),
                                         _ptr(out)) == 0
            return
        self.lib.h_encode(_ptr(xbits), ctypes.c_int64(N), _ptr(ev), ctypes.c_int64(inner), ctypes.c_int(L), _ptr(P),
                          _ptr(IP), _ptr(H), _ptr(CP), _ptr(pw), ctypes.c_int(ldpw), _ptr(pa), _ptr(per),
                          _ptr(out))

    def _rns_drop_extend(self, grid, block, args, smem, name):
        X, N, out = args
        ib, fb = self.globals["rns_drop_ib"]._a, self.globals["rns_drop_fb"]._a
        nr, wg, wm = int(ib[1]), int(ib[4]), int(ib[5])
        assert smem >= (max(wg, wm) + max(nr, 1)) * block[0] * 4, "too little scratch"
        assert X.flags.c_contiguous and out.shape == (int(ib[3]), N)
        if self._entry_simt(grid):  # the constant banks as the module holds them, then the kernel's grid
            assert self.entry.emu_set_drop_tables(_ptr(ib), ctypes.c_int64(ib.size), _ptr(fb),
                                                  ctypes.c_int64(fb.size)) == 0
            assert self.entry.emu_drop_extend(ctypes.c_uint(grid[0]), ctypes.c_uint(block[0]), ctypes.c_int64(smem),
                                              0x5A, _ptr(X), ctypes.c_int64(N), _ptr(out)) == 0
            return
        assert self.lib.h_drop_extend(_ptr(X), ctypes.c_int64(N), _ptr(ib), _ptr(fb), _ptr(out)) == 0

    def _rns_decode_fp64(self, grid, block, args, smem, name):
        X, N, ib, fb, qd, f, g, ev, inner, k, out = args
        assert smem >= int(ib[0]) * block[0] * 4
        assert qd.dtype == np.float64 and ev.dtype == np.int64 and isinstance(f, np.float64)
        assert isinstance(g, np.float64)
        if self._entry_simt(grid):
            assert self.entry.emu_decode_fp64(ctypes.c_uint(grid[0]), ctypes.c_uint(block[0]), ctypes.c_int64(smem),
                                              0x5A, _ptr(X), ctypes.c_int64(N), _ptr(ib), _ptr(fb), _ptr(qd),
                                              ctypes.c_double(f), ctypes.c_double(g), _ptr(ev), ctypes.c_int64(inner),
                                              ctypes.c_int64(k), _ptr(out)) == 0
            return
        assert self.lib.h_decode_fp64(_ptr(X), ctypes.c_int64(N), _ptr(ib), _ptr(fb), _ptr(qd), ctypes.c_double(f),
                                      ctypes.c_double(g),
                                      _ptr(ev), ctypes.c_int64(inner), ctypes.c_int64(k), _ptr(out)) == 0

    def _rns_decode_exact(self, grid, block, args, smem, name):
        X, N, ib, fb, qd, F, nf, fneg, ev, inner, k, out = args
        assert smem >= int(ib[0]) * block[0] * 4 and F.dtype == np.uint32 and F.size == nf
        if self._entry_simt(grid):
            assert self.entry.emu_decode_exact(ctypes.c_uint(grid[0]), ctypes.c_uint(block[0]), ctypes.c_int64(smem),
                                               0x5A, _ptr(X), ctypes.c_int64(N), _ptr(ib), _ptr(fb), _ptr(qd), _ptr(F),
                                               int(nf), int(fneg), _ptr(ev), ctypes.c_int64(inner), ctypes.c_int64(k),
                                               _ptr(out)) == 0
            return
        assert self.lib.h_decode_exact(_ptr(X), ctypes.c_int64(N), _ptr(ib), _ptr(fb), _ptr(qd), _ptr(F),
                                       ctypes.c_int(nf), ctypes.c_int(fneg), _ptr(ev), ctypes.c_int64(inner),
                                       ctypes.c_int64(k), _ptr(out)) == 0

    def _rns_chain_fused(self, grid, block, args, smem, name):
        xb, B, out, pi, pf, qd, ops, dexp, f, g, field, fstride, fexp, flags = args
        self._chain(grid, block, smem, xb, B, out, pi, pf, qd, ops, dexp, 0, f, g, np.zeros(1, np.uint32), 0, 0,
                    field, fstride, fexp, flags)

    def _rns_chain_fused_exact(self, grid, block, args, smem, name):
        xb, B, out, pi, pf, qd, ops, dexp, F, nf, fneg, field, fstride, fexp, flags = args
        assert F.dtype == np.uint32 and F.size == nf
        self._chain(grid, block, smem, xb, B, out, pi, pf, qd, ops, dexp, 1, 1.0, 0.0, F, nf, fneg, field, fstride, fexp,
                    flags)

    def _chain(self, grid, block, smem, xb, B, out, pi, pf, qd, ops, dexp, mode, f, g, F, nf, fneg, field, fstride,
               fexp, flags):
        assert self.chain is not None, "the SIMT build of chain.cu is needed"
        assert xb.dtype == np.uint64 and out.dtype == np.float64 and pi.dtype == np.int32 and pf.dtype == np.float32
        assert qd.dtype == np.float64 and ops.dtype == np.int8 and dexp.dtype == np.int32 and flags.dtype == np.int32
        nb = int(pi[RC["NB"]])
        assert block[0] == 256 and grid[0] == -(-int(B) // nb) and out.shape[0] == int(B)
        if int(pi[RC["NFIELD"]]):  # a program with Hadamard steps: its field and the field's exponents, on the device
            assert field is not None and field.dtype == np.int8 and fexp is not None
            assert fexp.dtype == np.int32 and fexp.shape == (int(B),) and int(fstride) == field[0].size
        fptr, eptr = (None, None) if field is None else (_ptr(field), _ptr(fexp))
        assert self.chain.emu_chain(_ptr(xb), ctypes.c_int64(B), _ptr(out), _ptr(pi), _ptr(pf), _ptr(qd), _ptr(ops),
                                    _ptr(dexp), mode, ctypes.c_double(f), ctypes.c_double(g), _ptr(F), int(nf), int(fneg), fptr,
                                    ctypes.c_int64(fstride), eptr, _ptr(flags), ctypes.c_int64(smem), 0x5A) == 0

    def _rns_reduce_i32(self, grid, block, args, smem, name):
        acc, out, n, L, P, IP, H, C16 = args
        for l in range(L):
            self.lib.h_reduce_i32(_ptr(acc[l]), ctypes.c_int64(n), ctypes.c_float(P[l]), ctypes.c_float(IP[l]),
                                  ctypes.c_float(H[l]), ctypes.c_float(C16[l]), _ptr(out.reshape(L, n)[l]))

    def _rns_elementwise(self, grid, block, args, smem, name):
        a, b, out, n, L, mode, P, IP, H = args
        if self._entry_simt(grid):
            assert self.entry.emu_elementwise(ctypes.c_uint(grid[0]), ctypes.c_uint(block[0]), _ptr(a), _ptr(b),
                                              _ptr(out), ctypes.c_int64(n), int(L), int(mode), _ptr(P), _ptr(IP),
                                              _ptr(H)) == 0
            return
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
                       ("chain", build.chain_simt_library), ("entry", build.entry_simt_library)):
        try:
            setattr(FakeModule, attr, ctypes.CDLL(str(make(cache=root / f"{attr}-lib"))))
        except build.KernelBuildError:  # pragma: no cover - no C++20 compiler: the numpy models
            setattr(FakeModule, attr, None)
    return lib


def _on_device(f):
    """numpy's ``f`` as a CuPy function: device operands in (host arrays refused in strict mode), device arrays out."""

    def call(*args, **kwargs):
        name = getattr(f, "__name__", "function")
        return _wrap(f(*_unwrap(args, f"cupy.{name}"), **_unwrap(kwargs, f"cupy.{name}")))

    call.__name__ = getattr(f, "__name__", "function")
    return call


def _to_device(a, dtype=None, order="K", copy=False, what="cupy.asarray"):
    """``cupy.asarray`` / ``cupy.array``: a device array stays (cast if asked), a host one is copied over (counted)."""
    if isinstance(a, DevArray):
        b = a._a if dtype is None else a._a.astype(dtype, copy=False)
        return DevArray._wrap(np.array(b, order=order, copy=True) if copy else b)
    arr = np.array(a, dtype=dtype, order=order)
    _State.transfers.record("h2d", arr.nbytes, what)
    return DevArray._wrap(arr)


def _to_host(a):
    """``cupy.asnumpy``: a device array is copied to the host (counted), anything else taken as numpy does."""
    return a.get() if isinstance(a, DevArray) else np.asarray(a)


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
    cp.__rnstensor_standin__ = True  # what installed() looks for
    cp.ndarray = DevArray
    cp.asarray = lambda a, dtype=None, order=None: _to_device(a, dtype, order or "K")
    cp.asanyarray = cp.asarray
    cp.array = lambda a, dtype=None, copy=True, order="K", ndmin=0: _to_device(a, dtype, order, copy, "cupy.array")
    cp.ascontiguousarray = lambda a, dtype=None: (
        DevArray._wrap(np.ascontiguousarray(a._a, dtype)) if isinstance(a, DevArray)
        else _to_device(a, dtype, "C", what="cupy.ascontiguousarray"))
    cp.asnumpy = _to_host
    cp.matmul = _on_device(_device_matmul)
    cp.get_array_module = lambda *arrays: cp if any(isinstance(a, DevArray) for a in arrays) else np
    cp.transfers = _State.transfers
    props = {"major": 9, "minor": 0, "name": b"Fake H200", "multiProcessorCount": 132, "l2CacheSize": 60 << 20}
    cp.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, getDeviceProperties=lambda i: props),
        Device=lambda device=None: types.SimpleNamespace(id=0, synchronize=lambda: None,
                                                         mem_info=(96 << 30, 141 << 30)),
        Event=_Event,
        get_elapsed_time=_elapsed_ms,
        get_current_stream=lambda: _STREAM,
    )
    cp.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
    # a module from a cubin runs the emulations; one from CUDA source (a benchmark's micro kernels) only
    # records its launches: the stand-in compiles no CUDA C++
    cp.RawModule = lambda path=None, code=None: (
        FakeModule(path, lib, launches) if path is not None else _SourceModule(launches, code))
    cp.random = types.SimpleNamespace(seed=np.random.seed, **{
        name: _on_device(getattr(np.random, name)) for name in ("random", "randint", "standard_normal", "uniform")})

    def numpy_fallback(name: str):
        # everything else (dtypes, nan, matmul, fmod, Dask's take and nannumel, ...) is numpy's, with arrays
        # and reductions returned as device arrays, as CuPy returns them
        f = getattr(np, name)
        return _on_device(f) if callable(f) and not isinstance(f, type) else f

    cp.__getattr__ = numpy_fallback  # a module's __getattr__ (PEP 562) answers the names it lacks
    return cp


def install(root: Path | None = None, cache: Path | None = None, device_arrays_are_cupy: bool = False,
            simt_max_macs: int | None = None, strict: bool = False):
    """Put the stand-in in ``sys.modules['cupy']`` and point the kernel cache at ``cache``.

    ``root`` (default: a new temporary directory) holds the host builds,
    ``cache`` (default: the kernel cache, :func:`rnstensor.kernels.cache_dir`)
    the cubins. A script that calls the library with device arrays as a user
    would (``import cupy`` after this)::

        import cupy_standin
        cp, launches, restore = cupy_standin.install(device_arrays_are_cupy=True, strict=True)
        x = cp.asarray(numpy_array)          # counted in cp.transfers
        cp.transfers.reset()                 # after a warm-up call

    Returns ``(cupy module, launches, restore)``: ``launches`` lists every
    kernel name launched, ``restore()`` undoes every change. With
    ``device_arrays_are_cupy`` a :class:`DevArray` reports module ``cupy``,
    so the library takes it for CuPy input (the dry run of tests/gpu);
    ``simt_max_macs`` sends larger product launches to the numpy model.
    ``strict``: CuPy's rules where a library could get them wrong without a
    GPU: ``numpy.asarray(device_array)`` (``__array__``) and numpy
    operations mixing host and device arrays raise ``TypeError``. Either
    way ``cupy.transfers`` (a :class:`Transfers`) records every
    host <-> device copy with its size.
    Raises :class:`rnstensor.kernels.KernelBuildError` without NVRTC or a
    host C++ compiler.
    """
    build.nvrtc_version()
    if root is None:
        import tempfile

        root = tempfile.mkdtemp(prefix="rnstensor-standin-")
    if cache is None:
        from rnstensor.kernels import cache_dir

        cache = cache_dir()
    lib = _host_libraries(Path(root))
    launches: list = []
    saved = sys.modules.get("cupy")
    old_cache = os.environ.get("RNSTENSOR_KERNEL_CACHE")
    old_module, old_limit, old_strict = DevArray.__module__, FakeModule.simt_max_macs, _State.strict
    FakeModule.simt_max_macs = simt_max_macs
    _State.strict = bool(strict)
    _State.transfers.reset()
    sys.modules["cupy"] = cp = _module(lib, launches)
    os.environ["RNSTENSOR_KERNEL_CACHE"] = str(cache)
    if device_arrays_are_cupy:
        DevArray.__module__ = "cupy"

    def restore() -> None:
        DevArray.__module__, FakeModule.simt_max_macs, _State.strict = old_module, old_limit, old_strict
        if saved is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = saved
        if old_cache is None:
            os.environ.pop("RNSTENSOR_KERNEL_CACHE", None)
        else:
            os.environ["RNSTENSOR_KERNEL_CACHE"] = old_cache

    return cp, launches, restore


#: the largest product launch (multiply-adds) a dry run sends to the SIMT builds; larger ones run the numpy model
DRY_RUN_SIMT_MAX_MACS = 1 << 24


def installed() -> bool:
    """Whether ``import cupy`` gives this stand-in in this process."""
    return bool(getattr(sys.modules.get("cupy"), "__rnstensor_standin__", False))


def install_for_process():
    """The dry run's stand-in, once per process: strict, device arrays taken for CuPy's, host builds kept on disk.

    What tests/gpu/conftest.py (``RNSTENSOR_CUPY_STANDIN=1``) and
    tests/standin/sitecustomize.py (every process of ``device_check.sh
    --dry-run``) install. The host builds go to ``$RNSTENSOR_STANDIN_DIR``
    (default: ``standin/`` in the kernel cache), so the processes of one run
    build them once; the cubins to the kernel cache. Returns what
    :func:`install` returns, or ``None`` if the stand-in is already installed.
    """
    if installed():
        return None
    from rnstensor.kernels import cache_dir

    root = Path(os.environ.get("RNSTENSOR_STANDIN_DIR") or cache_dir() / "standin")
    return install(root, cache_dir(), device_arrays_are_cupy=True, simt_max_macs=DRY_RUN_SIMT_MAX_MACS, strict=True)
