"""DGEMM / ZGEMM / matmul emulation: the two-operand residue program (Ozaki scheme II), on NumPy or CuPy arrays.

``op(a)`` gets one power-of-two exponent per row and ``op(b)`` one per
column (the exponent scan, :func:`group_stats` and :func:`gemm_scale`,
shared with :mod:`rnstensor.dask`; the default width keeps the classical
componentwise bound, :func:`classical_moduli`, and rows too wide for it are
split exactly, :func:`row_slices`), both are encoded at the width ``t``, one
exact residue product (the 3M form for complex data) gives the integer
product, and one exact decode rounds ``alpha`` times it once
(:func:`gemm_program`). NumPy operands run on the CPU backend, CuPy
operands on the CUDA backend from encode to decode, with the product in the
layout its tensor-core engines read (``op(b)`` K-contiguous).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from functools import lru_cache
from fractions import Fraction
from typing import Callable, Iterator, Optional, Union

import numpy as np

from .arrays import CASTINGS, array_module, exact_float, exact_result, is_device_array, to_host, to_module
from .backends import dispatch
from .basis import Basis, int8_pool, moduli_count
from .arith import to_int_ref
from .encode import _NONE, entry_stats, exact_bits_needed
from .errors import RNSRangeError
from .magnitude import MeasuredRatio, magnitude_ratio, measure_ratio
from .planner.methods import MIN_BITS, check_kept_bits
from .planner.program import Failure, Given, plan_drops
from .program import ir
from .program.execute import Value, run_step
from .run.exact import least_moduli
from .run.policy import check_rtol
from .run.epilogue import exact_combination, exact_parts, ieee_rows, needs_exact_epilogue, plus_beta_c, zero_parts

__all__ = [
    "dgemm",
    "zgemm",
    "matmul",
    "moduli_for_bits",
    "gemm_moduli",
    "gemm_width",
    "exact_bits_needed",
    "default_workspace_bytes",
    "group_stats",
    "gemm_scale",
    "gemm_program",
    "classical_fits",
    "classical_moduli",
    "magnitude_ratio",
    "row_slices",
    "split_width",
    "auto_split_width",
    "exact_split_sums",
]

#: Range factor ``c`` of the width rule ``c * k * 4**t < P`` (see :func:`gemm_width`).
_RANGE_FACTOR = {"real": 2, "complex": 12}
_MAX_MODULI = len(int8_pool())
_MIN_MODULI = 2

Moduli = Union[None, int, str]

# ----- the width rule ------------------------------------------------------------------------


def _check_kind(kind: str) -> str:
    if kind not in _RANGE_FACTOR:
        raise ValueError(f"kind must be 'real' or 'complex'; got {kind!r}")
    return kind


def gemm_width(s: int, k: int, kind: str = "real") -> int:
    """The scaling width ``t``: the largest integer with ``c * k * 4**t < P(s)`` (``c = 2`` real, ``12`` complex).

    Derivation. Every row of ``op(a)`` and every column of ``op(b)`` is encoded
    with its own power of two so that its integers satisfy ``|v| <= 2**t``
    (``rnstensor.encode``, ``bits=t``). The integer product then has
    ``|c_ij| <= k * 2**t * 2**t``, and the residues determine it only while
    ``2 * |c_ij| < P`` (the centered range): real ``2 * k * 4**t < P``. For the
    3M complex form the sums ``Ar + Ai``, ``Br + Bi`` reach ``2**(t+1)``, so
    ``P2 = (Ar+Ai)(Br+Bi)`` is bounded by ``4 k 4**t``; ``Im = (P2 - P0) - P1``
    is formed by two exact subtractions whose bounds add:
    ``(4 + 1 + 1) k 4**t``, and that bound must satisfy ``2 * 6 k 4**t < P``:
    complex ``12 * k * 4**t < P`` (about 1.3 bits of ``t`` fewer than real).
    These are exactly the range checks of :func:`rnstensor.mode_product`,
    :func:`rnstensor.add` and :func:`rnstensor.sub` with their a-priori bounds,
    so the primitives never raise at this width. The encoder holds any width
    the basis range allows (the wide path builds residues from the IEEE
    significand), so no further cap applies: ``s = 49`` gives ``t = 164`` at
    ``k = 4096``.

    Parameters
    ----------
    s : int
        Number of INT8 moduli (``Basis.int8(s)``).
    k : int
        Contraction length (``k = 0`` is treated as 1).
    kind : {'real', 'complex'}

    Returns
    -------
    int
        ``t``; below 1 when no positive width fits (too few moduli for ``k``).

    Examples
    --------
    >>> gemm_width(16, 4096), gemm_width(16, 4096, "complex"), gemm_width(20, 4096)
    (56, 54, 71)
    """
    c = _RANGE_FACTOR[_check_kind(kind)]
    P = Basis.int8(s).product
    q = (P - 1) // (c * max(int(k), 1))  # 4**t <= q  <=>  c k 4**t < P
    if q < 1:
        return 0
    return (q.bit_length() - 1) // 2


def moduli_for_bits(k: int, bits: int = 53, *, kind: str = "real") -> int:
    """The smallest number of INT8 moduli ``s`` whose width ``gemm_width(s, k)`` is at least ``bits``.

    ``bits = 53`` (the default of :func:`dgemm`) gives float64-level accuracy on
    well-scaled data ([2610.26945] Sec. 4.5, 9.1): the error bound is
    ``|c~ - c| <= 2**-D_i sum_p |b_pj| / 2 + 2**-E_j sum_p |a_ip| / 2 + k 2**(-D_i-E_j) / 4``
    with ``2**-D_i <= 2 * max_p |a_ip| * 2**-t``, i.e. about
    ``2**(1-t) (max|a_i.| |b_.j| + |a_i.| max|b_.j|)``. When the entries of a row
    (column) are of comparable size that is ``O(2**-t) (|A||B|)_ij``; ``t >= 53``
    puts it at or below the unit roundoff times ``|A||B|``, below the classical
    DGEMM bound ``k u |A||B|``. Moreover every entry within ``t - 53`` binades
    of its row (column) maximum is encoded exactly, so ``U[-1, 1)`` data at
    ``k = 4096`` (``s = 16``, ``t = 56``) is exact and the result correctly
    rounded.

    Parameters
    ----------
    k : int
        Contraction length.
    bits : int
        Required width ``t >= 1``.
    kind : {'real', 'complex'}
        The complex (3M) width rule is slightly tighter (see :func:`gemm_width`).

    Raises
    ------
    RNSRangeError
        If even 49 moduli give fewer than ``bits``.

    Examples
    --------
    >>> moduli_for_bits(4096), moduli_for_bits(256), moduli_for_bits(4096, 100)
    (16, 15, 28)
    """
    _check_kind(kind)
    bits = int(bits)
    for s in range(_MIN_MODULI, _MAX_MODULI + 1):
        if gemm_width(s, k, kind) >= bits:
            return s
    raise RNSRangeError(
        f"moduli_for_bits: width {bits} at k={k} needs more than {_MAX_MODULI} moduli "
        f"(49 give t={gemm_width(_MAX_MODULI, k, kind)}); split the contraction or lower bits"
    )


# ----- argument checks -----------------------------------------------------------------------


def _check_trans(flag, name: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(flag, str) or flag.upper() not in allowed:
        raise ValueError(f"{name} must be one of {allowed} (case-insensitive); got {flag!r}")
    return flag.upper()


def _check_array(x, name: str, dtype: np.dtype, fn: str, xp=np):
    """A 2-D operand as ``dtype`` (float64 or complex128), converted only where that is exact (see
    :func:`~rnstensor.arrays.exact_float`: bool, integers up to 2^53, float16/32, complex64)."""
    arr = exact_float(x, name, fn)
    if arr.dtype.kind == "c" and dtype.kind != "c":
        raise TypeError(f"{fn}: {name} must be real ({fn} takes real input, as BLAS dgemm); got dtype {arr.dtype}: "
                        "use rnstensor.zgemm for complex data")
    arr = arr.astype(dtype, copy=False)
    if arr.ndim != 2:
        raise ValueError(f"{fn}: {name} must be 2-D; got shape {tuple(arr.shape)}")
    return arr


def _check_moduli(moduli, fn: str) -> Union[None, int, str]:
    if moduli is None or (isinstance(moduli, str) and moduli in ("auto", "fast")):
        return moduli
    if isinstance(moduli, bool) or not isinstance(moduli, (int, np.integer)):
        raise ValueError(f"{fn}: moduli must be None (the classical float64 bound), 'fast' (moduli_for_bits(k, 53)), "
                         f"'auto' (correctly rounded) or a number of INT8 moduli "
                         f"(1..{_MAX_MODULI}); got {moduli!r}")
    return moduli_count(moduli, f"{fn}: moduli")


def _check_scalar(x, name: str, fn: str, cplx: bool) -> Union[float, complex]:
    try:
        return complex(x) if cplx else float(x)
    except (TypeError, ValueError):
        want = "a complex number" if cplx else "a real number"
        raise TypeError(f"{fn}: {name} must be {want}; got {x!r}") from None


def _check_workspace(workspace_bytes, fn: str, xp=np) -> int:
    if workspace_bytes is None:
        return default_workspace_bytes() if xp is np else _device_workspace_bytes(xp)
    if isinstance(workspace_bytes, bool) or not isinstance(workspace_bytes, (int, np.integer)) or workspace_bytes < 1:
        raise ValueError(f"{fn}: workspace_bytes must be a positive integer; got {workspace_bytes!r}")
    return int(workspace_bytes)


def default_workspace_bytes() -> int:
    """The default workspace for one GEMM: a quarter of the available physical memory, clamped to 64 MiB .. 4 GiB.

    Read from ``os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')``
    at each call; 1 GiB where the system does not report it.

    Examples
    --------
    >>> 64 << 20 <= default_workspace_bytes() <= 4 << 30
    True
    """
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 1 << 30
    return int(min(max(avail // 4, 64 << 20), 4 << 30))


def _device_workspace_bytes(xp) -> int:
    """The default workspace of a GEMM on the device: a quarter of its free memory, clamped to 64 MiB .. 16 GiB."""
    try:
        free = int(xp.cuda.Device().mem_info[0])
    except Exception:  # noqa: BLE001 - a device that does not say: the host rule's middle
        return 1 << 30
    return int(min(max(free // 4, 64 << 20), 16 << 30))


# ----- tiling --------------------------------------------------------------------------------


def _tile_bytes(mb: int, nb: int, k: int, s: int, cplx: bool) -> int:
    """Peak bytes of one ``mb x nb`` output tile (inputs, residue planes, backend staging, decode).

    Real: per input entry ``s`` int8 planes, a float64 copy and float32 BLAS
    staging (``s + 16``); per output entry ``s`` planes, the float64 chunk
    accumulator, a float32 partial, the decoded float64 and its exponent
    (``s + 32``). Complex: both parts, the sums and three products.
    """
    ins = mb * k + k * nb
    if cplx:
        return (3 * s + 40) * ins + (6 * s + 64) * mb * nb
    return (s + 16) * ins + (s + 32) * mb * nb


def _tiles(m: int, n: int, k: int, s: int, cplx: bool, workspace: int) -> tuple[int, int]:
    """Tile sizes: start from the whole C and halve the longer side until one tile fits the workspace."""
    mb, nb = max(m, 1), max(n, 1)
    while _tile_bytes(mb, nb, k, s, cplx) > workspace and (mb > 1 or nb > 1):
        if mb >= nb:
            mb = -(-mb // 2)
        else:
            nb = -(-nb // 2)
    return mb, nb


def _plan_tiles(m: int, n: int, k: int, s: int, cplx: bool, workspace: int) -> tuple[int, int, bool]:
    """``(mb, nb, cache_a)``: tile sizes, and whether ``op(a)`` is encoded once for all tiles.

    Untiled: one tile. Tiled: every column block of ``op(b)`` is encoded once
    (the outer loop) and reused by all its row tiles; ``op(a)`` is encoded
    once as a whole when its encoding peak (``(s + 16) m k`` bytes real,
    ``(3 s + 40) m k`` complex) fits half the workspace, its residue planes
    (``s m k``, complex ``3 s m k``) are then held and the tiles are sized in
    the rest of the workspace; otherwise each row block is encoded per tile.
    Results are bitwise the same in every case (exponents per row / column).
    """
    mb, nb = _tiles(m, n, k, s, cplx, workspace)
    if (mb, nb) == (max(m, 1), max(n, 1)):
        return mb, nb, False
    peak = (3 * s + 40 if cplx else s + 16) * m * k
    held = (3 * s if cplx else s) * m * k
    if peak > workspace // 2:
        return mb, nb, False
    mb, nb = _tiles(m, n, k, s, cplx, workspace - held)
    return mb, nb, True


# ----- timing hook (benchmarks) ---------------------------------------------------------------

#: When a dict, phase times (seconds) accumulate into it: 'other' (checks, the exponent scan, the moduli choice),
#: 'encode', 'products' (ZGEMM: the 3M products with their sums and differences), 'decode'. Wall times.
PHASES: Optional[dict] = None
#: With :data:`PHASES`: called at every phase boundary (a benchmark's device synchronization, so that device phases
#: are timed as they run rather than as they are launched).
PHASE_SYNC: Optional[Callable[[], None]] = None


@contextmanager
def _phase(name: str) -> Iterator[None]:
    if PHASES is None:
        yield
        return
    if PHASE_SYNC is not None:
        PHASE_SYNC()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        if PHASE_SYNC is not None:
            PHASE_SYNC()
        PHASES[name] = PHASES.get(name, 0.0) + time.perf_counter() - t0


# ----- the exponent scan (in memory and Dask alike) -----------------------------------------------

def _magnitude(x):
    """``|x|``, or ``max(|re|, |im|)`` of complex entries: the magnitude an exponent per group is read from."""
    xp = array_module(x)
    return xp.abs(x) if x.dtype.kind != "c" else xp.maximum(xp.abs(x.real), xp.abs(x.imag))


def frexp_exponent(a):
    """The frexp exponent of every positive entry, ``NONE`` for zeros (int64), where ``a`` lives."""
    xp = array_module(a)
    return xp.where(a > 0, xp.frexp(a)[1].astype(np.int64), _NONE)


def group_stats(x, axis: int, need_lsb: bool):
    """``(finite, Emax, lsb_min, Emin)`` per row (``axis=1``) or column (``axis=0``) of a matrix, where it lives.

    ``finite``: the group holds no inf / NaN; ``Emax``: the frexp exponent of
    its largest finite magnitude (``max(|re|, |im|)`` for complex data;
    ``NONE`` for an all-zero group); ``lsb_min`` (``need_lsb`` only, else
    ``None``): the lowest set bit of any of its significands; ``Emin``: the
    frexp exponent of its smallest nonzero finite part (real or imaginary),
    ``NONE`` for an all-zero group. NumPy matrices: one threaded pass over
    the IEEE bits (:func:`rnstensor.backends.cpu_gemm.group_stats`); other
    arrays: two passes over ``|x|`` for the exponents, and the lowest bits
    need every significand.
    """
    if _cpu_scannable(x):
        from .backends.cpu_gemm import group_stats as scan  # noqa: PLC0415 - numba, loaded on first use

        return scan(x, axis, need_lsb)
    return _group_stats_array(x, axis, need_lsb)


def _cpu_scannable(x) -> bool:
    """Whether the CPU's one-pass scan takes ``x``: a 2-D float64 or complex128 NumPy matrix."""
    return array_module(x) is np and x.ndim == 2 and x.dtype in (np.float64, np.complex128)


