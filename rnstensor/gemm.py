"""DGEMM / ZGEMM / matmul emulation: the two-operand residue chain (Ozaki scheme II) on the RNSTensor primitives."""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from typing import Iterator, Optional, Union

import numpy as np

from .arith import float_parts
from .basis import Basis, int8_pool
from .encode import encode, group_exponents
from .errors import RNSRangeError
from .primitives import EXACT_ROW_SUMS_MAX, add, decode, mode_product, sub
from .tensor import RNSTensor, Scale

__all__ = [
    "dgemm",
    "zgemm",
    "matmul",
    "moduli_for_bits",
    "gemm_moduli",
    "gemm_width",
    "exact_bits_needed",
    "default_workspace_bytes",
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
    well-scaled data (papers/000 Sec. 4.5, 9.1): the error bound is
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


def _trailing_exponent(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(E, lsb)``: frexp exponent and the exponent of the lowest set bit of every entry (0 entries: lsb huge)."""
    m, q = float_parts(x)
    am = np.abs(m)
    nz = am != 0
    low = np.where(nz, am & -am, 1)
    tz = np.frexp(low.astype(np.float64))[1].astype(np.int64) - 1
    lsb = np.where(nz, q + tz, np.iinfo(np.int64).max // 4)
    return np.frexp(x)[1].astype(np.int64), lsb


def exact_bits_needed(x: np.ndarray, shared_axes: tuple[int, ...]) -> int:
    """The smallest width ``t`` at which :func:`rnstensor.encode` holds every entry of ``x`` exactly.

    For a group ``G`` sharing one exponent (``2**(E-1) <= max|G| < 2**E``) the
    encoding is ``x * 2**(t - E)``, an integer iff ``t >= E - lsb(x)`` where
    ``lsb(x)`` is the exponent of the lowest set bit of ``x``'s significand.
    The result is the maximum of ``E - lsb`` over all nonzero entries (at
    least 1); non-finite entries must be masked out before.

    Examples
    --------
    >>> exact_bits_needed(np.array([[1.0, 0.5], [3.0, 2.0**-30]]), (1,))
    32
    """
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return 1
    E, lsb = _trailing_exponent(x)
    Emax = np.max(np.where(x != 0, E, np.iinfo(np.int64).min // 4), axis=shared_axes, keepdims=True)
    need = np.where(x != 0, Emax - lsb, 1)
    return max(int(need.max()), 1)


# ----- argument checks -----------------------------------------------------------------------


def _check_trans(flag, name: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(flag, str) or flag.upper() not in allowed:
        raise ValueError(f"{name} must be one of {allowed} (case-insensitive); got {flag!r}")
    return flag.upper()


def _check_array(x, name: str, dtype: np.dtype, fn: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype != dtype:
        hint = (
            "use rnstensor.zgemm for complex data"
            if fn == "dgemm" and arr.dtype.kind == "c"
            else f"cast with .astype(np.{dtype.name}) if that is exact for your data"
        )
        raise TypeError(f"{fn}: {name} must be a {dtype.name} array ({fn} takes {dtype.name} only); got dtype {arr.dtype}: {hint}")
    if arr.ndim != 2:
        raise ValueError(f"{fn}: {name} must be 2-D; got shape {arr.shape}")
    return arr


def _check_moduli(moduli, fn: str) -> Union[None, int, str]:
    if moduli is None or (isinstance(moduli, str) and moduli == "auto"):
        return moduli
    if isinstance(moduli, bool) or not isinstance(moduli, (int, np.integer)) or not _MIN_MODULI <= moduli <= _MAX_MODULI:
        raise ValueError(
            f"{fn}: moduli must be None (moduli_for_bits(k, 53)), 'auto' or an integer in "
            f"{_MIN_MODULI}..{_MAX_MODULI}; got {moduli!r}"
        )
    return int(moduli)


def _check_scalar(x, name: str, fn: str, cplx: bool) -> Union[float, complex]:
    try:
        return complex(x) if cplx else float(x)
    except (TypeError, ValueError):
        want = "a complex number" if cplx else "a real number"
        raise TypeError(f"{fn}: {name} must be {want}; got {x!r}") from None


def _check_workspace(workspace_bytes, fn: str) -> int:
    if workspace_bytes is None:
        return default_workspace_bytes()
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

#: When a dict, phase times (seconds) accumulate into it: 'encode', 'products', '3m' (ZGEMM sums and differences), 'decode', 'other'.
PHASES: Optional[dict] = None


@contextmanager
def _phase(name: str) -> Iterator[None]:
    if PHASES is None:
        yield
        return
    t0 = time.perf_counter()
    try:
        yield
    finally:
        PHASES[name] = PHASES.get(name, 0.0) + time.perf_counter() - t0


# ----- encoding of the operands ---------------------------------------------------------------


def _row_abs_sums(v: np.ndarray) -> list[int]:
    """Exact ``sum_k |v[j, k]|`` of an int64 matrix with ``|v| < 2**62`` (26-bit halves: no overflow for k < 2**35)."""
    a = np.abs(v)
    hi = (a >> 26).sum(axis=1)
    lo = (a & ((1 << 26) - 1)).sum(axis=1)
    return [(int(h) << 26) + int(l) for h, l in zip(hi, lo)]


# widest t whose integers split into two int64 limbs that _row_abs_sums can take
_LIMB_MAX_T = 90


def _limbs(x: np.ndarray, t: int, shared: tuple[int, ...], op_size: int) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """The integers ``v`` encode holds as ``H * 2**32 + L`` (int64 limbs), when exact row sums are wanted.

    ``y = x * 2**e`` with encode's exponents is exact (a power-of-two
    scaling; values below ``2**-1022`` round to 0 either way); ``H =
    trunc(y / 2**32)`` and ``y - H 2**32`` are exact, and rounding the low
    part half-even gives ``rint(y)`` because ``H 2**32`` is even. None for
    large operators (``mode_product`` then uses ``n_in * bound``) or
    ``t > 90``.
    """
    if t > _LIMB_MAX_T or x.size == 0 or op_size > EXACT_ROW_SUMS_MAX:
        return None
    e = np.broadcast_to(group_exponents(x, t, shared), x.shape).astype(np.int32)
    y = np.ldexp(x, e)
    H = np.trunc(np.ldexp(y, -32))
    L = np.rint(y - np.ldexp(H, 32))
    return H.astype(np.int64), L.astype(np.int64)


def _limb_row_sums(H: np.ndarray, L: np.ndarray) -> tuple[int, ...]:
    """Exact ``sum_k |H 2**32 + L|`` per row (any signs, ``|L| < 2**40``)."""
    q = L >> 32  # floor: afterwards 0 <= L < 2**32, so the sign of H 2**32 + L is the sign of H (+ for H = 0)
    H, L = H + q, L - (q << 32)
    sg = np.where(H >= 0, 1, -1)
    hs = _row_abs_sums(H)
    ls = (sg * L).sum(axis=1)
    return tuple((h << 32) + int(l) for h, l in zip(hs, ls))


def _attach_row_sums(op: RNSTensor, limbs: Optional[tuple[np.ndarray, np.ndarray]]) -> RNSTensor:
    """Give ``op`` its exact row sums from its integers' limbs (what operator_rho would compute, cheaply)."""
    if limbs is not None and op.size <= EXACT_ROW_SUMS_MAX:
        op._row_sums = _limb_row_sums(*limbs)
    return op


def _unstack(T: RNSTensor, part: int, axis: int) -> RNSTensor:
    """Part ``part`` of a stacked ``(2, r, c)`` encoding whose exponents vary along ``axis`` (1 or 2) only."""
    vec = T.scale.axes[axis]
    axes = (vec, None) if axis == 1 else (None, vec)
    scale = Scale(T.scale.exp2, T.scale.factor, axes, None)
    return RNSTensor(T.residues[:, part], T.basis, T.active, T.bound, scale)


def _encode_complex_a(opa: np.ndarray, basis: Basis, t: int, backend):
    """``(Ar, Ai, vs)``: ``op(a)``'s parts sharing one exponent per row, and the limbs of ``Ar + Ai`` (or None)."""
    sa = np.stack([opa.real, opa.imag])
    SA = encode(sa, basis, t, shared_axes=(0, 2), backend=backend)
    Ar, Ai = _unstack(SA, 0, 1), _unstack(SA, 1, 1)
    v = _limbs(sa, t, (0, 2), opa.size)
    if v is None:
        return Ar, Ai, None
    (H, L) = v
    _attach_row_sums(Ar, (H[0], L[0]))
    _attach_row_sums(Ai, (H[1], L[1]))
    return Ar, Ai, (H[0] + H[1], L[0] + L[1])


def _encode_complex_b(opb: np.ndarray, basis: Basis, t: int, backend):
    """``(Br, Bi)``: ``op(b)``'s parts sharing one exponent per column."""
    SB = encode(np.stack([opb.real, opb.imag]), basis, t, shared_axes=(0, 1), backend=backend)
    return _unstack(SB, 0, 2), _unstack(SB, 1, 2)


def _encode_complex(opa: np.ndarray, opb: np.ndarray, basis: Basis, t: int, backend):
    """``Ar, Ai`` sharing one exponent per row and ``Br, Bi`` one per column (stacked encodings)."""
    Ar, Ai, vs = _encode_complex_a(opa, basis, t, backend)
    Br, Bi = _encode_complex_b(opb, basis, t, backend)
    return Ar, Ai, Br, Bi, vs


def _prepare_a(opa: np.ndarray, basis: Basis, t: int, cplx: bool, backend) -> tuple[RNSTensor, ...]:
    """The operator side of a tile: ``(A,)`` real, ``(Ar, Ai, Ar + Ai)`` complex."""
    with _phase("encode"):
        if not cplx:
            A = encode(opa, basis, t, shared_axes=(1,), backend=backend)
            return (_attach_row_sums(A, _limbs(opa, t, (1,), opa.size)),)
        Ar, Ai, vs = _encode_complex_a(opa, basis, t, backend)
    with _phase("3m"):
        return Ar, Ai, _attach_row_sums(add(Ar, Ai, backend=backend), vs)


def _prepare_b(opb: np.ndarray, basis: Basis, t: int, cplx: bool, backend) -> tuple[RNSTensor, ...]:
    """The tensor side of a tile: ``(B,)`` real, ``(Br, Bi, Br + Bi)`` complex."""
    with _phase("encode"):
        if not cplx:
            return (encode(opb, basis, t, shared_axes=(0,), backend=backend),)
        Br, Bi = _encode_complex_b(opb, basis, t, backend)
    with _phase("3m"):
        return Br, Bi, add(Br, Bi, backend=backend)


def _slice(T: RNSTensor, axis: int, lo: int, hi: int) -> RNSTensor:
    """Entries ``lo:hi`` along ``axis`` of a 2-D encoding (contiguous planes; scale, negative zeros, row sums follow)."""
    if lo == 0 and hi == T.shape[axis]:
        return T
    idx = (slice(None),) * axis + (slice(lo, hi),)
    axes = list(T.scale.axes)
    if axes[axis] is not None:
        axes[axis] = axes[axis][lo:hi]
    field = T.scale.field
    if field is not None and field.shape[axis] > 1:
        field = field[idx]
    negz = None if T.negative_zeros is None else T.negative_zeros[idx]
    out = RNSTensor(
        np.ascontiguousarray(T.residues[(slice(None),) + idx]), T.basis, T.active, T.bound,
        Scale(T.scale.exp2, T.scale.factor, axes, field), negz,
    )
    if axis == 0 and T._row_sums is not None:
        out._row_sums = T._row_sums[lo:hi]
    return out


def _products_3m(Ar, Ai, Br, Bi, vs, backend) -> tuple[RNSTensor, RNSTensor]:
    """Exact ``(Re, Im)`` of ``(Ar + i Ai)(Br + i Bi)`` by the 3M form in residues: 3 products, 1 add each side, 3 subs."""
    with _phase("3m"):
        As = _attach_row_sums(add(Ar, Ai, backend=backend), vs)
        Bs = add(Br, Bi, backend=backend)
    return _products_3m_prepared((Ar, Ai, As), (Br, Bi, Bs), backend)


def _products_3m_prepared(pa, pb, backend) -> tuple[RNSTensor, RNSTensor]:
    """The 3M products and differences from prepared ``(Ar, Ai, Ar + Ai)`` and ``(Br, Bi, Br + Bi)``."""
    (Ar, Ai, As), (Br, Bi, Bs) = pa, pb
    with _phase("products"):
        P0 = mode_product(Br, Ar, 0, backend=backend)
        P1 = mode_product(Bi, Ai, 0, backend=backend)
        P2 = mode_product(Bs, As, 0, backend=backend)
    with _phase("3m"):
        re = sub(P0, P1, backend=backend)
        im = sub(sub(P2, P0, backend=backend), P1, backend=backend)
    return re, im


def _products_4m(Ar, Ai, Br, Bi, backend) -> tuple[RNSTensor, RNSTensor]:
    """The 4M form ``(ArBr - AiBi, ArBi + AiBr)`` in residues (the test oracle of the 3M form)."""
    re = sub(mode_product(Br, Ar, 0, backend=backend), mode_product(Bi, Ai, 0, backend=backend), backend=backend)
    im = add(mode_product(Bi, Ar, 0, backend=backend), mode_product(Br, Ai, 0, backend=backend), backend=backend)
    return re, im


# ----- decode with alpha -----------------------------------------------------------------------


def _alpha_parts(alpha: float) -> tuple[int, int]:
    """``|alpha| = ma * 2**ea`` with ``ma`` odd (``alpha`` finite, nonzero)."""
    mant, ex = math.frexp(abs(alpha))
    ma, ea = int(mant * (1 << 53)), ex - 53
    tz = (ma & -ma).bit_length() - 1
    return ma >> tz, ea + tz


def _decode_scaled(T: RNSTensor, alpha: float, backend) -> np.ndarray:
    """The correctly rounded ``alpha * value(T)``: ``alpha``'s significand and exponent join the exact scale.

    Non-finite ``alpha`` multiplies the correctly rounded value in float64
    (IEEE rules); ``alpha == 0`` gives zeros (the exact value is finite).
    """
    if alpha == 0:
        return np.zeros(T.shape)
    if not math.isfinite(alpha):
        with np.errstate(invalid="ignore"):
            return alpha * decode(T, "exact", backend=backend)
    ma, ea = _alpha_parts(alpha)
    scale = T.scale.replace(factor=T.scale.factor * ma, exp2=T.scale.exp2 + ea)
    out = decode(RNSTensor(T.residues, T.basis, T.active, T.bound, scale), "exact", backend=backend)
    return -out if alpha < 0 else out


# ----- the driver --------------------------------------------------------------------------------


def _resolve_moduli(moduli, opa: np.ndarray, opb: np.ndarray, k: int, cplx: bool) -> int:
    kind = "complex" if cplx else "real"
    if isinstance(moduli, int):
        return moduli
    if moduli is None:
        return moduli_for_bits(k, 53, kind=kind)
    # 'auto': the width at which both encodings are exact, so the product is exact
    if cplx:
        need = max(
            exact_bits_needed(np.stack([opa.real, opa.imag]), (0, 2)),
            exact_bits_needed(np.stack([opb.real, opb.imag]), (0, 1)),
        )
    else:
        need = max(exact_bits_needed(opa, (1,)), exact_bits_needed(opb, (0,)))
    try:
        return moduli_for_bits(k, need, kind=kind)
    except RNSRangeError:
        return _MAX_MODULI


def gemm_moduli(a, b, moduli: Moduli = None, *, trans_a: str = "N", trans_b: str = "N") -> int:
    """The number of moduli ``s`` that :func:`dgemm` / :func:`zgemm` use for ``op(a) @ op(b)`` with this ``moduli``.

    An integer is returned as is; ``None`` gives ``moduli_for_bits(k, 53)``
    (complex: the 3M width rule); ``'auto'`` the smallest ``s`` whose width
    encodes every finite row of ``op(a)`` and column of ``op(b)`` exactly
    (at most 49). Complex input (either operand) selects the complex rule.

    Examples
    --------
    >>> import numpy as np
    >>> a = np.array([[1.0, 2.0**-60]])
    >>> gemm_moduli(a, a.T), gemm_moduli(a, a.T, "auto"), gemm_moduli(a, a.T, 9)
    (14, 16, 9)
    """
    a, b = np.asarray(a), np.asarray(b)
    cplx = np.iscomplexobj(a) or np.iscomplexobj(b)
    fn = "gemm_moduli"
    moduli = _check_moduli(moduli, fn)
    flags = ("N", "T", "C")
    ta, tb = _check_trans(trans_a, "trans_a", flags), _check_trans(trans_b, "trans_b", flags)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"{fn}: a and b must be 2-D; got shapes {a.shape} and {b.shape}")
    opa = a if ta == "N" else a.T
    opb = b if tb == "N" else b.T
    if cplx:
        opa, opb = opa.astype(np.complex128), opb.astype(np.complex128)
    else:
        opa, opb = opa.astype(np.float64), opb.astype(np.float64)
    fa = np.isfinite(opa).all(axis=1)
    fb = np.isfinite(opb).all(axis=0)
    ea = np.where(fa[:, None], opa, 0)
    eb = np.where(fb[None, :], opb, 0)
    return _resolve_moduli(moduli, ea, eb, opa.shape[1], cplx)


