"""CPU kernels of the two-operand GEMM program: the exponent scan, and an exact product engine on float64 BLAS.

The engine (:func:`exact_gemm`) computes the exact integer product of the
program's encoded operands on moduli below 2**24 instead of the INT8 ones:
each modulus is one float64 GEMM per chunk of ``chunk`` terms, exact because
every partial sum stays below 2**53, where the INT8 path needs one float32
GEMM per modulus of at most 8 bits. The integers encoded, and so the exact
product and its correctly rounded decode, are the INT8 program's: the two
give the same bits (``tests/test_backend_cpu_gemm.py``). A CPU without INT8
matrix engines does about twice the float32 rate of its float64 one, so 23
bits per float64 GEMM against 8 per float32 one make the products about 1.4x
cheaper, and the decode of 5-6 wide moduli is cheaper than that of 15-20.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from contextlib import contextmanager
from functools import lru_cache
from typing import Optional

import numpy as np
from numba import njit

from ...basis import mrc_digit_coeffs, mrc_order
from . import common
from .wide import _LIMB, _decode, _lift_into, _mod_sum, _reduce_into, _residues, _rounded_entries, _wide_encode

__all__ = ["group_stats", "wide_plan", "onto_plan", "exact_gemm", "exact_gemm_shared", "prefers_wide", "wide_bytes",
           "release_workspace",
           "threaded_matmul", "ENGINE",
           "PHASES", "KEEP_BYTES"]

#: Which exact product :meth:`CpuBackend.exact_gemm` runs: ``None`` picks by shape (:func:`prefers_wide`),
#: ``'wide'`` / ``'int8'`` force one (tests and benchmarks compare the two).
ENGINE: Optional[str] = None
#: When a dict, the wide engine's phase wall times (seconds) accumulate into it: 'encode', 'gemm', 'reduce',
#: 'decode' (benchmarks; ``rnstensor.gemm.PHASES`` counts the whole engine as 'products').
PHASES: Optional[dict] = None


#: The most bytes of working memory (operand planes, product residues) the engine keeps between calls, one
#: buffer for the whole process: a product of the same size reuses it instead of taking fresh pages from the
#: kernel, whose zeroing costs as much as a quarter of the encode. 0 keeps nothing; :func:`release_workspace`
#: frees what is kept. A call made while another holds the buffer takes fresh memory.
KEEP_BYTES = 256 << 20
_KEPT: list = [None]
_KEPT_LOCK = threading.Lock()


def release_workspace() -> None:
    """Free the working memory the wide engine keeps between calls (see :data:`KEEP_BYTES`)."""
    with _KEPT_LOCK:
        _KEPT[0] = None


class _Arena:
    """Arrays carved one after another from one float64 buffer, each on a 64-byte boundary."""

    def __init__(self, buf: np.ndarray):
        self.buf, self.off = buf, 0

    def take(self, shape: tuple, dtype) -> np.ndarray:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        words = -(-nbytes // 64) * 8
        view = self.buf[self.off: self.off + words].view(np.uint8)[:nbytes].view(dtype).reshape(shape)
        self.off += words
        return view


@contextmanager
def _arena(nbytes: int):
    """An :class:`_Arena` of at least ``nbytes`` (the kept buffer where it is free and large enough)."""
    words = -(-nbytes // 64) * 8 + 8 * 16  # each array's rounding up to a cache line
    mine = _KEPT_LOCK.acquire(blocking=False)
    try:
        buf = _KEPT[0] if mine else None
        if buf is None or buf.size < words:
            buf = np.empty(words, np.float64)
            if mine and 8 * words <= KEEP_BYTES:
                _KEPT[0] = buf
        yield _Arena(buf)
    finally:
        if mine:
            _KEPT_LOCK.release()


@lru_cache(maxsize=1)
def _openblas_threads() -> tuple:
    """``(get, set)`` thread-count functions of every pthreads OpenBLAS loaded (numpy's among them), found by
    threadpoolctl; empty without threadpoolctl or such a library (MKL, Accelerate, OpenMP builds)."""
    try:
        from threadpoolctl import ThreadpoolController  # noqa: PLC0415 - read once
    except ImportError:  # pragma: no cover - a dependency; a stripped environment runs the GEMMs one by one
        return ()
    found = []
    for lib in ThreadpoolController().select(internal_api="openblas").lib_controllers:
        if getattr(lib, "threading_layer", None) == "openmp":  # per-thread counts, other waiting rules
            continue
        for pre, suf in itertools.product(("", "scipy_"), ("", "64_", "_64")):
            get = getattr(lib.dynlib, f"{pre}openblas_get_num_threads{suf}", None)
            put = getattr(lib.dynlib, f"{pre}openblas_set_num_threads{suf}", None)
            if get is not None and put is not None:
                found.append((get, put))
                break
    return tuple(found)


_ONE_LOCK = threading.Lock()
_ONE: list = [0, ()]  # callers inside, the counts to restore


@contextmanager
def _one_blas_thread():
    """OpenBLAS on one thread, process-wide, while any caller is inside; its own counts restored after the last.

    (OpenBLAS's count is one for the process: threadpoolctl lets only one thread ever change it, so its functions
    are called here directly.)
    """
    libs = _openblas_threads()
    with _ONE_LOCK:
        if _ONE[0] == 0:
            _ONE[1] = tuple(get() for get, _ in libs)
            for _, put in libs:
                put(1)
        _ONE[0] += 1
    try:
        yield
    finally:
        with _ONE_LOCK:
            _ONE[0] -= 1
            if _ONE[0] == 0:
                for (_, put), n in zip(libs, _ONE[1]):
                    put(n)


def _after_fork() -> None:
    """In a forked child: fresh locks, the kept buffer dropped, and OpenBLAS's count restored where a thread of the
    parent was inside :func:`_one_blas_thread` (that thread does not exist here to restore it)."""
    global _ONE_LOCK, _KEPT_LOCK
    _ONE_LOCK, _KEPT_LOCK = threading.Lock(), threading.Lock()
    _KEPT[0] = None
    if _ONE[0]:
        for (_, put), n in zip(_openblas_threads(), _ONE[1]):
            put(n)
        _ONE[0] = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


#: Products of at least this many multiply-adds per modulus run one single-threaded BLAS GEMM per thread.
_PARALLEL_MIN = 1 << 26


def _gemms_per_thread(macs: int) -> bool:
    """Whether a product of ``macs`` multiply-adds runs as one single-threaded BLAS GEMM per thread: several
    threads, large enough, a pthreads OpenBLAS, and no thread Python did not start running (below)."""
    return common._nthreads() > 1 and macs >= _PARALLEL_MIN and bool(_openblas_threads()) \
        and not _foreign_threads_running()


def _foreign_threads_running() -> bool:
    """Whether a thread Python did not start is running now (Linux: ``/proc/self/task``): OpenBLAS's workers spin
    after every multi-threaded call, and single-threaded GEMMs on every core would share them with that spinning;
    the multi-threaded BLAS hands them the work instead. False where the threads cannot be read."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    ours = {t.native_id for t in threading.enumerate()}
    for tid in tasks:
        if int(tid) in ours:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "R":
                    return True
        except (OSError, IndexError):
            continue
    return False


def threaded_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` (2-D NumPy arrays), in row blocks of one single-threaded BLAS GEMM per thread where it is large, so
    that no BLAS thread is left spinning over what the caller runs next (see the wide engine's products). Each
    entry is BLAS's sum of the same products, in the order BLAS takes for its block: it may round differently from
    one whole ``a @ b`` (for callers that bound the rounding, as :func:`rnstensor.gemm.magnitude_ratio` does)."""
    m, k = a.shape
    n = b.shape[1]
    nth = common._nthreads()
    if m < nth or not _gemms_per_thread(m * n * k):
        return a @ b
    out = np.empty((m, n), np.result_type(a, b))
    cuts = [m * i // nth for i in range(nth + 1)]
    with _one_blas_thread():
        common._run_parts(lambda i: np.matmul(a[cuts[i]:cuts[i + 1]], b, out=out[cuts[i]:cuts[i + 1]]), nth)
    return out


def _tick(name: str, t0: float) -> float:
    t = time.perf_counter()
    if PHASES is not None:
        PHASES[name] = PHASES.get(name, 0.0) + t - t0
    return t

_ABS = 0x7FFFFFFFFFFFFFFF
_INF_BITS = 0x7FF0000000000000
_MASK52 = (1 << 52) - 1
# the integer sentinels of rnstensor.encode (_NONE, _HUGE), repeated here as literals so that the kernels need no
# import of the algorithm layer; tests/test_backend_cpu_gemm.py checks that they agree
_NONE = np.iinfo(np.int64).min // 4
_HUGE = np.iinfo(np.int64).max // 4
# columns per task of the column scan: whole cache lines of every row
_COLS = 64


def group_stats(x: np.ndarray, axis: int, need_lsb: bool):
    """:func:`rnstensor.gemm.group_stats` of a 2-D float64 / complex128 NumPy matrix in one pass over its IEEE bits.

    Returns the same ``(finite, Emax, lsb_min or None, Emin)`` vectors
    (bool, int64, int64, int64) bit for bit, read from the sign-cleared bit
    patterns: the largest finite magnitude is the largest pattern, a part's
    lowest set bit comes from its significand. Rows (``axis=1``) or columns
    (``axis=0``), each group scanned along memory: row groups of a C-ordered
    matrix run row by row, column groups ``_COLS`` columns at a time (an
    F-ordered matrix is scanned as its C-ordered transpose).

    Examples
    --------
    >>> fin, Emax, lsb, Emin = group_stats(np.array([[1.0, 0.75], [0.0, np.inf]]), 1, True)
    >>> fin.tolist(), int(Emax[0]), int(lsb[0]), int(Emin[0]), bool(Emax[1] == _NONE and lsb[1] == _HUGE)
    ([True, False], 1, -2, 0, True)
    """
    if x.ndim != 2 or x.dtype not in (np.float64, np.complex128):
        raise TypeError(f"group_stats: x must be a 2-D float64 or complex128 array; got {x.dtype} of shape {x.shape}")
    if axis not in (0, 1):
        raise ValueError(f"group_stats: axis must be 0 (columns) or 1 (rows); got {axis!r}")
    if not x.flags.c_contiguous and x.flags.f_contiguous:
        x, axis = x.T, 1 - axis
    x = np.ascontiguousarray(x)
    parts = 2 if x.dtype == np.complex128 else 1
    m, n = x.shape
    groups = m if axis == 1 else n
    fin = np.empty(groups, np.bool_)
    stats = np.empty((4, groups), np.int64)  # amax bits, amin bits, lsb, then the exponents in place
    xi = common._ro(x.view(np.float64).reshape(m, n * parts).view(np.int64))
    if groups and m * n:
        if axis == 1:
            common._launch(_scan_rows, m, x.size * parts, xi, parts, need_lsb, common._P2, fin, stats)
        else:
            common._launch(_scan_cols, -(-n // _COLS), x.size * parts, xi, parts, need_lsb, common._P2, fin, stats)
    else:
        fin[:] = True
        stats[0], stats[1], stats[2] = 0, _INF_BITS, _HUGE
    # every finite group empty of nonzero parts: the same NONE as numpy's where(amin finite, ...) route
    Emax = _exponents(stats[0])
    Emin = _exponents(np.where(stats[1] == _INF_BITS, 0, stats[1]))
    return fin, Emax, (stats[2].copy() if need_lsb else None), Emin


def _exponents(bits: np.ndarray) -> np.ndarray:
    """frexp exponents of non-negative float64 bit patterns, ``NONE`` for zero (as ``gemm.frexp_exponent``)."""
    v = bits.view(np.float64)
    return np.where(v > 0, np.frexp(v)[1].astype(np.int64), _NONE)


@njit(cache=True, nogil=True, inline="always")
def _lsb_value(a, p2):
    # the value of the lowest set bit of the finite nonzero magnitude with bit pattern a: a power of two, exact
    be = a >> 52
    m = (a & _MASK52) | ((1 << 52) if be > 0 else 0)
    low = m & -m
    return np.float64(low) * p2[max(be, 1) - 1075 + 1074]


@njit(cache=True, nogil=True, inline="always")
def _lsb_exponent(v):
    # log2 of a power of two v > 0 (inf: none seen)
    if v == np.inf:
        return _HUGE
    return np.int64(math.frexp(v)[1]) - 1


@njit(cache=True, nogil=True)
def _scan_rows(xi, parts, need_lsb, p2, fin, stats, task0, task1):
    n = xi.shape[1] // parts
    for r in range(task0, task1):
        row = xi[r]
        ok = True
        amax = np.int64(0)
        amin = np.int64(_INF_BITS)
        low = np.inf
        for j in range(n):
            top = np.int64(0)
            for q in range(parts):
                a = row[parts * j + q] & _ABS
                top = max(top, a)
                if 0 < a < _INF_BITS:
                    amin = min(amin, a)
                    if need_lsb:
                        low = min(low, _lsb_value(a, p2))
            finite = top < _INF_BITS
            ok &= finite
            amax = max(amax, top if finite else 0)
        fin[r] = ok
        stats[0, r] = amax
        stats[1, r] = amin
        stats[2, r] = _lsb_exponent(low)


@njit(cache=True, nogil=True)
def _scan_cols(xi, parts, need_lsb, p2, fin, stats, task0, task1):
    m = xi.shape[0]
    n = xi.shape[1] // parts
    ok = np.empty(_COLS, np.bool_)
    amax = np.empty(_COLS, np.int64)
    amin = np.empty(_COLS, np.int64)
    low = np.empty(_COLS, np.float64)
    for t in range(task0, task1):
        j0 = t * _COLS
        w = min(_COLS, n - j0)
        ok[:] = True
        amax[:] = 0
        amin[:] = _INF_BITS
        low[:] = np.inf
        for i in range(m):
            row = xi[i]
            for c in range(w):
                top = np.int64(0)
                for q in range(parts):
                    a = row[parts * (j0 + c) + q] & _ABS
                    top = max(top, a)
                    if 0 < a < _INF_BITS:
                        amin[c] = min(amin[c], a)
                        if need_lsb:
                            low[c] = min(low[c], _lsb_value(a, p2))
                finite = top < _INF_BITS
                ok[c] &= finite
                amax[c] = max(amax[c], top if finite else 0)
        for c in range(w):
            fin[j0 + c] = ok[c]
            stats[0, j0 + c] = amax[c]
            stats[1, j0 + c] = amin[c]
            stats[2, j0 + c] = _lsb_exponent(low[c])


# ----- the wide-modulus exact product ------------------------------------------------------------

#: the largest wide modulus, and the most moduli: digits, residues and constants below 2**23 in magnitude keep
#: every sum of the mixed-radix conversion (at most 31 products below 2**46) inside _cr64's exact range 2**51
_P_MAX = (1 << 24) - 1
_L_MAX = 31
#: the exact float64 range of the GEMM sums, less room for the reduced accumulator added to them
_SUM_MAX = (1 << 53) - (1 << 25)
#: a chunk costs about as much as this many terms of a GEMM, per output entry (the cost model): its reduction
#: pass, and the lower BLAS rate of short GEMMs (measured: 4 chunks of 256 at 1.12x one GEMM of 1024)
_CHUNK_COST = 128
_POW_WIDTH = 1 << 12


@lru_cache(maxsize=64)
def _primes_below(limit: int, count: int) -> tuple[int, ...]:
    """The ``count`` largest primes at most ``limit`` (descending), by trial division."""
    small = [q for q in range(3, math.isqrt(limit) + 2, 2) if all(q % d for d in range(3, math.isqrt(q) + 1, 2))]
    out = []
    n = limit if limit % 2 else limit - 1
    while len(out) < count and n > 2:
        r = math.isqrt(n)
        if all(n % q for q in small if q <= r):
            out.append(n)
        n -= 2
    return tuple(out)


@lru_cache(maxsize=256)
def wide_plan(k: int, bound: int) -> tuple[tuple[int, ...], int]:
    """``(moduli, chunk)``: the wide moduli and the k-chunk that hold an exact product ``|c| <= bound`` of length ``k``.

    A chunk of ``chunk`` terms with residues ``|r| <= R`` sums to at most
    ``chunk * R**2``, exact in float64 while that is below ``2**53`` (less
    room for the accumulator): the moduli are the largest primes
    ``p = 2R + 1`` or below (and below 2**24), as many as make their product
    exceed ``2 * bound`` (the centered range). Shorter chunks allow larger
    moduli, so fewer of them, at one reduction pass per chunk: the pick
    minimises ``len(moduli) * (k + 128 * chunks)``.

    Examples
    --------
    >>> mods, chunk = wide_plan(1024, 1024 * 4**53)
    >>> len(mods), chunk, all(p < 2**24 for p in mods)
    (6, 1024, True)
    """
    k = max(int(k), 1)
    best = None
    chunks = {k} | {1 << j for j in range(7, k.bit_length()) if (1 << j) < k}
    for chunk in sorted(chunks):
        R = math.isqrt(_SUM_MAX // chunk)
        limit = min(2 * R + 1, _P_MAX)
        mods, P = [], 1
        for p in _primes_below(limit, _L_MAX):
            if P > 2 * bound:
                break
            mods.append(p)
            P *= p
        if P <= 2 * bound:
            continue
        cost = _wide_cost(len(mods), chunk, k)
        if best is None or cost < best[0]:
            best = (cost, tuple(mods), chunk)
    if best is None:
        raise ValueError(f"wide_plan: {_L_MAX} primes below 2**24 do not hold a product bound of "
                         f"{bound.bit_length()} bits; use the INT8 product")
    return best[1], best[2]


@lru_cache(maxsize=64)
def onto_plan(k: int, bound: int, onto: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """``(moduli, chunk)`` as :func:`wide_plan`, each wide modulus a product of some of the INT8 moduli ``onto``
    (every one of them in one): the product's residues on ``onto`` are then one reduction of its group's residue
    each (:meth:`~rnstensor.backends.cpu.backend.ExactProduct.residues`), where primes would need every entry's
    mixed-radix digits. Their product is that of ``onto``, which must exceed ``2 * bound``.

    Examples
    --------
    >>> from rnstensor import Basis
    >>> onto = Basis.int8(15).moduli
    >>> mods, chunk = onto_plan(60, 60 * 4**53, onto)
    >>> len(mods), chunk, math.prod(mods) == math.prod(onto), all(p < 2**24 for p in mods)
    (5, 60, True, True)
    """
    k = max(int(k), 1)
    onto = tuple(int(q) for q in onto)
    if math.prod(onto) <= 2 * bound:
        raise ValueError(f"onto_plan: the moduli's {math.prod(onto).bit_length()} bits do not hold the bound")
    best = None
    for chunk in sorted({k} | {1 << j for j in range(7, k.bit_length()) if (1 << j) < k}):
        groups = _groups(onto, min(2 * math.isqrt(_SUM_MAX // chunk) + 1, _P_MAX))
        if groups is None or len(groups) > _L_MAX:
            continue
        cost = _wide_cost(len(groups), chunk, k)
        if best is None or cost < best[0]:
            best = (cost, groups, chunk)
    if best is None:
        raise ValueError(f"onto_plan: {len(onto)} moduli do not fit {_L_MAX} wide ones at any chunk of {k} terms")
    return best[1], best[2]


def _groups(moduli: tuple[int, ...], limit: int) -> Optional[tuple[int, ...]]:
    """The products of ``moduli`` packed into the fewest groups at most ``limit`` (first fit, largest first), or
    ``None`` where one modulus exceeds it."""
    groups: list[int] = []
    for q in sorted(moduli, reverse=True):
        if q > limit:
            return None
        for g, v in enumerate(groups):
            if v * q <= limit:
                groups[g] = v * q
                break
        else:
            groups.append(q)
    return tuple(groups)


def _wide_cost(L: int, chunk: int, k: int) -> int:
    """The products' cost per output entry on ``L`` wide moduli, in GEMM terms (the cost model of the pick)."""
    return L * (k + _CHUNK_COST * -(-k // chunk))


def wide_bytes(m: int, n: int, k: int, L: int, cplx: bool = False) -> int:
    """Peak bytes of :func:`exact_gemm` on ``L`` wide moduli: float64 operand planes, a GEMM buffer per thread,
    float32 residues of the product (complex: the parts and sums of both operands, the three products, both
    parts)."""
    bufs = 8 * common._nthreads() * m * n
    if cplx:
        return 8 * 3 * L * (m * k + k * n) + bufs + 4 * 5 * L * m * n
    return 8 * L * (m * k + k * n) + bufs + 4 * L * m * n


def prefers_wide(m: int, n: int, k: int, s: int, bound: int) -> bool:
    """Whether the wide engine should beat ``s`` INT8 moduli here (float32 GEMMs at twice the float64 rate).

    Per output entry its products cost ``len(moduli) (k + 128 chunks)``
    GEMM terms against ``s (k / 2 + 64)`` (each INT8 modulus: a float32 GEMM
    and its own cast and reduction passes); below ``2**18`` multiply-adds
    both are fast and the INT8 path stays.
    """
    if m * n * k < (1 << 18):
        return False
    try:
        mods, chunk = wide_plan(k, bound)
    except ValueError:
        return False
    return _wide_cost(len(mods), chunk, k) < s * (k / 2 + _CHUNK_COST / 2)


@lru_cache(maxsize=64)
def _wide_tables(moduli: tuple[int, ...]):
    """Encode and decode constants of the wide moduli (read-only float64 / int64 arrays)."""
    p, ip, h = common._mod_consts(moduli)[3:]
    c24 = np.array([pow(2, 24, q) for q in moduli], np.float64)
    # an entry's power of two past its significand is at most t - 53 (the row's largest entry sets t): 4096
    # covers every width 49 INT8 moduli reach; the kernel computes any larger one
    pw = np.array([[pow(2, j, q) for j in range(_POW_WIDTH)] for q in moduli], np.float64)
    order = mrc_order(moduli)
    perm = np.array([moduli.index(q) for q in order], np.int64)
    C = mrc_digit_coeffs(order).astype(np.float64)
    qd = np.array(order, np.float64)
    nl = ((math.prod(moduli).bit_length() + _LIMB - 1) // _LIMB) + 1
    tabs = (p, ip, h, c24, pw, perm, C, qd)
    for a in tabs[3:]:
        a.setflags(write=False)
    return tabs, nl


def exact_gemm(A: np.ndarray, Bm: np.ndarray, ea: np.ndarray, eb: np.ndarray, k_bound: int, alpha,
               moduli: tuple[int, ...], chunk: int, onto: Optional[tuple[int, ...]] = None) -> np.ndarray:
    """``alpha * 2**(-ea_i - eb_j) * (a_i . b_j)`` correctly rounded, for the integers the INT8 encode holds.

    ``A`` (m x k) and ``Bm`` (k x n) float64, or complex128 (then the exact
    3M form: ``P0 = Ar Br``, ``P1 = Ai Bi``, ``P2 = (Ar + Ai)(Br + Bi)``,
    ``Re = P0 - P1``, ``Im = P2 - P0 - P1``, all in residues), ``ea`` / ``eb``
    the encode exponents of the program's rows / columns
    (``round_half_even(x * 2**e)`` of every part, the INT8 encode's integers,
    from the same IEEE split), ``k_bound`` the product's a-priori bound
    (checked against the moduli), ``alpha`` finite (a complex ``alpha`` for
    complex operands). The result is what the program's exact decode gives
    for the same integers, bit for bit: each part correctly rounded times
    ``alpha``'s real part, one float64 sum per part where ``alpha`` has an
    imaginary part, ``-0.0`` for zeros times a negative ``alpha``, as there.
    ``onto`` (real operands; ``alpha`` unused): the product's integers as
    residues ``(len(onto), m, n)`` int8 on those INT8 moduli instead, for the
    INT8 program's own decode (the bits of its INT8 product, whatever it is).
    """
    m, k = A.shape
    n = Bm.shape[1]
    cplx = A.dtype.kind == "c"
    if math.prod(moduli) <= 2 * k_bound:
        raise ValueError(f"exact_gemm: moduli of {math.prod(moduli).bit_length()} bits do not hold the bound")
    tabs, nl = _wide_tables(tuple(moduli))
    p, ip, h = tabs[:3]
    L = len(moduli)
    ea = np.ascontiguousarray(ea, np.int64).reshape(-1)
    eb = np.ascontiguousarray(eb, np.int64).reshape(-1)
    # every modulus' residues of the operands in one pass each (the IEEE split is shared), float64 for the
    # GEMMs; the product's residues in float32 (|r| < 2**23) for the decode
    with _arena(wide_bytes(m, n, k, L, cplx)) as ws:
        return _exact_gemm(A, Bm, ea, eb, alpha, tabs, nl, chunk, ws, onto)


def exact_gemm_shared(As: list, Bm: np.ndarray, eas: list, ebs: list, shifts: list, bounds: list,
                      moduli: tuple[int, ...], chunk: int) -> list:
    """``[exact_gemm(As[g], Bm, eas[g], ebs[g], bounds[g], 1.0, moduli, chunk)]``: the products of one real ``Bm``
    at several widths, as one product.

    ``ebs[g]`` is ``ebs[0] + shifts[g]`` on every nonzero column
    (``shifts[0] = 0``, the others positive; a zero column's exponent does
    not matter). With ``B0`` the integers at ``ebs[0]`` and ``Bg`` those at
    ``ebs[g]``, ``Bg = 2**d B0 + Dg`` where ``Dg`` is zero but on the
    entries rounded at ``ebs[0]`` (the few far below their column's
    largest): so every ``Ag Bg`` is ``2**d (Ag B0) + Ag Dg``, the first
    from one product of all the ``Ag``'s rows on ``B0``'s residues (one
    pass over ``Bm``'s planes, as one GEMM), the second a sparse sum
    (:func:`~rnstensor.backends.cpu.wide._lift_into`). The same integers,
    so each product's bits.
    """
    k, n = Bm.shape
    bounds_max = max(bounds)
    if math.prod(moduli) <= 2 * bounds_max:
        raise ValueError(f"exact_gemm_shared: moduli of {math.prod(moduli).bit_length()} bits do not hold the bound")
    tabs, nl = _wide_tables(tuple(moduli))
    p, ip, h, c24, pw = tabs[:5]
    L = p.size
    cuts = np.cumsum([0] + [a.shape[0] for a in As])
    A = np.concatenate([np.asarray(a, np.float64) for a in As])
    ea = np.concatenate([np.asarray(e, np.int64).reshape(-1) for e in eas])
    eb0 = np.ascontiguousarray(ebs[0], np.int64).reshape(-1)
    rounded = None
    if any(shifts):  # (the entries rounded at ebs[0], column by column, as floats, and their exponents there)
        colptr, rows, bits = _rounded_entries(common._ro(np.ascontiguousarray(Bm).view(np.int64)), eb0)
        rounded = colptr, rows, bits.view(np.float64)[None], eb0[np.repeat(np.arange(n), np.diff(colptr))]
    out = []
    with _arena(wide_bytes(A.shape[0], n, k, L) + 2 * 8 * L * (0 if rounded is None else rounded[1].size)) as ws:
        t0 = time.perf_counter()
        X, Y = _planes(A, ea, True, tabs, ws), _planes(Bm, eb0, False, tabs, ws)
        # the rounded entries' integers at ebs[0] (those of Y there, encoded apart: their residues in a row)
        V0 = None if rounded is None else _planes(rounded[2], rounded[3], False, tabs, ws)
        t0 = _tick("encode", t0)
        (prod,) = _wide_products([(X, Y)], A.shape[0], n, k, chunk, tabs, ws)
        mark = ws.off
        t0 = time.perf_counter()
        for g, d in enumerate(shifts):
            r0, r1 = int(cuts[g]), int(cuts[g + 1])
            if d:  # (the product on the narrowest width's integers, to the product at this width's)
                colptr, rows, xs, e = rounded
                ws.off = mark  # (each width's integers of the rounded entries in the same place)
                Vd = _planes(xs, e + d, False, tabs, ws)
                m2d = np.array([pow(2, int(d), int(q)) for q in moduli], np.float64)
                common._launch(_lift_into, L, (r1 - r0) * rows.size * L, prod[:, r0:r1], X[:, r0:r1], colptr, rows,
                               V0[:, 0], Vd[:, 0], m2d, p, ip, h)
            eb = np.ascontiguousarray(ebs[g], np.int64).reshape(-1)
            out.append(_decode(np.ascontiguousarray(prod[:, r0:r1]), ea[r0:r1], eb, 1.0, tabs, nl))
        _tick("decode", t0)
    return out


def _exact_gemm(A, Bm, ea, eb, alpha, tabs, nl: int, chunk: int, ws: _Arena, onto=None) -> np.ndarray:
    m, k = A.shape
    n = Bm.shape[1]
    p, ip, h = tabs[:3]
    t0 = time.perf_counter()
    if A.dtype.kind != "c":
        pairs = [(_planes(A, ea, True, tabs, ws), _planes(Bm, eb, False, tabs, ws))]
    else:
        Ar, Ai = _planes(A.real, ea, True, tabs, ws), _planes(A.imag, ea, True, tabs, ws)
        Br, Bi = _planes(Bm.real, eb, False, tabs, ws), _planes(Bm.imag, eb, False, tabs, ws)
        pairs = [(Ar, Br), (Ai, Bi), (_mod_sum(Ar, Ai, p, h, out=ws.take(Ar.shape, np.float64)),
                                      _mod_sum(Br, Bi, p, h, out=ws.take(Br.shape, np.float64)))]
    _tick("encode", t0)
    prods = _wide_products(pairs, m, n, k, chunk, tabs, ws)
    del pairs
    t0 = time.perf_counter()
    if onto is not None:
        out = _residues(prods[0], tabs, onto)
        _tick("decode", t0)
        return out
    if A.dtype.kind != "c":
        out = _decode(prods[0], ea, eb, float(alpha), tabs, nl)
        _tick("decode", t0)
        return out
    P0, P1, P2 = prods
    re = _mod_sum(P0, P1, p, h, -1.0, out=ws.take(P0.shape, np.float32))
    im = _mod_sum(_mod_sum(P2, P0, p, h, -1.0, out=ws.take(P0.shape, np.float32)), P1, p, h, -1.0, out=P2)
    ar, ai = complex(alpha).real, complex(alpha).imag
    out = np.empty((m, n), np.complex128)
    # (ar + i ai)(Re + i Im): each term correctly rounded, one float64 sum where both parts are nonzero
    if ai:
        out.real[...] = _decode(re, ea, eb, ar, tabs, nl) - _decode(im, ea, eb, ai, tabs, nl)
        out.imag[...] = _decode(im, ea, eb, ar, tabs, nl) + _decode(re, ea, eb, ai, tabs, nl)
    else:
        out.real[...] = _decode(re, ea, eb, ar, tabs, nl)
        out.imag[...] = _decode(im, ea, eb, ar, tabs, nl)
    _tick("decode", t0)
    return out


def _wide_products(pairs: list, m: int, n: int, k: int, chunk: int, tabs, ws: _Arena) -> list:
    """The residues ``(L, m, n)`` float32 of each product ``X @ Y`` of ``pairs`` (wide planes, float64), k-chunk by
    k-chunk in float64 BLAS, each chunk's sums reduced."""
    p, ip, h = tabs[:3]
    L = p.size
    t0 = time.perf_counter()
    nth = common._nthreads()
    prods = [ws.take((L, m, n), np.float32) for _ in pairs]
    if _gemms_per_thread(m * n * k):
        # one single-threaded GEMM per thread, each followed by its own reductions: as fast as OpenBLAS's own
        # threads on one GEMM at a time, but those, left spinning for about 2**28 cycles after every call, would
        # share the cores with every pass that follows (the reductions and the decode ran about 1.7x slower on
        # 2 cores). Tasks are (product, modulus, rows) in equal numbers per thread.
        rows = nth // math.gcd(len(pairs) * L, nth)
        cuts = [m * r // rows for r in range(rows + 1)]
        tasks = [(q, l, cuts[r], cuts[r + 1]) for q in range(len(pairs)) for l in range(L) for r in range(rows)]
        bufs = ws.take((nth, m, n), np.float64)

        def part(i: int) -> None:
            for q, l, r0, r1 in tasks[i::nth]:
                X, Y = pairs[q]
                buf, acc = bufs[i, r0:r1], prods[q][l, r0:r1]
                for c0 in range(0, k, chunk):
                    c1 = min(c0 + chunk, k)
                    np.matmul(X[l, r0:r1, c0:c1], Y[l, c0:c1], out=buf)
                    _reduce_into(common._ro(buf), acc, p[l], ip[l], h[l], c0 == 0, 0, r1 - r0)

        with _one_blas_thread():
            common._run_parts(part, nth)
        t0 = _tick("gemm", t0)
    else:
        buf = ws.take((m, n), np.float64)
        for (X, Y), acc in zip(pairs, prods):
            for l in range(L):
                for c0 in range(0, k, chunk):
                    c1 = min(c0 + chunk, k)
                    np.matmul(X[l, :, c0:c1], Y[l, c0:c1], out=buf)
                    t0 = _tick("gemm", t0)
                    common._launch(_reduce_into, m, m * n, common._ro(buf), acc[l], p[l], ip[l], h[l], c0 == 0)
                    t0 = _tick("reduce", t0)
    return prods


def _planes(x: np.ndarray, e: np.ndarray, rows: bool, tabs, ws: _Arena) -> np.ndarray:
    """The wide residues ``(L, *x.shape)`` float64 of one real operand, exponents per row or per column."""
    p, ip, h, c24, pw = tabs[:5]
    xi = common._ro(np.ascontiguousarray(x).view(np.int64))
    out = ws.take((p.size,) + x.shape, np.float64)
    common._launch(_wide_encode, x.shape[0], x.size * p.size, xi, e, rows, p, ip, h, c24, pw, out)
    return out