def _group_stats_array(x, axis: int, need_lsb: bool):
    """:func:`group_stats` in array operations, where ``x`` lives (CuPy, and the reference of the CPU scan)."""
    xp = array_module(x)
    mag = _magnitude(x)
    finite = xp.isfinite(x)
    fin = finite.all(axis=axis)
    all_finite = bool(fin.all())
    amax = mag.max(axis=axis) if all_finite else xp.where(finite, mag, 0.0).max(axis=axis)
    parts = (mag,) if x.dtype.kind != "c" else (xp.abs(x.real), xp.abs(x.imag))
    amin = None
    for p in parts:
        keep = p != 0 if all_finite else (p != 0) & xp.isfinite(p)
        low = xp.where(keep, p, np.inf).min(axis=axis)
        amin = low if amin is None else xp.minimum(amin, low)
    lsb = group_lsb(x, axis) if need_lsb else None
    return fin, frexp_exponent(amax), lsb, frexp_exponent(xp.where(xp.isfinite(amin), amin, 0.0))


def group_lsb(x, axis: int):
    """The ``lsb_min`` of :func:`group_stats` alone (the lowest set bit of any significand per group)."""
    if _cpu_scannable(x):
        return group_stats(x, axis, True)[2]
    return entry_stats(x)[2].min(axis=axis)


class SplitNeeded(RNSRangeError):
    """No width of at most 49 moduli meets the classical bound for some row / column: split it (internal)."""


def _inexact_rho(group, t: int, cplx: bool) -> Optional[int]:
    """``log2`` of the largest relative encoding error of a group at width ``t`` (``None``: all groups exact).

    ``group = (ok, spread, need)`` per row / column (:func:`_groups`): a
    group whose leading exponent is ``Emax`` is encoded at ``2**(t - Emax)``;
    round to nearest moves an entry by at most ``2**(Emax - t - 1)``, which is
    ``2**(spread - t)`` times any nonzero entry of the group (``spread = Emax
    - Emin``; complex: twice that for the modulus of both parts). The group is
    exact from ``t >= need``. One scalar read back, where the vectors live.
    """
    ok, spread, need = group
    if not spread.size:
        return None
    xp = array_module(spread)
    worst = int(xp.where(ok & (need > t), spread, _NONE).max())
    return None if worst == _NONE else worst - t + (1 if cplx else 0)


def _groups(fin, Emax, Emin, lsb):
    """``(ok, spread, need)``: nonzero finite groups, their binade spread, and the width that encodes them exactly.

    Every float64 has 53 significant bits, so ``spread + 53`` is always
    enough; with the lowest set bits known, ``Emax - lsb``.
    """
    xp = array_module(Emax)
    spread = Emax - Emin
    need = spread + 53 if lsb is None else xp.minimum(spread + 53, Emax - lsb)
    return fin & (Emax != _NONE), spread, need