def blas_operands(a, b, ta: str, tb: str, cplx: bool, fn: str):
    """``(op(a), op(b))`` for checked BLAS flags (``'C'`` conjugates complex data), inner dimensions checked.

    Works on any array type with ``.T``, ``.conj()`` and ``.shape`` (numpy, Dask).
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


def _gemm(fn: str, cplx: bool, a, b, c, alpha, beta, trans_a, trans_b, moduli, out, backend, workspace_bytes):
    dtype = np.dtype(np.complex128 if cplx else np.float64)
    flags = ("N", "T", "C")
    ta = _check_trans(trans_a, "trans_a", flags)
    tb = _check_trans(trans_b, "trans_b", flags)
    a = _check_array(a, "a", dtype, fn)
    b = _check_array(b, "b", dtype, fn)
    moduli = _check_moduli(moduli, fn)
    alpha = _check_scalar(alpha, "alpha", fn, cplx)
    beta = _check_scalar(beta, "beta", fn, cplx)
    workspace = _check_workspace(workspace_bytes, fn)

    opa, opb = blas_operands(a, b, ta, tb, cplx, fn)
    m, k = opa.shape
    n = opb.shape[1]
    if c is not None:
        c = np.asarray(c)
        if c.shape != (m, n):
            raise ValueError(f"{fn}: c must have shape ({m}, {n}) = op(a) rows x op(b) columns; got {c.shape}")
        if c.dtype != dtype and beta != 0:
            raise TypeError(f"{fn}: c must be a {dtype.name} array; got dtype {c.dtype}")
    elif beta != 0:
        raise ValueError(f"{fn}: c is required when beta != 0 (got beta={beta!r})")
    if out is not None:
        if not isinstance(out, np.ndarray) or out.dtype != dtype or out.shape != (m, n) or not out.flags.writeable:
            raise ValueError(f"{fn}: out must be a writeable {dtype.name} ndarray of shape ({m}, {n})")

    term = np.zeros((m, n), dtype)
    if alpha != 0 and k > 0 and m > 0 and n > 0:
        with _phase("other"):
            fa = np.isfinite(opa).all(axis=1)
            fb = np.isfinite(opb).all(axis=0)
            ea = opa if fa.all() else np.where(fa[:, None], opa, 0)
            eb = opb if fb.all() else np.where(fb[None, :], opb, 0)
            s = _resolve_moduli(moduli, ea, eb, k, cplx)
            kind = "complex" if cplx else "real"
            t = gemm_width(s, k, kind)
            if t < 1:
                need = moduli_for_bits(k, 1, kind=kind)
                raise RNSRangeError(
                    f"{fn}: moduli={s} cannot hold a product of length k={k} (even width 1 needs "
                    f"{_RANGE_FACTOR[kind]}*k*4 < P); use moduli >= {need}"
                )
            basis = Basis.int8(s)
            mb, nb, cache_a = _plan_tiles(m, n, k, s, cplx, workspace)
        whole_a = _prepare_a(ea, basis, t, cplx, backend) if cache_a else None
        for j0 in range(0, n, nb):
            j1 = min(j0 + nb, n)
            pb = _prepare_b(eb[:, j0:j1], basis, t, cplx, backend)
            for i0 in range(0, m, mb):
                i1 = min(i0 + mb, m)
                if whole_a is not None:
                    pa = tuple(_slice(T, 0, i0, i1) for T in whole_a)
                else:
                    pa = _prepare_a(ea[i0:i1], basis, t, cplx, backend)
                _tile(term, pa, pb, i0, j0, alpha, cplx, backend)
        # rows / columns holding inf or NaN: float64 BLAS with IEEE propagation
        with np.errstate(invalid="ignore", over="ignore"):
            if not fa.all():
                term[~fa, :] = alpha * (opa[~fa] @ opb)
            if not fb.all():
                term[:, ~fb] = alpha * (opa @ opb[:, ~fb])
    if beta != 0:
        with np.errstate(invalid="ignore", over="ignore"):
            term = term + (c if beta == 1 else beta * c)
    if out is not None:
        out[...] = term
        return out
    return term


def _tile(term, pa, pb, i0, j0, alpha, cplx, backend) -> None:
    """One output tile from prepared operands: exact residue products, exact decode (with alpha) into ``term``."""
    i1, j1 = i0 + pa[0].shape[0], j0 + pb[0].shape[1]
    if not cplx:
        with _phase("products"):
            Z = mode_product(pb[0], pa[0], 0, backend=backend)
        with _phase("decode"):
            term[i0:i1, j0:j1] = _decode_scaled(Z, alpha, backend)
        return
    re, im = _products_3m_prepared(pa, pb, backend)
    with _phase("decode"):
        ar, ai = alpha.real, alpha.imag
        # (ar + i ai)(Re + i Im): each term correctly rounded, one float64 sum where both parts are nonzero
        term[i0:i1, j0:j1].real = _decode_scaled(re, ar, backend) - _decode_scaled(im, ai, backend) if ai else _decode_scaled(re, ar, backend)
        term[i0:i1, j0:j1].imag = _decode_scaled(im, ar, backend) + _decode_scaled(re, ai, backend) if ai else _decode_scaled(im, ar, backend)


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
) -> np.ndarray:
    """``alpha * op(a) @ op(b) + beta * c`` in float64, by exact INT8 residue arithmetic (Ozaki scheme II).

    ``op(a)`` (m x k) is encoded with one power-of-two exponent per row,
    ``op(b)`` (k x n) with one per column, both to the width
    ``t = gemm_width(s, k)`` (integers ``|v| <= 2**t``); one
    :func:`rnstensor.mode_product` gives the exact integer product on every
    modulus (the CPU backend splits ``k`` into exact float32 BLAS chunks of
    1024 summed exactly), and :func:`rnstensor.decode` (``'exact'``) rounds
    ``alpha * 2**(-D_i - E_j) * c_ij`` once: with ``beta = 0`` the result is
    the correctly rounded ``alpha`` times the scaled integer product (and of
    the exact ``alpha * op(a) @ op(b)`` whenever the encoding is exact, e.g.
    ``moduli='auto'``). With ``beta != 0`` it is ``fl(that + fl(beta * c))``
    (``fl(that + c)`` for ``beta = 1``).

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
    c : ndarray of float64, shape (m, n), optional (required when ``beta != 0``)
    alpha, beta : float
    trans_a, trans_b : {'N', 'T', 'C'}
        ``'T'`` and ``'C'`` both transpose (real data).
    moduli : None, 'auto' or int in 2..49
        ``None``: ``moduli_for_bits(k, 53)`` (float64-level accuracy on
        well-scaled data). ``'auto'``: the smallest ``s`` whose width ``t``
        encodes every entry of ``op(a)`` and ``op(b)`` exactly
        (:func:`exact_bits_needed`: per row / column, from the leading bit of
        the largest magnitude to the lowest set bit of the smallest nonzero
        one), so the integer product is the exact product and the result is
        correctly rounded; capped at 49 (best effort: ``t = gemm_width(49, k)``).
    out : ndarray, optional
        Where to write the result (may be ``c`` itself).
    backend : str, optional
        Residue backend (default: the current one); all give identical bits.
    workspace_bytes : int, optional
        Memory bound for the tiling of C over m and n (default
        :func:`default_workspace_bytes`). Tiles are bitwise identical to one
        untiled call: exponents are per row / column and ``s``, ``t`` are
        fixed for the whole call.

    Returns
    -------
    ndarray of float64, shape (m, n)

    Raises
    ------
    TypeError
        An operand is not float64.
    ValueError
        Bad transpose flag, shape mismatch, ``moduli`` out of 2..49, missing ``c``.
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
    return _gemm("dgemm", False, a, b, c, alpha, beta, trans_a, trans_b, moduli, out, backend, workspace_bytes)


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
    c : ndarray of complex128, shape (m, n), optional
    alpha, beta : complex
    trans_a, trans_b : {'N', 'T', 'C'}
        ``'C'`` is the conjugate transpose.
    moduli : None, 'auto' or int in 2..49
        ``None``: ``moduli_for_bits(k, 53)`` (float64-level accuracy on
        well-scaled data). ``'auto'``: the smallest ``s`` whose width ``t``
        encodes every entry of ``op(a)`` and ``op(b)`` exactly
        (:func:`exact_bits_needed`: per row / column, from the leading bit of
        the largest magnitude to the lowest set bit of the smallest nonzero
        one), so the integer product is the exact product and the result is
        correctly rounded; capped at 49 (best effort: ``t = gemm_width(49, k)``).
    out : ndarray, optional
        Where to write the result (may be ``c`` itself).
    backend : str, optional
        Residue backend (default: the current one); all give identical bits.
    workspace_bytes : int, optional
        Memory bound for the tiling of C over m and n (default
        :func:`default_workspace_bytes`). Tiles are bitwise identical to one
        untiled call: exponents are per row / column and ``s``, ``t`` are
        fixed for the whole call.

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
    return _gemm("zgemm", True, a, b, c, alpha, beta, trans_a, trans_b, moduli, out, backend, workspace_bytes)


