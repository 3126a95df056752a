"""NVRTC build of the CUDA kernel modules to cubins, with an on-disk cache, and SASS/resource inspection.

Compiling needs no GPU and no driver: NVRTC comes from the ``nvidia-cuda-nvrtc``
wheel through ``cuda-python`` (``cuda.bindings.nvrtc``). A cubin is cached under
``$RNSTENSOR_KERNEL_CACHE`` (default ``~/.cache/rnstensor/kernels``), keyed by
the hash of the module source and every header it includes, the arch, the
options and the NVRTC version; it is written to a temporary file in the same
directory and moved into place with :func:`os.replace`, so concurrent processes
and interrupted writes never leave a partial cubin under the final name.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple, Sequence

__all__ = [
    "ARCHS",
    "MODULES",
    "MODULE_ARCHS",
    "module_archs",
    "modules_for",
    "HOT_KERNELS",
    "ARCH_HOT_KERNELS",
    "hot_kernels",
    "KernelBuildError",
    "source_dir",
    "module_source",
    "cache_dir",
    "compile_module",
    "compile_modules",
    "ModuleRequest",
    "build_all",
    "nvrtc_version",
    "probe",
    "find_tool",
    "sass",
    "resource_usage",
    "ResourceUsage",
    "arch_for_capability",
    "host_library",
    "simt_library",
    "entry_simt_library",
    "sanitizer_preload",
    "SIMT_FLAGS",
    "SANITIZE_FLAGS",
    "chain_simt_library",
    "wgmma_library",
    "cached_cubin",
]

#: the archs every module is built and checked for (Ampere, Ada, Hopper with wgmma)
ARCHS: tuple[str, ...] = ("sm_80", "sm_89", "sm_90a")

#: kernel modules: name -> source file in this package
MODULES: dict[str, str] = {
    "product": "product.cu",
    "entry": "entry.cu",
    "chain": "chain.cu",
    "product_wgmma": "product_wgmma.cu",
}

#: modules built only for some archs (every other module is built for all of :data:`ARCHS`):
#: the wgmma kernels exist on Hopper's arch-specific target alone (plain sm_90 rejects wgmma)
MODULE_ARCHS: dict[str, tuple[str, ...]] = {
    "product_wgmma": ("sm_90a",),
}

#: kernels whose ptxas report must show no local memory (spills or stack)
HOT_KERNELS: tuple[str, ...] = (
    "rns_product_n8",
    "rns_product_n16",
    "rns_product_n32",
    "rns_product_n64",
    "rns_product3m_n8",
    "rns_product3m_n32",
    "rns_reduce_i32",
    "rns_elementwise",
    "rns_encode",
    "rns_drop_extend",
    "rns_decode_fp64",
    "rns_chain_fused",
)

#: hot kernels of arch-specific modules, checked on those archs only
ARCH_HOT_KERNELS: dict[str, tuple[str, ...]] = {
    "sm_90a": ("rns_gemm_wgmma_n64", "rns_gemm_wgmma_n128"),
}

_OPTIONS: tuple[str, ...] = ("-std=c++17", "-lineinfo")

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


class KernelBuildError(RuntimeError):
    """NVRTC or a CUDA binary tool is missing, or a module failed to compile (the log is in the message)."""


def source_dir() -> Path:
    """The directory holding the ``.cu`` / ``.cuh`` sources."""
    return Path(__file__).resolve().parent


def _read_with_headers(path: Path, seen: set | None = None) -> list[tuple[str, str]]:
    """``(name, text)`` of ``path`` and every local header it includes (recursively, once each)."""
    seen = set() if seen is None else seen
    text = path.read_text()
    out = [(path.name, text)]
    seen.add(path.name)
    for inc in _INCLUDE.findall(text):
        # a generated header (a plan's rns_chain_spec.h) is not a file here: the caller passes it
        if inc not in seen and (path.parent / inc).exists():
            out += _read_with_headers(path.parent / inc, seen)
    return out


def module_archs(name: str) -> tuple[str, ...] | None:
    """The archs module ``name`` is built for: a tuple for an arch-specific module, ``None`` for every arch."""
    if name not in MODULES:
        raise ValueError(f"module must be one of {sorted(MODULES)}; got {name!r}")
    return MODULE_ARCHS.get(name)


def modules_for(arch: str) -> list[str]:
    """The modules that exist for ``arch`` (every module, less the arch-specific ones built for other archs)."""
    _check_arch(arch)
    return [m for m in MODULES if MODULE_ARCHS.get(m) is None or arch in MODULE_ARCHS[m]]


def hot_kernels(arch: str) -> tuple[str, ...]:
    """:data:`HOT_KERNELS` plus the hot kernels of the modules specific to ``arch``."""
    return HOT_KERNELS + ARCH_HOT_KERNELS.get(_check_arch(arch), ())


def module_source(name: str) -> str:
    """The source text of kernel module ``name`` (one of :data:`MODULES`)."""
    if name not in MODULES:
        raise ValueError(f"module must be one of {sorted(MODULES)}; got {name!r}")
    return (source_dir() / MODULES[name]).read_text()


def cache_dir() -> Path:
    """Where compiled cubins are cached: ``$RNSTENSOR_KERNEL_CACHE`` or ``~/.cache/rnstensor/kernels``."""
    env = os.environ.get("RNSTENSOR_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "rnstensor" / "kernels"


def _check_arch(arch: str) -> str:
    if not re.fullmatch(r"sm_\d{2,3}a?", arch):
        raise ValueError(f"arch must look like 'sm_80', 'sm_89' or 'sm_90a'; got {arch!r}")
    return arch


def _check_module_arch(name: str, arch: str) -> None:
    if name not in MODULES:
        raise ValueError(f"module must be one of {sorted(MODULES)}; got {name!r}")
    _check_arch(arch)
    only = MODULE_ARCHS.get(name)
    if only is not None and arch not in only:
        raise ValueError(f"module {name!r} is built for {', '.join(only)} only; got arch {arch!r}")


def arch_for_capability(major: int, minor: int) -> str:
    """The arch to build for a device of compute capability ``major.minor`` (``sm_90a`` on Hopper)."""
    arch = f"sm_{major}{minor}"
    return arch + "a" if (major, minor) == (9, 0) else arch


@lru_cache(maxsize=1)
def _nvrtc():
    try:
        from cuda.bindings import nvrtc  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import nvrtc  # older cuda-python
        except ImportError as exc:
            raise KernelBuildError(
                "NVRTC is not available: install the 'test' or 'gpu' extras "
                "(pip install 'rnstensor[test]': cuda-python and nvidia-cuda-nvrtc)"
            ) from exc
    return nvrtc


def nvrtc_version() -> tuple[int, int]:
    """``(major, minor)`` of the NVRTC library that compiles the kernels."""
    nv = _nvrtc()
    res = nv.nvrtcVersion()
    _check(nv, res[0], "nvrtcVersion")
    return int(res[1]), int(res[2])


#: What :func:`probe` compiles: NVRTC that loads is not NVRTC that compiles.
_PROBE_KERNEL = b'extern "C" __global__ void rnstensor_probe(int *x) { *x = 42; }'


def probe(arch: str | None = None) -> int:
    """Compile a one-line kernel for ``arch`` (default the first of :data:`ARCHS`); the cubin's size in bytes.

    Needs NVRTC, not a GPU; raises :class:`KernelBuildError` (or the import
    error naming the extra to install) where NVRTC cannot compile.
    """
    arch = _check_arch(arch or ARCHS[0])
    nv = _nvrtc()
    err, prog = nv.nvrtcCreateProgram(_PROBE_KERNEL, b"probe.cu", 0, [], [])
    _check(nv, err, "nvrtcCreateProgram")
    try:
        (err,) = nv.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture={arch}".encode()])
        _check(nv, err, "nvrtcCompileProgram", prog)
        err, size = nv.nvrtcGetCUBINSize(prog)
        _check(nv, err, "nvrtcGetCUBINSize", prog)
    finally:
        nv.nvrtcDestroyProgram(prog)
    return int(size)


def _check(nv, err, what: str, prog=None) -> None:
    if err != nv.nvrtcResult.NVRTC_SUCCESS:
        log = _log(nv, prog) if prog is not None else ""
        raise KernelBuildError(f"{what} failed ({err}){': ' + log if log else ''}")


def _log(nv, prog) -> str:
    err, n = nv.nvrtcGetProgramLogSize(prog)
    if err != nv.nvrtcResult.NVRTC_SUCCESS or n <= 1:
        return ""
    buf = b" " * n
    nv.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\x00 ").decode(errors="replace")


def _nvrtc_compile(name: str, arch: str, options: Sequence[str], extra: dict | None = None) -> tuple[bytes, str]:
    nv = _nvrtc()
    files = _read_with_headers(source_dir() / MODULES[name]) + sorted((extra or {}).items())
    main_name, main_src = files[0]
    headers = [t.encode() for _, t in files[1:]]
    includes = [n.encode() for n, _ in files[1:]]
    err, prog = nv.nvrtcCreateProgram(main_src.encode(), main_name.encode(), len(headers), headers, includes)
    _check(nv, err, "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}", *_OPTIONS, "--ptxas-options=-v", *options]
        (err,) = nv.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log = _log(nv, prog)
        if err != nv.nvrtcResult.NVRTC_SUCCESS:
            raise KernelBuildError(f"NVRTC could not compile {main_name} for {arch}:\n{log}")
        err, n = nv.nvrtcGetCUBINSize(prog)
        _check(nv, err, "nvrtcGetCUBINSize", prog)
        cubin = b" " * n
        (err,) = nv.nvrtcGetCUBIN(prog, cubin)
        _check(nv, err, "nvrtcGetCUBIN", prog)
        return bytes(cubin), log
    finally:
        nv.nvrtcDestroyProgram(prog)


def _key(name: str, arch: str, options: Sequence[str], extra: dict | None = None) -> str:
    h = hashlib.sha256()
    for fname, text in _read_with_headers(source_dir() / MODULES[name]) + sorted((extra or {}).items()):
        h.update(fname.encode() + b"\0" + text.encode() + b"\0")
    h.update(arch.encode() + b"\0" + "\0".join((*_OPTIONS, *options)).encode())
    h.update(repr(nvrtc_version()).encode())
    return h.hexdigest()[:24]


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


@dataclass(frozen=True)
class Built:
    """A compiled module: the cubin's path, its bytes and the NVRTC/ptxas log (empty when read from the cache)."""

    name: str
    arch: str
    path: Path
    log: str

    @property
    def cubin(self) -> bytes:
        return self.path.read_bytes()