def encoding_budget(k: int, cplx: bool, rtol: Optional[float] = None) -> Fraction:
    """The relative encoding error ``rho`` a GEMM may have against ``|A||B|``, entry by entry.

    ``None``: ``(k - 1) u``, which with the decode's rounding keeps the
    classical bound ``gamma_k`` (:func:`classical_fits`). A target ``rtol``:
    ``rho + u (1 + rho) <= rtol``, so ``(rtol - u) / (1 + u)`` (complex: each
    part within ``rtol / sqrt 2``, so ``rtol * 7 / 10`` stands for it).
    """
    u = Fraction(1, 1 << 53)
    if rtol is None:
        return (max(int(k), 1) - 1) * u
    r = Fraction(rtol) * (Fraction(7, 10) if cplx else 1)
    return max(Fraction(0), (r - u) / (1 + u))


def _check_target(rtol, moduli, fn: str) -> Optional[float]:
    """``rtol`` checked, with ``moduli=None`` (a target chooses the moduli itself)."""
    rtol = check_rtol(rtol, fn)
    if rtol is not None and moduli is not None:
        raise ValueError(f"{fn}: rtol chooses the moduli itself; pass moduli=None with it (got moduli={moduli!r})")
    return rtol


def classical_fits(k: int, rho_a: Optional[int], rho_b: Optional[int], budget: Optional[Fraction] = None) -> bool:
    """Whether relative encoding errors ``2**rho_a`` (rows) and ``2**rho_b`` (columns) keep the classical bound.

    The integer product then differs from the exact one by at most
    ``rho (|A||B|)_ij`` with ``rho = ra + rb + ra rb``, and the correctly
    rounded decode adds ``u |c~|`` (``u = 2**-53``). ``rho <= (k - 1) u``
    makes the whole error at most ``k u + (k - 1) u**2 <= gamma_k (|A||B|)_ij``,
    the classical componentwise bound of a float64 GEMM (``gamma_k = k u /
    (1 - k u)``); ``k = 1`` needs exact encodings. Checked in exact rationals.

    Examples
    --------
    >>> classical_fits(1, None, None), classical_fits(1, -80, None), classical_fits(4096, -44, -44)
    (True, False, True)
    """
    ra = Fraction(2) ** rho_a if rho_a is not None else Fraction(0)
    rb = Fraction(2) ** rho_b if rho_b is not None else Fraction(0)
    return ra + rb + ra * rb <= (Fraction(max(int(k), 1) - 1, 1 << 53) if budget is None else budget)


def _measured_fits(k: int, t: int, cplx: bool, ratio: float, budget: Optional[Fraction] = None) -> bool:
    """The classical bound entry by entry at width ``t`` from :func:`magnitude_ratio`.

    With ``e = 2**(-t-1)`` (complex: ``sqrt 2`` times that, both parts
    rounded) the error of entry ``ij`` is at most ``2**(Ea_i + Eb_j) e (d_ij +
    k e)`` where ``d_ij >= 1`` is the ratio's denominator, so at most ``e (1 + k
    e) d_ij``; that at most ``(k - 1) u / (1 + u)`` times ``|A||B|_ij >= ratio
    d_ij`` keeps ``gamma_k`` as :func:`classical_fits` does. Exact rationals.
    """
    e = Fraction(1, 1 << (t + 1)) * (Fraction(3, 2) if cplx else 1)  # 3/2 > sqrt 2
    u = Fraction(1, 1 << 53)
    rho = (max(k, 1) - 1) * u if budget is None else budget
    return e * (1 + k * e) <= rho / (1 + u) * Fraction(ratio)


def _agreed_ratio(measured: MeasuredRatio, choice: Callable[[float], Optional[int]]) -> Optional[float]:
    """A ratio whose ``choice`` every device makes alike: the measured one where no device's measurement could choose
    otherwise, else the settled one (:meth:`MeasuredRatio.settle`; ``None``: the spreads decide, the ratio not)."""
    band = 2 * measured.spread
    if choice(measured.value * (1 - band)) == choice(measured.value * (1 + band)):
        return measured.value
    return measured.settle()


def classical_moduli(k: int, cplx: bool, a_stats, b_stats, lsb_of: Optional[Callable] = None,
                     magnitudes_of: Optional[Callable] = None, rtol: Optional[float] = None) -> int:
    """The fewest moduli (at least ``moduli_for_bits(k, 53)``) whose width keeps the classical bound: ``moduli=None``.

    From the per row / column exponents of :func:`group_stats`: first
    :func:`classical_fits` on the largest relative encoding error of either
    side (the spreads: nothing but the scan). Where that asks for more than
    the 53-bit width, either that or entry by entry with the measured
    magnitudes (:func:`_measured_fits` on ``magnitudes_of()``,
    :func:`~rnstensor.magnitude.measure_ratio`: one float32 GEMM of ``|A|``
    and ``|B|``, whose last bits differ between devices: where that could
    change the choice, the ratio settled alike on every device decides,
    :func:`_agreed_ratio`). Where
    the magnitudes cannot decide (an ``|A||B|`` entry that is zero, as in
    sparse matrices, or no float32 bound at this ``k``), the lowest set bits
    ``lsb_of()`` refine the spreads: groups exact at a width need no more
    (small integers, or ``U[0, 1)`` data from ``random()``, are exact at 53
    bits whatever their spread). Every test only
    improves with ``s``, so a galloping search from the 53-bit count finds
    the least. Scalars only come back from the device.

    ``rtol``: the target ``|C~ - C| <= rtol |A||B|`` in place of the
    classical bound (:func:`encoding_budget`), from the fewest moduli that
    hold any width (a loose target takes fewer than the 53-bit count).

    Raises
    ------
    SplitNeeded
        No ``s <= 49`` fits: some row or column spans more binades than 49
        moduli hold at the classical accuracy (or at ``rtol``).
    """
    kind = "complex" if cplx else "real"
    budget = encoding_budget(k, cplx, rtol)
    # the classical default never takes fewer than the 53-bit count; a target, the fewest that hold a width
    s0 = moduli_for_bits(k, 53, kind=kind) if rtol is None else moduli_for_bits(k, 1, kind=kind)
    (fa, Ea, la, Na), (fb, Eb, lb, Nb) = a_stats, b_stats

    def fits(s, ga, gb, ratio):
        t = gemm_width(s, k, kind)
        if ratio is not None and _measured_fits(k, t, cplx, ratio, budget):
            return True
        return classical_fits(k, _inexact_rho(ga, t, cplx), _inexact_rho(gb, t, cplx), budget)

    def least(ga, gb, ratio):  # galloping from s0 (the usual answer is near it), then a bisection
        return least_moduli(lambda s: fits(s, ga, gb, ratio), s0)

    ga, gb = _groups(fa, Ea, Na, la), _groups(fb, Eb, Nb, lb)
    ratio = None
    s = least(ga, gb, ratio)
    if s != s0 and magnitudes_of is not None:
        measured = magnitudes_of()
        if measured is not None:
            ratio = _agreed_ratio(measured, lambda r: least(ga, gb, r))
            s = least(ga, gb, ratio) if ratio is not None else s
    # the lowest bits cost a pass over every significand: only where the magnitudes could not decide (an
    # |A||B| entry that is zero, or k too long for their float32 bound), e.g. sparse integer matrices
    if s != s0 and lsb_of is not None and (la is None or lb is None) and not ratio:
        got_a, got_b = lsb_of()
        ga, gb = _groups(fa, Ea, Na, la if la is not None else got_a), _groups(fb, Eb, Nb, lb if lb is not None else got_b)
        s = least(ga, gb, ratio)
    if s is None:
        raise SplitNeeded(
            f"a row of op(a) or column of op(b) spans more binades than {_MAX_MODULI} INT8 moduli hold at the "
            f"{'classical float64 accuracy' if rtol is None else f'accuracy rtol={rtol:g}'} (k={k})"
        )
    return s