def matmul(
    a,
    b,
    *,
    moduli: Moduli = None,
    backend: Optional[str] = None,
    workspace_bytes: Optional[int] = None,
) -> np.ndarray:
    """``a @ b`` with numpy's semantics, every 2-D product by :func:`dgemm` (float64) or :func:`zgemm` (complex128).

    1-D ``a`` is a row vector, 1-D ``b`` a column vector (the added axis is
    removed again); leading axes broadcast as batch axes. A float64 operand
    meets a complex128 one as complex128 (exact). Other dtypes: ``TypeError``.

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> rt.matmul(np.ones((2, 1, 3)), np.arange(3.0))
    array([[3.],
           [3.]])
    """
    a, b = np.asarray(a), np.asarray(b)
    for name, x in (("a", a), ("b", b)):
        if x.dtype not in (np.float64, np.complex128):
            raise TypeError(f"matmul: {name} must be float64 or complex128 (dgemm / zgemm emulation); got dtype {x.dtype}")
        if x.ndim == 0:
            raise ValueError(f"matmul: {name} is 0-d; matmul needs at least 1-D operands (use * for scalars)")
    cplx = np.complex128 in (a.dtype, b.dtype)
    if cplx:
        a, b = a.astype(np.complex128, copy=False), b.astype(np.complex128, copy=False)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"matmul: shape mismatch: a {a.shape} and b {b.shape} (core dimension {a2.shape[-1]} != {b2.shape[-2]})")
    try:
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: batch dimensions of a {a.shape} and b {b.shape} do not broadcast") from None
    m, n = a2.shape[-2], b2.shape[-1]
    A = np.broadcast_to(a2, batch + a2.shape[-2:])
    B = np.broadcast_to(b2, batch + b2.shape[-2:])
    res = np.empty(batch + (m, n), np.complex128 if cplx else np.float64)
    gemm = zgemm if cplx else dgemm
    for idx in np.ndindex(*batch):
        gemm(A[idx], B[idx], moduli=moduli, out=res[idx], backend=backend, workspace_bytes=workspace_bytes)
    if a.ndim == 1:
        res = res[..., 0, :]
    if b.ndim == 1:
        res = res[..., 0]
    return res