def compile_module(
    name: str, arch: str, options: Sequence[str] = (), cache: Path | str | None = None, headers: dict | None = None
) -> Built:
    """Compile kernel module ``name`` for ``arch`` to a cubin (cached on disk; see the module docstring).

    Parameters
    ----------
    name : str
        One of :data:`MODULES`.
    arch : str
        ``'sm_80'``, ``'sm_89'``, ``'sm_90a'``, ... (the ``a`` suffix enables arch-specific instructions).
    options : sequence of str
        Extra NVRTC options (part of the cache key).
    cache : path, optional
        Cache directory (default :func:`cache_dir`).
    headers : dict, optional
        Generated headers ``{file name: text}`` the source may include (part of the cache key),
        e.g. a plan's ``rns_chain_spec.h`` (:func:`rnstensor.kernels.fused.spec_header`).

    Returns
    -------
    Built
        ``path`` to the cached cubin and the compile ``log`` (ptxas ``-v`` resource lines).
    """
    _check_module_arch(name, arch)
    options = tuple(options)
    root = Path(cache) if cache is not None else cache_dir()
    key = _key(name, arch, options, headers)
    path = root / f"{name}.{arch}.{key}.cubin"
    logpath = root / f"{name}.{arch}.{key}.log"
    if path.exists():
        return Built(name, arch, path, logpath.read_text() if logpath.exists() else "")
    cubin, log = _nvrtc_compile(name, arch, options, headers)
    _atomic_write(logpath, log.encode())
    _atomic_write(path, cubin)
    return Built(name, arch, path, log)