def gemm_scale(moduli, k: int, cplx: bool, a_stats, b_stats, fn: str = "dgemm", min_bits: int = MIN_BITS,
               lsb_of: Optional[Callable] = None, magnitudes_of: Optional[Callable] = None,
               rtol: Optional[float] = None):
    """``(s, t, ea, eb)``: moduli, width, and the encoding exponent of every row of ``op(a)`` / column of ``op(b)``.

    From the :func:`group_stats` of both operands (host or device vectors;
    the moduli choice reads scalars back). ``moduli=None``:
    :func:`classical_moduli` (the classical componentwise bound; ``lsb_of``
    and ``magnitudes_of`` supply its refinements on demand); ``'fast'``:
    ``moduli_for_bits(k, 53)``; ``'auto'``: the smallest ``s`` whose width
    holds every finite row and column exactly. ``ea = t - Emax`` for finite
    nonzero rows, 0 for the rest (their results come from float64).

    Raises
    ------
    SplitNeeded
        ``moduli=None`` or ``'auto'`` on a row / column wider than 49 moduli
        hold (the in-memory GEMM then splits it, see :func:`dgemm`).
    RNSRangeError
        ``s`` moduli cannot hold a product of length ``k`` (no width ``t >= 1``).
    PlanError
        An explicit ``moduli`` gives a width ``t`` below ``min_bits``
        (:func:`rnstensor.planner.methods.check_kept_bits`, the rule of einsum and chains).
    """
    kind = "complex" if cplx else "real"
    (fa, Ea, la, _), (fb, Eb, lb, _) = a_stats, b_stats
    xp = array_module(fa, fb, Ea, Eb)
    if isinstance(moduli, int):
        s = moduli
    elif moduli == "fast":
        s = moduli_for_bits(k, 53, kind=kind)
    elif moduli is None:
        s = classical_moduli(k, cplx, a_stats, b_stats, lsb_of, magnitudes_of, rtol)
    else:
        need = 1
        for f, E, lo in ((fa, Ea, la), (fb, Eb, lb)):
            ok = f & (E != _NONE)
            if E.size:
                need = max(need, int(xp.where(ok, E - lo, 1).max()))
        try:
            s = moduli_for_bits(k, need, kind=kind)
        except RNSRangeError:
            # the in-memory GEMM splits such rows / columns exactly and sums the slice products exactly
            raise SplitNeeded(
                f"{fn}: moduli='auto' needs a width of {need} bits to encode every row of op(a) and column of op(b) "
                f"exactly (from the largest entry's leading bit to the smallest nonzero one's lowest), but "
                f"{_MAX_MODULI} INT8 moduli hold t={gemm_width(_MAX_MODULI, k, kind)} at k={k}"
            ) from None
    t = gemm_width(s, k, kind)
    if t < 1:
        least = moduli_for_bits(k, 1, kind=kind)
        raise RNSRangeError(
            f"{fn}: moduli={s} cannot hold a product of length k={k} (even width 1 needs "
            f"{_RANGE_FACTOR[kind]}*k*4 < P); use moduli >= {least}"
        )
    if isinstance(moduli, int):
        check_kept_bits(f"{fn}: moduli={s} at k={k} (width t={t})", float(t), min_bits, None,
                        f"use more moduli (moduli='fast' keeps 53 bits: {moduli_for_bits(k, 53, kind=kind)} at this k)")
    ea = xp.where(fa & (Ea != _NONE), t - Ea, 0).astype(np.int64)
    eb = xp.where(fb & (Eb != _NONE), t - Eb, 0).astype(np.int64)
    return s, t, ea, eb


def _choose(moduli, opa, opb, k: int, cplx: bool, fn: str = "dgemm", min_bits: int = MIN_BITS,
            rtol: Optional[float] = None):
    """The scan and moduli choice of one in-memory GEMM: ``(mode, s, t, ea, eb, A, Bm, fa, fb)``.

    ``A`` / ``Bm`` are ``op(a)`` / ``op(b)`` with their non-finite rows /
    columns zeroed (``fa`` / ``fb`` mark the finite ones). ``mode``:
    ``'whole'`` (one product at ``s`` moduli, width ``t``, exponents ``ea``,
    ``eb``), ``'pairs'`` (``moduli=None`` beyond 49 moduli: :func:`row_slices`
    at :func:`split_width`'s ``s``) or ``'exact'`` (``'auto'`` beyond:
    :func:`exact_split_sums` at :func:`auto_split_width`'s ``s``); the split
    modes leave ``t``, ``ea``, ``eb`` to their slicing.
    """
    xp = array_module(opa, opb)
    auto = moduli == "auto"
    sa, sb = group_stats(opa, 1, auto), group_stats(opb, 0, auto)
    fa, fb = sa[0], sb[0]
    A = opa if bool(fa.all()) else xp.where(fa[:, None], opa, 0)
    Bm = opb if bool(fb.all()) else xp.where(fb[None, :], opb, 0)
    try:
        s, t, ea, eb = gemm_scale(moduli, k, cplx, sa, sb, fn, min_bits, lambda: (group_lsb(A, 1), group_lsb(Bm, 0)),
                                  lambda: measure_ratio(A, sa[1], Bm, sb[1]), rtol)
        return "whole", s, t, ea, eb, A, Bm, fa, fb
    except SplitNeeded as exc:
        if rtol is not None:  # the split product meets the classical bound, not an arbitrary target
            raise RNSRangeError(f"{fn}: rtol={rtol:g} cannot be met within 49 INT8 moduli: {exc}; moduli='auto' is "
                                f"correctly rounded on any data (so within rtol), or pass rtol=None for the classical "
                                f"float64 bound") from None
        if auto:
            return "exact", auto_split_width(k, cplx, A, Bm), None, None, None, A, Bm, fa, fb
        return "pairs", split_width(k, cplx, A, Bm), None, None, None, A, Bm, fa, fb


def _resolve_moduli(moduli, opa, opb, k: int, cplx: bool, rtol: Optional[float] = None) -> int:
    """The number of moduli a GEMM of ``op(a) @ op(b)`` uses (finite rows / columns only)."""
    return _choose(moduli, opa, opb, k, cplx, min_bits=0, rtol=rtol)[1]


# ----- exact slices of wide rows / columns (moduli=None beyond 49 moduli) -------------------------


def row_slices(x, t: int):
    """Split every row of ``x`` into slices each within ``t - 53`` binades of its own largest entry.

    Entry ``x_ik`` of exponent ``E`` goes to slice ``(Emax_i - E) // (t - 52)``
    of its row, whole, so the slices of a row sum to it exactly and each is
    encoded at width ``t`` with an exact leading part (real: exactly; complex:
    the smaller part of an entry loses at most ``u`` of its modulus).

    Returns
    -------
    (xs, owner, rank)
        ``xs`` (rows x k): the nonempty slices, row-major by ``(owner, slice)``;
        ``owner[r]``: the row of ``x`` slice ``r`` belongs to; ``rank[r]``:
        its position among that row's slices.

    Examples
    --------
    >>> xs, owner, rank = row_slices(np.array([[1.0, 1e-300, 0.5]]), 60)
    >>> xs, owner, rank
    (array([[1.e+000, 0.e+000, 5.e-001],
           [0.e+000, 1.e-300, 0.e+000]]), array([0, 0]), array([0, 1]))
    """
    xp = array_module(x)
    q, keys, span = _slice_keys(x, t)
    owner, slot = keys // span, keys % span
    rank = xp.arange(keys.size, dtype=np.int64) - xp.searchsorted(owner, owner, side="left")
    xs = xp.where(q[owner] == slot[:, None], x[owner], 0)
    return xs, owner, rank


def _slice_keys(x, t: int):
    """``(q, keys, span)``: every entry's slice (``-1`` for zeros) and the sorted ``row * span + slice`` in use."""
    xp = array_module(x)
    m, k = x.shape
    E = frexp_exponent(_magnitude(x))
    nz = E != _NONE
    Emax = xp.max(xp.where(nz, E, _NONE), axis=1) if k else xp.full(m, _NONE, np.int64)
    q = xp.where(nz, (Emax[:, None] - E) // (t - 52), -1)
    span = int(q.max()) + 2 if q.size else 1
    keys = xp.unique((xp.arange(m, dtype=np.int64)[:, None] * span + q)[nz])
    return q, keys, span


def _sum_slices(part, owner, rank, rows: int):
    """``sum`` of the slice rows of ``part`` into ``rows`` rows, slice 0 first: the same order on every backend."""
    xp = array_module(part)
    out = xp.zeros((rows,) + tuple(part.shape[1:]), part.dtype)
    for r in range(int(rank.max()) + 1 if rank.size else 0):
        sel = rank == r  # each owner at most once per rank: a plain indexed add
        out[owner[sel]] += part[sel]
    return out


def _slice_exponent(x, axis: int):
    """frexp exponent of each slice's largest magnitude (every slice is nonempty)."""
    return frexp_exponent(_magnitude(x).max(axis=axis))


def split_width(k: int, cplx: bool, A, Bm) -> int:
    """The moduli count of a split GEMM: the cheapest of a few widths by ``s * rows' * columns'`` (slices counted)."""
    kind = "complex" if cplx else "real"
    s0 = moduli_for_bits(k, 53, kind=kind)
    best = None
    for s in sorted({s0, (s0 + _MAX_MODULI) // 2, (3 * s0 + _MAX_MODULI) // 4, _MAX_MODULI}):
        t = gemm_width(s, k, kind)
        rows, cols = _slice_keys(A, t)[1].size, _slice_keys(Bm.T, t)[1].size
        cost = s * max(rows, 1) * max(cols, 1)
        if best is None or cost < best[0]:
            best = (cost, s)
    return best[1]


def _auto_operands(A, Bm, cplx: bool):
    """The real products whose exact sums give ``op(a) @ op(b)``: itself, or (Re, Im) of the complex one.

    ``Re = [Ar, -Ai] [Br; Bi]`` and ``Im = [Ar, Ai] [Bi; Br]``: real slices
    encode every part exactly (a complex entry's two parts may be far apart).
    """
    if not cplx:
        return [(A, Bm)]
    xp = array_module(A, Bm)
    re = (xp.hstack([A.real, -A.imag]), xp.vstack([Bm.real, Bm.imag]))
    im = (xp.hstack([A.real, A.imag]), xp.vstack([Bm.imag, Bm.real]))
    return [re, im]


def auto_split_width(k: int, cplx: bool, A, Bm) -> int:
    """The moduli count of ``moduli='auto'``'s exact split product (:func:`split_width` of its real products)."""
    real = _auto_operands(A, Bm, cplx)
    return split_width(real[0][0].shape[1], False, *real[0])


def exact_split_sums(A, Bm, s: int, be, backend_name) -> tuple[np.ndarray, np.ndarray]:
    """``(S, e)``: the exact real ``A @ Bm`` as Python ints ``S_ij * 2**e_ij``, from exact slices of each row / column.

    Every row of ``A`` and column of ``Bm`` is cut into slices of at most
    ``t - 53`` binades (:func:`row_slices`, each encoded exactly at width
    ``t``), all slice pairs are one residue product, and each output's pair
    integers, shifted to their common exponent, are summed as Python ints:
    nothing rounds. Host arrays (the sums are Python ints).
    """
    k = A.shape[1]
    t = gemm_width(s, k)
    xa, own_a, _ = row_slices(A, t)
    xbt, own_b, _ = row_slices(Bm.T, t)
    basis = Basis.int8(s)
    enc_a, enc_b, product, _ = gemm_program(basis, t, k, False, 1.0).steps
    Ea, Eb = _slice_exponent(xa, 1), _slice_exponent(xbt, 1)
    vals = {0: _encoded(xa, (t - Ea)[:, None], enc_a, basis, be), 1: _encoded(xbt.T, (t - Eb)[None, :], enc_b, basis, be)}
    run_step(product, vals, basis, be, backend_name)
    N = to_int_ref(np.asarray(vals[product.out].planes), basis.moduli)
    ex = (Ea[:, None] + Eb[None, :] - 2 * t).astype(np.int64)  # pair (r, c) is N_rc * 2**ex_rc
    m, n = A.shape[0], Bm.shape[1]
    rows = [np.flatnonzero(own_a == i) for i in range(m)]
    cols = [np.flatnonzero(own_b == j) for j in range(n)]
    S = np.zeros((m, n), dtype=object)
    e = np.zeros((m, n), dtype=np.int64)
    for i in range(m):
        for j in range(n):
            pairs = [(N[r, c], int(ex[r, c])) for r in rows[i] for c in cols[j] if N[r, c] != 0]
            if pairs:
                lo = min(x for _, x in pairs)
                S[i, j] = sum(v << (x - lo) for v, x in pairs)
                e[i, j] = lo
    return S, e


def _exact_auto(A, Bm, cplx: bool, alpha, beta, c, s: int, be, backend_name) -> np.ndarray:
    """``alpha * A @ Bm + beta * c`` rounded once (each part) from :func:`exact_split_sums`."""
    sums = [exact_split_sums(x, y, s, be, backend_name) for x, y in _auto_operands(A, Bm, cplx)]
    return exact_combination(sums, alpha, beta, c, cplx)


# ----- the program ------------------------------------------------------------------------------


@lru_cache(maxsize=256)
def gemm_program(basis: Basis, t: int, k: int, cplx: bool, alpha, transposed: bool = False) -> ir.Program:
    """The residue program of ``alpha * op(a) @ op(b)`` at width ``t``: two encodes, one product, one exact decode.

    Slot 0 is ``op(a)`` (``'ik'``: one exponent per row), slot 1 ``op(b)``:
    ``'kj'`` (one exponent per column), or ``'jk'`` when ``transposed`` (the
    K-contiguous layout of the tensor-core engines, whose product is C^T).
    Complex operands carry their (re, im) parts first (``'cik'``, sharing the
    row exponent) and multiply by the exact 3M form. Bounds: ``2**t`` per
    operand, ``k 4**t`` for the product (``6 k 4**t`` for the 3M parts), which
    :func:`gemm_width` keeps inside the range.

    Examples
    --------
    >>> p = gemm_program(Basis.int8(16), 56, 4096, False, 1.0)
    >>> [type(s).__name__ for s in p.steps]
    ['Encode', 'Encode', 'Contract', 'Decode']
    """
    B = 1 << t
    out = "ji" if transposed else "ij"
    if not cplx:
        b_labels, b_shared = ("jk", (1,)) if transposed else ("kj", (0,))
        steps = (
            ir.Encode(0, 0, t, (1,), "ik", B),
            ir.Encode(1, 1, t, b_shared, b_labels, B),
            ir.Contract(2, 1, 0, b_labels, "ik", "", "", "k", "", "j", "i", "mode", out, k * B * B),
            ir.Decode(3, 2, "exact", alpha),
        )
    else:
        b_labels, b_shared = ("cjk", (0, 2)) if transposed else ("ckj", (0, 1))
        steps = (
            ir.Encode(0, 0, t, (0, 2), "cik", B, complex=True),
            ir.Encode(1, 1, t, b_shared, b_labels, B, complex=True),
            ir.Contract3M(2, 1, 0, b_labels, "cik", "k", "c" + out, 6 * k * B * B),
            ir.Decode(3, 2, "exact", alpha, complex=True),
        )
    planned = plan_drops(ir.Program(basis, steps, 3, out, cplx), {}, Given([]))  # the range check of every step
    if isinstance(planned, Failure):
        raise RNSRangeError(f"gemm: width t={t} at k={k} does not fit {len(basis)} moduli ({planned})")
    return planned.program


def _encoded(x, e, st: ir.Encode, basis: Basis, be) -> Value:
    """An operand (or block of it) encoded with the exponents of the scan (``e`` keepdims, where ``x`` lives)."""
    return Value(be.encode(x, e, basis.moduli, st.bits), -e, 1, st.bound, st.labels)


def _rows(v: Value, lo: int, hi: int) -> Value:
    """Rows ``lo:hi`` (the ``'i'`` index) of an encoded ``op(a)``: contiguous planes, the same exponents."""
    xp = array_module(v.planes)
    ax = v.labels.index("i")
    idx = (slice(None),) * ax + (slice(lo, hi),)
    return Value(xp.ascontiguousarray(v.planes[(slice(None),) + idx]), v.exp[idx], v.factor, v.bound, v.labels)


def _run_tiles(term, prog: ir.Program, A, Bm, ea, eb, m: int, n: int, mb: int, nb: int, cache_a: bool, be, xp,
               backend_name, transposed: bool, finish=None) -> None:
    """Every output tile of ``prog``: ``op(b)`` encoded once per column block, ``op(a)`` once or per row block.

    ``finish(product value, i0, i1, j0, j1)`` gives the tile's result (in the product's layout) in place of the
    program's decode (the exact epilogue)."""
    enc_a, enc_b, product, dec = prog.steps
    cplx = prog.complex
    basis = prog.basis

    def parts(x):
        return xp.stack([x.real, x.imag]) if cplx else x

    ea_k = ea[None, :, None] if cplx else ea[:, None]

    def encode_a(i0, i1):
        return _encoded(parts(A[i0:i1]), ea_k[..., i0:i1, :], enc_a, basis, be)

    whole_a = None
    if cache_a:
        with _phase("encode"):
            whole_a = encode_a(0, m)
    for j0 in range(0, n, nb):
        j1 = min(j0 + nb, n)
        with _phase("encode"):
            if transposed:
                xb = parts(xp.ascontiguousarray(Bm[:, j0:j1].T))
                e = eb[None, j0:j1, None] if cplx else eb[j0:j1, None]
            else:
                xb = parts(Bm[:, j0:j1])
                e = eb[None, None, j0:j1] if cplx else eb[None, j0:j1]
            vb = _encoded(xb, e, enc_b, basis, be)
        for i0 in range(0, m, mb):
            i1 = min(i0 + mb, m)
            if whole_a is not None:
                va = _rows(whole_a, i0, i1)
            else:
                with _phase("encode"):
                    va = encode_a(i0, i1)
            vals = {0: va, 1: vb}
            with _phase("products"):
                run_step(product, vals, basis, be, backend_name)
            with _phase("decode"):
                res = (run_step(dec, vals, basis, be, backend_name) if finish is None
                       else finish(vals[product.out], i0, i1, j0, j1))
            term[i0:i1, j0:j1] = res.T if transposed else res


def _run_product(term, prog: ir.Program, A, Bm, ea, eb, m: int, n: int, k: int, s: int, cplx: bool, workspace: int,
                 be, xp, backend_name, transposed: bool, finish=None) -> None:
    """``term <- prog(A, Bm)``: the backend's own exact GEMM engine where it takes the shape, else the INT8 tiles
    (``finish``: see :func:`_run_tiles`; the engine decodes itself, so it is not used then)."""
    engine = getattr(be, "exact_gemm", None)
    if engine is not None and not transposed and finish is None:
        with _phase("products"):  # the engine's encode and decode count here too
            res = engine(prog, A, Bm, ea, eb, workspace)
        if res is not None:
            term[...] = res
            return
    with _phase("other"):
        mb, nb, cache_a = _plan_tiles(m, n, k, s, cplx, workspace)
    _run_tiles(term, prog, A, Bm, ea, eb, m, n, mb, nb, cache_a, be, xp, backend_name, transposed, finish)


def _exact_whole(prog: ir.Program, A, Bm, ea, eb, m: int, n: int, k: int, s: int, cplx: bool, workspace: int, be, xp,
                 backend_name, transposed: bool, alpha, beta, c):
    """``alpha * A @ Bm + beta * c`` rounded once per entry (part): ``prog``'s exact products, tile by tile, through
    the exact epilogue (:func:`rnstensor.run.epilogue.exact_combination`; ``c`` on the host, or ``None``)."""
    term = np.zeros((m, n), np.complex128 if cplx else np.float64)

    def finish(v: Value, i0: int, i1: int, j0: int, j1: int):
        ct = None if c is None else (c[i0:i1, j0:j1].T if transposed else c[i0:i1, j0:j1])
        return exact_combination(exact_parts(v, prog.basis, cplx), alpha, beta, ct, cplx)

    _run_product(term, prog, A, Bm, ea, eb, m, n, k, s, cplx, workspace, be, xp, backend_name, transposed, finish)
    return to_module(term, xp)


# ----- the driver --------------------------------------------------------------------------------


def gemm_moduli(a, b, moduli: Moduli = None, *, trans_a: str = "N", trans_b: str = "N",
                rtol: Optional[float] = None) -> int:
    """The number of moduli ``s`` that :func:`dgemm` / :func:`zgemm` use for ``op(a) @ op(b)`` with this ``moduli``.

    An integer is returned as is; ``None`` gives :func:`classical_moduli`
    (the fewest that keep the classical componentwise bound; for rows or
    columns wider than 49 moduli hold, the count of the split product,
    :func:`split_width`); ``'fast'`` gives ``moduli_for_bits(k, 53)``
    (complex: the 3M width rule); ``'auto'`` the smallest ``s`` whose width
    encodes every finite row of ``op(a)`` and column of ``op(b)`` exactly (at
    most 49; beyond, the count of the exact split product,
    :func:`auto_split_width`); ``rtol`` (with ``None``) the fewest that meet
    that target. Complex input (either operand) selects the complex rule. NumPy or CuPy operands (the scan runs where
    they live).

    Examples
    --------
    >>> import numpy as np
    >>> a = np.array([[1.0, np.pi * 2.0**-60]])
    >>> gemm_moduli(a, a.T), gemm_moduli(a, a.T, "fast"), gemm_moduli(a, a.T, "auto"), gemm_moduli(a, a.T, 9)
    (15, 14, 29, 9)
    """
    xp = array_module(a, b, names=("a", "b"), fn="gemm_moduli")
    a, b = (x if xp is not np else np.asarray(x) for x in (a, b))
    cplx = a.dtype.kind == "c" or b.dtype.kind == "c"
    fn = "gemm_moduli"
    moduli = _check_moduli(moduli, fn)
    rtol = _check_target(rtol, moduli, fn)
    flags = ("N", "T", "C")
    ta, tb = _check_trans(trans_a, "trans_a", flags), _check_trans(trans_b, "trans_b", flags)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"{fn}: a and b must be 2-D; got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    opa = a if ta == "N" else a.T
    opb = b if tb == "N" else b.T
    dtype = np.complex128 if cplx else np.float64
    opa, opb = opa.astype(dtype, copy=False), opb.astype(dtype, copy=False)
    return _resolve_moduli(moduli, opa, opb, opa.shape[1], cplx, rtol)


def blas_operands(a, b, ta: str, tb: str, cplx: bool, fn: str):
    """``(op(a), op(b))`` for checked BLAS flags (``'C'`` conjugates complex data), inner dimensions checked.

    Works on any array type with ``.T``, ``.conj()`` and ``.shape`` (NumPy, CuPy, Dask).
    """

    def op(x, f):
        if f == "N":
            return x
        return x.T.conj() if (f == "C" and cplx) else x.T

    opa, opb = op(a, ta), op(b, tb)
    m, k = opa.shape
    if opb.shape[0] != k:
        raise ValueError(
            f"{fn}: shape mismatch: op(a) is {m}x{k} (a {tuple(a.shape)}, trans_a={ta!r}) but op(b) is "
            f"{opb.shape[0]}x{opb.shape[1]} (b {tuple(b.shape)}, trans_b={tb!r}); the inner dimensions must agree"
        )
    return opa, opb


def _gemm(fn: str, cplx: bool, a, b, c, alpha, beta, trans_a, trans_b, moduli, out, backend, workspace_bytes,
          min_bits, rtol=None):
    dtype = np.dtype(np.complex128 if cplx else np.float64)
    flags = ("N", "T", "C")
    ta = _check_trans(trans_a, "trans_a", flags)
    tb = _check_trans(trans_b, "trans_b", flags)
    be, xp = dispatch(a, b, c, out, backend=backend, names=("a", "b", "c", "out"), fn=fn)
    a = _check_array(a, "a", dtype, fn, xp)
    b = _check_array(b, "b", dtype, fn, xp)
    moduli = _check_moduli(moduli, fn)
    rtol = _check_target(rtol, moduli, fn)
    alpha = _check_scalar(alpha, "alpha", fn, cplx)
    beta = _check_scalar(beta, "beta", fn, cplx)
    workspace = _check_workspace(workspace_bytes, fn, xp)
    backend_name = be.name if xp is not np else backend

    opa, opb = blas_operands(a, b, ta, tb, cplx, fn)
    m, k = opa.shape
    n = opb.shape[1]
    if c is not None:
        c = c if xp is not np else np.asarray(c)
        if tuple(c.shape) != (m, n):
            raise ValueError(f"{fn}: c must have shape ({m}, {n}) = op(a) rows x op(b) columns; got {tuple(c.shape)}")
        if beta != 0:
            c = _check_array(c, "c", dtype, fn, xp)
    elif beta != 0:
        raise ValueError(f"{fn}: c is required when beta != 0 (got beta={beta!r})")
    if out is not None:
        kind = "CuPy array" if xp is not np else "ndarray"
        ok = is_device_array(out) if xp is not np else isinstance(out, np.ndarray) and out.flags.writeable
        if not ok or out.dtype != dtype or tuple(out.shape) != (m, n):
            raise ValueError(f"{fn}: out must be a writeable {dtype.name} {kind} of shape ({m}, {n})")

    term = xp.zeros((m, n), dtype)
    # moduli='auto' promises alpha * op(a) @ op(b) + beta * c rounded once: where the decode alone cannot (a beta
    # term, or both parts of a complex alpha), the exact product's integers meet alpha, beta and c in the exact
    # epilogue (Python integers, on the host)
    exact_epilogue = needs_exact_epilogue(moduli, alpha, beta, cplx)
    combined = False
    if alpha != 0 and k > 0 and m > 0 and n > 0:
        with _phase("other"):
            mode, s, t, ea, eb, A, Bm, fa, fb = _choose(moduli, opa, opb, k, cplx, fn, min_bits, rtol)
            finite_a, finite_b = bool(fa.all()), bool(fb.all())
            transposed = getattr(be, "gemm_layout", "NN") == "TN"
            if mode == "exact" and xp is not np:  # exact slices, exact sums of their products, one rounding
                raise RNSRangeError(
                    f"{fn}: moduli='auto' on rows / columns wider than 49 moduli hold sums its slice products "
                    f"exactly in Python integers, on the host: pass NumPy arrays, or moduli=None (the "
                    f"classical float64 bound, split on the device)"
                )
            if mode == "pairs":
                # rows / columns too wide for 49 moduli: exact slices of each, every pair of slices one product
                t = gemm_width(s, k, "complex" if cplx else "real")
                xa, own_a, rank_a = row_slices(A, t)
                xbt, own_b, rank_b = row_slices(Bm.T, t)
                A, Bm, slices = xa, xbt.T, (own_a, rank_a, own_b, rank_b)
                ea = t - _slice_exponent(A, 1)
                eb = t - _slice_exponent(Bm, 0)
            if mode != "exact":
                prog = gemm_program(Basis.int8(s), t, k, cplx, alpha, transposed)
        if mode == "whole" and exact_epilogue:
            term = _exact_whole(prog, A, Bm, ea, eb, m, n, k, s, cplx, workspace, be, xp, backend_name, transposed,
                                alpha, beta, to_host(c) if beta != 0 else None)
            combined = True
        elif mode == "whole":
            _run_product(term, prog, A, Bm, ea, eb, m, n, k, s, cplx, workspace, be, xp, backend_name, transposed)
        elif mode == "exact":
            with _phase("products"):
                term[...] = _exact_auto(A, Bm, cplx, alpha, beta if exact_epilogue else 0, to_host(c) if (
                    exact_epilogue and beta != 0) else None, s, be, backend_name)
            combined = exact_epilogue
        else:
            ms, ns = A.shape[0], Bm.shape[1]
            pairs = xp.zeros((ms, ns), dtype)
            _run_product(pairs, prog, A, Bm, ea, eb, ms, ns, k, s, cplx, workspace, be, xp, backend_name, transposed)
            own_a, rank_a, own_b, rank_b = slices
            with _phase("decode"):  # each pair correctly rounded, summed in float64 slice by slice
                by_row = _sum_slices(pairs, own_a, rank_a, m)
                term[...] = _sum_slices(by_row.T, own_b, rank_b, n).T
        if not (finite_a and finite_b):
            ieee_rows(term, opa, opb, fa, fb, alpha, *((beta, c) if combined else ()))
    if exact_epilogue and not combined and m and n:  # nothing multiplied (alpha = 0 or k = 0): beta * c, once
        term = to_module(exact_combination(zero_parts((m, n), cplx), alpha, beta, to_host(c), cplx), xp)
    elif beta != 0 and not combined:
        term = plus_beta_c(term, beta, c, xp)
    if out is not None:
        out[...] = term
        return out
    return term


def dgemm(
    a,
    b,
    c=None,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    trans_a: str = "N",
    trans_b: str = "N",
    moduli: Moduli = None,
    out: Optional[np.ndarray] = None,
    backend: Optional[str] = None,
    workspace_bytes: Optional[int] = None,
    min_bits: int = MIN_BITS,
    rtol: Optional[float] = None,
) -> np.ndarray:
    """``alpha * op(a) @ op(b) + beta * c`` in float64, by exact INT8 residue arithmetic (Ozaki scheme II).

    ``op(a)`` (m x k) is encoded with one power-of-two exponent per row,
    ``op(b)`` (k x n) with one per column, both to the width
    ``t = gemm_width(s, k)`` (integers ``|v| <= 2**t``); one
    :func:`rnstensor.mode_product` gives the exact integer product on every
    modulus (the CPU backend splits ``k`` into exact float32 BLAS chunks of
    1024 summed exactly; for large enough products it computes the same
    integers on 5-16 primes below 2**24 in float64 BLAS instead,
    :mod:`rnstensor.backends.cpu_gemm`, bitwise the same result), and
    :func:`rnstensor.decode` (``'exact'``) rounds
    ``alpha * 2**(-D_i - E_j) * c_ij`` once: with ``beta = 0`` the result is
    the correctly rounded ``alpha`` times the scaled integer product (and of
    the exact ``alpha * op(a) @ op(b)`` whenever the encoding is exact, e.g.
    ``moduli='auto'``). With ``beta != 0`` it is ``fl(that + fl(beta * c))``
    (``fl(that + c)`` for ``beta = 1``), except with ``moduli='auto'``: there
    the exact product's integers, ``alpha``, ``beta`` and ``c`` are summed
    exactly and rounded once (:func:`rnstensor.run.epilogue.exact_combination`,
    Python integers on the host), so the whole ``alpha * op(a) @ op(b) + beta
    * c`` is correctly rounded.

    BLAS semantics: ``beta = 0`` ignores ``c`` (NaN included); ``alpha = 0``
    or ``k = 0`` gives ``beta * c`` without touching ``a`` and ``b``; empty
    ``m`` or ``n`` give an empty result. Scale invariance: multiplying ``a``
    by ``2**j`` multiplies the result by ``2**j`` bit for bit while inputs and
    results stay normal (the integers do not change). Rows of ``op(a)`` and
    columns of ``op(b)`` holding inf or NaN are computed with float64 numpy
    matmul (IEEE propagation, as a float64 BLAS); every other entry is exact
    as above (exponents are per row / column, so they are unaffected).

    Parameters
    ----------
    a, b : ndarray of float64, 2-D, any strides
        NumPy arrays (the CPU backend) or CuPy arrays (the CUDA backend: the
        result is a CuPy array, and nothing data-sized leaves the device).
        Real dtypes that float64 holds exactly are converted (bool, integers
        up to ``2**53`` in magnitude, float16/32); larger integers raise
        ``ValueError``, complex data ``TypeError`` (that is :func:`zgemm`).
    c : ndarray of float64, shape (m, n), optional (required when ``beta != 0``; converted as ``a``)
    alpha, beta : float
    trans_a, trans_b : {'N', 'T', 'C'}
        ``'T'`` and ``'C'`` both transpose (real data).
    moduli : None, 'fast', 'auto' or int in 1..49
        ``None``: at least as accurate as float64 DGEMM, entry by entry: the
        result satisfies the classical bound ``|C~ - C| <= gamma_k |alpha|
        |A||B|`` (``gamma_k = k u / (1 - k u)``; complex ``sqrt(2)
        gamma_{k+2}``), from the fewest moduli whose width keeps every
        entry's encoding error below ``(k - 1) u (|A||B|)_ij``
        (:func:`classical_moduli`: from the rows' and columns' binade
        spreads, else from one float32 GEMM of the scaled magnitudes,
        :func:`magnitude_ratio`). Results then depend on the whole operands'
        data through the width (``'fast'`` or an explicit ``moduli`` keep
        rows and columns independent). Rows or
        columns spanning more binades than 49 moduli hold are split exactly
        into slices of bounded span, every pair of slices is one residue
        product, correctly rounded, and the pairs are summed in float64
        (:func:`row_slices`). ``'fast'``: ``moduli_for_bits(k, 53)``, the
        53-bit width (float64-level accuracy on well-scaled data; a row mixing
        very different magnitudes loses its small entries' bits). ``'auto'``:
        the smallest ``s`` whose width ``t``
        encodes every entry of ``op(a)`` and ``op(b)`` exactly
        (:func:`exact_bits_needed`: per row / column, from the leading bit of
        the largest magnitude to the lowest set bit of the smallest nonzero
        one), so the integer product is the exact product and the result is
        correctly rounded, ``beta * c`` included. Where 49 moduli cannot hold
        that width, every row and column is split exactly into slices of
        bounded span, the slice pairs are residue products, and each entry's
        pair integers are summed exactly (Python integers,
        :func:`exact_split_sums`) before its one rounding: correctly rounded
        on any exponent range, subnormal results and overflow included (NumPy
        operands; CuPy ones raise ``RNSRangeError`` there).
    out : ndarray, optional
        Where to write the result (may be ``c`` itself); a CuPy array for CuPy operands.
    backend : str, optional
        Residue backend (default: the current one); all give identical bits.
    workspace_bytes : int, optional
        Memory bound for the tiling of C over m and n (default
        :func:`default_workspace_bytes`). Tiles are bitwise identical to one
        untiled call: exponents are per row / column and ``s``, ``t`` are
        fixed for the whole call.
    min_bits : int
        With an explicit ``moduli``, the fewest bits the width ``t`` may keep
        (as :func:`rnstensor.einsum`'s ``min_bits``): below it the call raises
        :class:`PlanError`; ``0`` accepts any width (the papers' sweeps over ``s``).
    rtol : float, optional
        A target in place of the classical bound (with ``moduli=None``):
        every entry within ``rtol`` times its ``|alpha| (|A||B|)_ij`` (complex:
        of the complex magnitudes), from the fewest moduli whose rigorous
        bound meets it (:func:`classical_moduli`; a loose target takes fewer
        than the default). At least ``2**-52``; a target 49 moduli cannot
        meet raises :class:`RNSRangeError` pointing to ``moduli='auto'``.

    Returns
    -------
    ndarray of float64, shape (m, n)

    Raises
    ------
    TypeError
        An operand is complex, or of a dtype float64 does not hold (object, strings, longdouble).
    ValueError
        Bad transpose flag, shape mismatch, ``moduli`` out of 1..49, missing ``c``, integers beyond ``2**53``.
    RNSRangeError
        ``moduli`` too small for ``k`` (no width ``t >= 1`` fits).

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> a = np.array([[1.0, 2.0], [3.0, 4.0]])
    >>> rt.dgemm(a, a, trans_b="T")
    array([[ 5., 11.],
           [11., 25.]])
    >>> rt.dgemm(a, a, np.full((2, 2), np.nan), beta=0.0, alpha=0.5)
    array([[ 3.5,  5. ],
           [ 7.5, 11. ]])
    """
    return _gemm("dgemm", False, a, b, c, alpha, beta, trans_a, trans_b, moduli, out, backend, workspace_bytes,
                 min_bits, rtol)


def zgemm(
    a,
    b,
    c=None,
    *,
    alpha: complex = 1.0,
    beta: complex = 0.0,
    trans_a: str = "N",
    trans_b: str = "N",
    moduli: Moduli = None,
    out: Optional[np.ndarray] = None,
    backend: Optional[str] = None,
    workspace_bytes: Optional[int] = None,
    min_bits: int = MIN_BITS,
    rtol: Optional[float] = None,
) -> np.ndarray:
    """``alpha * op(a) @ op(b) + beta * c`` in complex128 by the exact 3M form in residues.

    ``Ar, Ai`` share one exponent per row of ``op(a)`` (the stacked array is
    encoded at once), ``Br, Bi`` one per column of ``op(b)``; then
    ``P0 = Ar Br``, ``P1 = Ai Bi``, ``P2 = (Ar + Ai)(Br + Bi)`` with
    :func:`rnstensor.add` and :func:`rnstensor.mode_product`, and
    ``Re = P0 - P1``, ``Im = P2 - P0 - P1`` with :func:`rnstensor.sub`: 3s
    residue products, all exact, so the real and imaginary parts are each
    the correctly rounded value of the scaled exact product (``alpha = 1``;
    real or purely imaginary ``alpha`` likewise; a general ``alpha`` adds one
    float64 sum per part). Width rule ``12 k 4**t < P`` (:func:`gemm_width`).
    ``'C'`` conjugates. Everything else as :func:`dgemm`.

    Parameters
    ----------
    a, b : ndarray of complex128, 2-D, any strides
        NumPy or CuPy arrays, as in :func:`dgemm`; complex64 and the real
        dtypes :func:`dgemm` converts are converted exactly.
    c : ndarray of complex128, shape (m, n), optional
    alpha, beta : complex
    trans_a, trans_b : {'N', 'T', 'C'}
        ``'C'`` is the conjugate transpose.
    moduli : None, 'fast', 'auto' or int in 1..49
        As :func:`dgemm` (``None``: the classical complex bound ``sqrt(2)
        gamma_{k+2} |alpha| |A||B|``; ``'fast'``: the 53-bit width;
        ``'auto'``: both parts of ``alpha * op(a) @ op(b) + beta * c``
        correctly rounded on any exponent range, complex ``alpha`` and
        ``beta`` included, the split product working on the real products
        ``[Ar, -Ai] [Br; Bi]`` and ``[Ar, Ai] [Bi; Br]`` so that every part is
        encoded exactly).
    out : ndarray, optional
        Where to write the result (may be ``c`` itself); a CuPy array for CuPy operands.
    backend : str, optional
        Residue backend (default: the current one); all give identical bits.
    workspace_bytes : int, optional
        Memory bound for the tiling of C over m and n (default
        :func:`default_workspace_bytes`). Tiles are bitwise identical to one
        untiled call: exponents are per row / column and ``s``, ``t`` are
        fixed for the whole call.
    min_bits : int
        With an explicit ``moduli``, the fewest bits the width ``t`` may keep
        (as :func:`rnstensor.einsum`'s ``min_bits``): below it the call raises
        :class:`PlanError`; ``0`` accepts any width (the papers' sweeps over ``s``).
    rtol : float, optional
        A target in place of the classical bound (with ``moduli=None``):
        every entry within ``rtol`` times its ``|alpha| (|A||B|)_ij`` (complex:
        of the complex magnitudes), from the fewest moduli whose rigorous
        bound meets it (:func:`classical_moduli`; a loose target takes fewer
        than the default). At least ``2**-52``; a target 49 moduli cannot
        meet raises :class:`RNSRangeError` pointing to ``moduli='auto'``.

    Returns
    -------
    ndarray of complex128, shape (m, n)

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> a = np.array([[1 + 2j, 3 - 1j]])
    >>> rt.zgemm(a, a, trans_b="C")
    array([[15.+0.j]])
    """
    return _gemm("zgemm", True, a, b, c, alpha, beta, trans_a, trans_b, moduli, out, backend, workspace_bytes,
                 min_bits, rtol)


def _matmul_dtype(a, b, dtype, fn: str = "matmul") -> np.dtype:
    """The result's dtype: numpy's promotion of the operands' (or ``dtype``: float64 or complex128)."""
    natural = np.result_type(a.dtype, b.dtype)
    if dtype is None:
        return natural
    dt = np.dtype(dtype)
    if dt not in (np.float64, np.complex128):
        raise TypeError(f"{fn}: dtype={dt} is not supported; pass dtype=np.float64 or np.complex128 (or None)")
    if natural.kind == "c" and dt.kind != "c":
        raise TypeError(f"{fn}: dtype={dt} cannot hold the complex product of {a.dtype} and {b.dtype}; "
                        "pass dtype=np.complex128")
    return dt


def matmul(
    a,
    b,
    out=None,
    *,
    dtype=None,
    casting: str = "same_kind",
    moduli: Moduli = None,
    backend: Optional[str] = None,
    workspace_bytes: Optional[int] = None,
    min_bits: int = MIN_BITS,
    rtol: Optional[float] = None,
):
    """``a @ b`` with numpy's semantics, every 2-D product by :func:`dgemm` (real) or :func:`zgemm` (complex).

    1-D ``a`` is a row vector, 1-D ``b`` a column vector (the added axis is
    removed again; two 1-D operands give a scalar); leading axes broadcast
    as batch axes. Operands may be of any dtype float64 or complex128 holds
    exactly: bool, integers up to ``2**53`` in magnitude, float16/32/64,
    complex64/128. The result has numpy's dtype for them. Floating results
    are computed in float64 / complex128 and then (float16/32, complex64)
    rounded once more to the result dtype. Integer and bool results are
    exact: they are computed correctly rounded (``moduli='auto'``), so every
    value below ``2**53`` is the exact integer; results beyond that, or
    beyond the integer dtype's range, raise :class:`RNSRangeError` where
    numpy would wrap them. CuPy operands give a CuPy result, computed on
    the device.

    Parameters
    ----------
    a, b : array_like, at least 1-D
    out : ndarray (or a 1-tuple of one, as numpy's ufuncs take), optional
        Receives the result: of the result's shape exactly, and of a dtype
        the result casts to under ``casting``. Returned. May overlap ``a``
        or ``b``. A narrower float ``out`` rounds the result once more; an
        integer result is written into a narrower integer ``out`` only where
        it fits (:class:`RNSRangeError` where numpy would wrap it).
    dtype : None, float64 or complex128
        Compute and return in this dtype instead of numpy's promotion.
    casting : {'no', 'equiv', 'safe', 'same_kind', 'unsafe'}
        numpy's rule for writing the result into ``out`` (numpy's ufunc
        default, ``'same_kind'``; ``'safe'`` refuses every rounding).
    moduli, backend, workspace_bytes, min_bits, rtol
        As for :func:`dgemm`. Integer and bool results take ``None`` or
        ``'auto'`` (both mean ``'auto'``: exactness needs it), and no ``rtol``.

    Returns
    -------
    ndarray, or a scalar for two 1-D operands (NumPy; a 0-d CuPy array for CuPy)

    Raises
    ------
    ValueError
        0-d operands, mismatched core dimensions, batch axes that do not
        broadcast, ``out`` of another shape.
    TypeError
        An operand dtype float64 cannot hold exactly (object, longdouble,
        strings), an unsupported ``dtype``, an ``out`` that would round.
    RNSRangeError
        An integer result beyond ``2**53`` or its dtype's range.

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> rt.matmul(np.ones((2, 1, 3)), np.arange(3.0))
    array([[3.],
           [3.]])
    >>> rt.matmul(np.array([[1, 2], [3, 4]]), np.array([5, 6]))
    array([17, 39])
    """
    if isinstance(out, tuple) and len(out) == 1:
        out = out[0]
    if casting not in CASTINGS:
        raise ValueError(f"matmul: casting must be one of {CASTINGS}; got {casting!r}")
    xp = array_module(a, b, out, names=("a", "b", "out"), fn="matmul")
    a, b = (x if xp is not np else np.asarray(x) for x in (a, b))
    for name, x in (("a", a), ("b", b)):
        if x.ndim == 0:
            raise ValueError(f"matmul: {name} is 0-d; matmul needs at least 1-D operands (use * for scalars)")
    dt = _matmul_dtype(a, b, dtype)
    if dt.kind in "biu" and (moduli not in (None, "auto") or rtol is not None):
        raise ValueError(f"matmul: integer and bool operands give exact integer results, which need moduli='auto' "
                         f"(or None, which means it here); got moduli={moduli!r}")
    a, b = exact_float(a, "a", "matmul"), exact_float(b, "b", "matmul")
    cplx = dt.kind == "c"
    work = np.complex128 if cplx else np.float64
    a, b = a.astype(work, copy=False), b.astype(work, copy=False)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"matmul: shape mismatch: a {a.shape} and b {b.shape} (core dimension {a2.shape[-1]} != {b2.shape[-2]})")
    try:
        batch = np.broadcast_shapes(tuple(a2.shape[:-2]), tuple(b2.shape[:-2]))
    except ValueError:
        raise ValueError(f"matmul: batch dimensions of a {a.shape} and b {b.shape} do not broadcast") from None
    m, n = a2.shape[-2], b2.shape[-1]
    shape = batch + ((m,) if a.ndim > 1 else ()) + ((n,) if b.ndim > 1 else ())
    if out is not None:
        if not hasattr(out, "shape") or not hasattr(out, "dtype"):
            raise TypeError(f"matmul: out must be an array; got {type(out).__name__}")
        if tuple(out.shape) != shape:
            raise ValueError(f"matmul: out has shape {tuple(out.shape)}, but the result's is {shape} (a "
                             "non-broadcastable output: out must have the result's shape exactly)")
        if not np.can_cast(dt, out.dtype, casting):
            raise TypeError(f"matmul: Cannot cast ufunc 'matmul' output from {dt} to out's {out.dtype} with "
                            f"casting={casting!r}; pass out of dtype {dt}, or another casting=")
    if dt.kind in "biu":
        moduli = "auto"
    A = xp.broadcast_to(a2, batch + tuple(a2.shape[-2:]))
    B = xp.broadcast_to(b2, batch + tuple(b2.shape[-2:]))
    res = xp.empty(batch + (m, n), work)
    gemm = zgemm if cplx else dgemm
    for idx in np.ndindex(*batch):
        gemm(A[idx], B[idx], moduli=moduli, out=res[idx], backend=backend, workspace_bytes=workspace_bytes,
             min_bits=min_bits, rtol=rtol)
    if out is not None:
        narrower_int = dt.kind in "biu" and out.dtype.kind in "biu"
        # res is a fresh array, so out may overlap a or b
        out[...] = exact_result(res.reshape(shape), out.dtype if narrower_int else dt, "matmul")
        return out
    res = exact_result(res.reshape(shape), dt, "matmul")
    return res[()] if xp is np and res.ndim == 0 else res