class ModuleRequest(NamedTuple):
    """One build for :func:`compile_modules`: the arguments of :func:`compile_module` but the cache."""

    name: str
    arch: str
    options: tuple = ()
    headers: dict | None = None


def _default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def compile_modules(
    requests: Sequence[ModuleRequest | tuple], jobs: int | None = None, cache: Path | str | None = None
) -> list[Built]:
    """Compile many modules at once, one worker process per build (NVRTC and ptxas use one core each).

    A per-plan build of the fused chain kernel takes 5-25 s and the modules
    of one arch about 30 s on one core; a test run or a benchmark that needs
    a dozen of them spends minutes in NVRTC unless they are built side by
    side before the first launch. Builds already in the cache and repeated
    requests cost nothing; the results are those of :func:`compile_module`.

    Parameters
    ----------
    requests : sequence of ModuleRequest or tuple
        ``(name, arch)`` or ``(name, arch, options, headers)`` per build.
    jobs : int, optional
        Worker processes (default: the cores this process may use); ``1``
        compiles in this process, one build after the other.
    cache : path, optional
        Cache directory (default :func:`cache_dir`).

    Returns
    -------
    list of Built
        One per request, in order.

    Raises
    ------
    KernelBuildError
        The first build that failed, with its NVRTC log.

    Examples
    --------
    >>> from rnstensor.kernels import build
    >>> built = build.compile_modules([("entry", a) for a in build.ARCHS], jobs=3)  # doctest: +SKIP
    >>> [b.arch for b in built]  # doctest: +SKIP
    ['sm_80', 'sm_89', 'sm_90a']
    """
    reqs = []
    for r in requests:
        if not isinstance(r, (tuple, list)) or not 2 <= len(r) <= 4:
            raise ValueError(f"each request must be (name, arch[, options[, headers]]); got {r!r}")
        reqs.append(ModuleRequest(r[0], r[1], tuple(r[2]) if len(r) > 2 else (), r[3] if len(r) > 3 else None))
    if jobs is not None and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
        raise ValueError(f"jobs must be a positive int or None; got {jobs!r}")
    root = Path(cache) if cache is not None else cache_dir()
    todo: dict[str, ModuleRequest] = {}
    for r in reqs:
        _check_module_arch(r.name, r.arch)
        key = _key(r.name, r.arch, r.options, r.headers)
        if not (root / f"{r.name}.{r.arch}.{key}.cubin").exists():
            todo.setdefault(key, r)
    workers = min(jobs or _default_jobs(), len(todo))
    if workers > 1:
        import multiprocessing

        # the longest builds first (generated headers grow with the unrolled program), so none starts last;
        # spawned workers: the caller may hold a CUDA context, which a forked child must not inherit
        order = sorted(todo.values(), key=lambda r: -sum(len(t) for t in (r.headers or {}).values()))
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(compile_module, r.name, r.arch, r.options, root, r.headers) for r in order]
            for f in futures:
                f.result()
    return [compile_module(r.name, r.arch, r.options, root, r.headers) for r in reqs]


def cached_cubin(name: str, arch: str, options: Sequence[str] = (), cache: Path | str | None = None) -> Path | None:
    """The cached cubin of module ``name`` for ``arch`` if the current sources are built, else ``None`` (no compile)."""
    root = Path(cache) if cache is not None else cache_dir()
    path = root / f"{name}.{_check_arch(arch)}.{_key(name, arch, tuple(options))}.cubin"
    return path if path.exists() else None


def build_all(
    arch: str, out: Path | str | None = None, options: Sequence[str] = (), jobs: int | None = None
) -> list[Built]:
    """Compile every module that exists for ``arch`` (:func:`modules_for`), ``jobs`` at a time.

    Builds run side by side (:func:`compile_modules`); with ``out``, each
    cubin is also copied there as ``<name>.<arch>.cubin``.
    """
    built = compile_modules([(n, arch, tuple(options)) for n in modules_for(arch)], jobs)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for b in built:
            _atomic_write(out / f"{b.name}.{arch}.cubin", b.cubin)
    return built


def _host_build(source: str, flags: Sequence[str], cache, cxx, headers: dict | None = None) -> Path:
    compiler = cxx or os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not compiler:
        raise KernelBuildError(f"no C++ compiler found for the host build of {source} (set CXX)")
    files = _read_with_headers(source_dir() / source) + sorted((headers or {}).items())
    h = hashlib.sha256()
    for fname, text in files:
        h.update(fname.encode() + b"\0" + text.encode() + b"\0")
    h.update(" ".join([compiler, *flags]).encode())
    root = Path(cache) if cache is not None else cache_dir()
    stem = source.rsplit(".", 1)[0]
    path = root / f"{stem}.{h.hexdigest()[:24]}.so"
    if path.exists():
        return path
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=stem + ".", suffix=".so", dir=root)
    os.close(fd)
    gen = tempfile.mkdtemp(prefix=stem + ".", dir=root)  # the generated headers, next to nothing else
    for fname, text in (headers or {}).items():
        Path(gen, fname).write_text(text)
    try:
        res = subprocess.run(
            [compiler, *flags, "-I", gen, "-I", str(source_dir()), "-o", tmp, str(source_dir() / source)],
            capture_output=True, text=True,
        )
        if res.returncode != 0:
            raise KernelBuildError(f"host build of {source} failed:\n{res.stderr}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        shutil.rmtree(gen, ignore_errors=True)
    return path


def host_library(cache: Path | str | None = None, cxx: str | None = None) -> Path:
    """Build ``host_check.cpp`` (the kernels' per-entry arithmetic, host side) as a shared library; cached.

    Uses ``cxx``, ``$CXX`` or ``g++`` with ``-O2 -ffp-contract=off`` (no FMA
    contraction: the fp64 Horner must round every step, as on the device).
    """
    flags = ["-O2", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared"]
    return _host_build("host_check.cpp", flags, cache, cxx)


#: the flags of every SIMT host build: C++20 threads and barriers, every float operation rounded as written
SIMT_FLAGS = ("-O1", "-std=c++20", "-pthread", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared")

#: what ``sanitize=True`` adds: AddressSanitizer and UndefinedBehaviorSanitizer, the first report fatal. A process
#: that loads such a build needs the sanitizers' runtimes preloaded (:func:`sanitizer_preload`).
SANITIZE_FLAGS = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g")


def _simt_flags(sanitize: bool, *extra: str) -> list[str]:
    return [*SIMT_FLAGS, *(SANITIZE_FLAGS if sanitize else ()), *extra]


def sanitizer_preload(cxx: str | None = None) -> str:
    """``LD_PRELOAD`` for a process (Python) that loads a ``sanitize=True`` build: the ASan and UBSan runtimes.

    Raises :class:`KernelBuildError` where the compiler has no such runtimes.
    """
    compiler = cxx or os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not compiler:
        raise KernelBuildError("no C++ compiler found (set CXX)")
    libs = []
    for name in ("libasan.so", "libubsan.so"):
        res = subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True, text=True)
        path = res.stdout.strip()
        if res.returncode != 0 or not os.path.isabs(path) or not os.path.exists(path):
            raise KernelBuildError(f"{compiler} has no {name} (the sanitizers' runtime)")
        libs.append(path)
    return " ".join(libs)


def chain_simt_library(cache: Path | str | None = None, cxx: str | None = None, headers: dict | None = None,
                       options: Sequence[str] = (), sanitize: bool = False) -> Path:
    """Build ``chain_host.cpp``: the fused chain kernel (``chain.cu``) run on CPU threads (C++20); cached.

    ``headers``/``options``: a plan's specialization (:func:`rnstensor.kernels.fused.spec_header`, ``-DRNS_SPEC_INCLUDE``).
    ``sanitize``: with AddressSanitizer and UBSan (:data:`SANITIZE_FLAGS`), for the tests.
    """
    return _host_build("chain_host.cpp", _simt_flags(sanitize, *options), cache, cxx, headers)


def entry_simt_library(cache: Path | str | None = None, cxx: str | None = None, sanitize: bool = False) -> Path:
    """Build ``entry_host.cpp``: the per-entry kernels of ``entry.cu`` (encode, elementwise, drop/extend, decodes) run on CPU threads (C++20); cached.

    The grid-stride loops and the shared-memory scratch columns run as
    written, one std::thread per CUDA thread (``simt_runtime.h``).
    ``sanitize``: with AddressSanitizer and UBSan (:data:`SANITIZE_FLAGS`).
    """
    return _host_build("entry_host.cpp", _simt_flags(sanitize), cache, cxx)


def simt_library(cache: Path | str | None = None, cxx: str | None = None, sanitize: bool = False) -> Path:
    """Build ``simt_host.cpp``: ``product.cu`` itself run on CPU threads with a software MMA (C++20); cached.

    One std::thread per CUDA thread, a barrier for ``__syncthreads``, a
    warp-collective software ``mma.sync`` after the PTX fragment layout: the
    device code's loaders, fragment packing, fold and epilogue run as written,
    except that the accumulators are folded every 2 k-steps (``RNS_FOLD_STEPS``)
    instead of 4095, so short contractions exercise the fold.
    """
    return _host_build("simt_host.cpp", _simt_flags(sanitize, "-DRNS_FOLD_STEPS=2"), cache, cxx)


def wgmma_library(cache: Path | str | None = None, cxx: str | None = None, sanitize: bool = False) -> Path:
    """Build ``wgmma_host.cpp``: ``product_wgmma.cu`` itself run on CPU threads with software cp.async and wgmma (C++20); cached.

    One std::thread per CUDA thread, a barrier for ``__syncthreads``; the
    asynchronous copies and warpgroup MMAs complete either at issue or at their
    wait (both timings are tested); the MMA decodes the kernel's shared-memory
    descriptors and writes the PTX accumulator fragment layout. The
    accumulators fold every 2 k-tiles (``RNS_WG_FOLD_TILES``) instead of 2047,
    so short contractions exercise the fold.
    """
    return _host_build("wgmma_host.cpp", _simt_flags(sanitize, "-fno-strict-aliasing", "-DRNS_WG_FOLD_TILES=2"),
                       cache, cxx)


# ----- inspection ---------------------------------------------------------------------------


def find_tool(name: str) -> str:
    """Path of a CUDA binary tool (``cuobjdump``, ``nvdisasm``): the ``nvidia-*`` wheels first, then ``PATH``."""
    try:
        import nvidia  # namespace package of the nvidia-* wheels

        for root in list(getattr(nvidia, "__path__", [])):
            for cand in sorted(Path(root).glob(f"*/bin/{name}")):
                if os.access(cand, os.X_OK):
                    return str(cand)
    except ImportError:
        pass
    found = shutil.which(name)
    if found:
        return found
    for cuda in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if cuda and os.access(os.path.join(cuda, "bin", name), os.X_OK):
            return os.path.join(cuda, "bin", name)
    raise KernelBuildError(
        f"{name} not found: install the 'test' extras (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm) or put it on PATH"
    )


def _cuobjdump(args: Sequence[str], cubin: Path | str) -> str:
    exe = find_tool("cuobjdump")
    env = dict(os.environ)
    try:
        env["PATH"] = os.path.dirname(find_tool("nvdisasm")) + os.pathsep + env.get("PATH", "")
    except KernelBuildError:
        pass  # --dump-sass will say so itself
    res = subprocess.run([exe, *args, str(cubin)], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise KernelBuildError(f"cuobjdump {' '.join(args)} failed: {res.stderr.strip()}")
    return res.stdout


def sass(cubin: Path | str, functions: Sequence[str] = ()) -> dict[str, str]:
    """The SASS of every function in a cubin (or only of ``functions``): ``{function name: disassembly}``."""
    text = _cuobjdump(["--dump-sass", *(["--function", ",".join(functions)] if functions else [])], cubin)
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"\s*Function\s*:\s*(\S+)", line)
        if m:
            name = m.group(1)
            out[name] = ""
        elif name is not None:
            out[name] += line + "\n"
    return out


@dataclass(frozen=True)
class ResourceUsage:
    """Per-function resources from ``cuobjdump --dump-resource-usage`` (bytes, except ``registers``)."""

    registers: int
    stack: int
    shared: int
    local: int


def resource_usage(cubin: Path | str) -> dict[str, ResourceUsage]:
    """``{function name: ResourceUsage}`` of every function in a cubin."""
    text = _cuobjdump(["--dump-resource-usage"], cubin)
    out: dict[str, ResourceUsage] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"\s*Function\s+(\S+?):?\s*$", line)
        if m:
            name = m.group(1)
            continue
        if name is not None and "REG:" in line:
            f = dict(re.findall(r"(\w+(?:\[\d+\])?):(\d+)", line))
            out[name] = ResourceUsage(int(f["REG"]), int(f.get("STACK", 0)), int(f.get("SHARED", 0)), int(f.get("LOCAL", 0)))
            name = None
    return out
