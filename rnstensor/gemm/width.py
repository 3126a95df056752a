"""The width rule: moduli ``s`` and width ``t`` for a GEMM of length ``k``, and whether they keep the classical bound."""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import Callable, Optional

import numpy as np

from ..arrays import array_module, to_host
from ..basis import Basis, int8_pool
from ..encode import _NONE
from ..errors import RNSRangeError
from ..magnitude import MeasuredRatio
from ..run.epilogue import epilogue_roundings, needs_exact_epilogue
from ..run.exact import least_moduli
from ..run.policy import default_target

__all__ = [
    "gemm_width",
    "moduli_for_bits",
    "SplitNeeded",
    "encoding_budget",
    "gemm_targets",
    "classical_fits",
    "classical_moduli",
    "classical_moduli_stack",
]

#: Range factor ``c`` of the width rule ``c * k * 4**t < P`` (see :func:`gemm_width`).
_RANGE_FACTOR = {"real": 2, "complex": 12}
_MAX_MODULI = len(int8_pool())
_MIN_MODULI = 2
_FLOAT_MAX = 1.7976931348623157e308

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


class SplitNeeded(RNSRangeError):
    """No width of at most 49 moduli meets the classical bound for some row / column: split it (internal)."""


def _inexact_rho(group, t: int, cplx: bool, xp) -> Optional[int]:
    """``log2`` of the largest relative encoding error of a group at width ``t`` (``None``: all groups exact).

    ``group = (ok, spread, need)`` per row / column (:func:`_groups`): a
    group whose leading exponent is ``Emax`` is encoded at ``2**(t - Emax)``;
    round to nearest moves an entry by at most ``2**(Emax - t - 1)``, which is
    ``2**(spread - t)`` times any nonzero entry of the group (``spread = Emax
    - Emin``; complex: twice that for the modulus of both parts). The group is
    exact from ``t >= need``. One scalar read back, where the vectors live (``xp``).
    """
    if not group[1].size:
        return None
    return _rho_of(int(_worst_spreads(group, t, xp)[0]), t, cplx)


def _worst_spreads(group, ts, xp):
    """The largest spread of the groups still inexact at each width of ``ts`` (an int, or an array of them: a last
    axis per width), over the groups' axis (the last of ``group``'s arrays); ``NONE`` where every group is exact."""
    ok, spread, need = group
    return xp.where(ok[..., None] & (need[..., None] > ts), spread[..., None], _NONE).max(axis=-2)


def _rho_of(worst: int, t: int, cplx: bool) -> Optional[int]:
    """``log2`` of the relative encoding error at width ``t`` of a largest inexact spread ``worst`` (:func:`_inexact_rho`)."""
    return None if worst == _NONE else worst - t + (1 if cplx else 0)


def _groups(fin, Emax, Emin, lsb, xp):
    """``(ok, spread, need)``: nonzero finite groups, their binade spread, and the width that encodes them exactly.

    Every float64 has 53 significant bits, so ``spread + 53`` is always
    enough; with the lowest set bits known, ``Emax - lsb``. Where the
    statistics live (``xp``).
    """
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


def gemm_targets(moduli, rtol: Optional[float], alpha, beta, cplx: bool) -> tuple:
    """``(product target, exact epilogue?)`` of a GEMM call: the ``rtol`` its product must meet so that the whole
    ``alpha op(A) op(B) + beta C`` stays within ``rtol (|alpha| |A||B| + |beta| |C|)`` entry by entry, and whether
    the epilogue must be the exact one (:func:`~rnstensor.run.epilogue.exact_combination`: one rounding).

    ``moduli='auto'`` rounds once where the decode alone cannot
    (:func:`~rnstensor.run.epilogue.needs_exact_epilogue`). A target meets the
    float64 epilogue's roundings: ``n`` of them on a term's path
    (:func:`~rnstensor.run.epilogue.epilogue_roundings`) add at most
    ``gamma_n (1 + rho) (|alpha| |A||B| + |beta| |C|)`` to the product's own
    error ``rho |alpha| |A||B|``, so the product is held to the smaller
    target whose budget (:func:`encoding_budget`) is ``(r - gamma_n) / (1 +
    gamma_n)`` (``r`` the part's share of ``rtol``); where that is not
    positive (a target within the roundings themselves), the exact epilogue
    rounds once and the product keeps ``rtol``. One rounding (``beta = 0``, a
    real or purely imaginary ``alpha``): ``rtol`` as given.

    Examples
    --------
    >>> gemm_targets(None, 1e-10, 1.0, 0.0, False), gemm_targets(None, 1.2e-16, 1.0, 0.5, False)
    ((1e-10, False), (1.2e-16, True))
    >>> target, exact = gemm_targets(None, 1e-10, 1.0, 0.5, False); bool(target < 1e-10), exact
    (True, False)
    """
    exact = needs_exact_epilogue(moduli, alpha, beta, cplx)
    if rtol is None or exact:
        return rtol, exact
    n = epilogue_roundings(alpha, beta, cplx)
    if n == 1:
        return rtol, False
    u = Fraction(1, 1 << 53)
    share = Fraction(7, 10) if cplx else Fraction(1)  # (as encoding_budget reads a complex target)
    gamma_n = n * u / (1 - n * u)
    budget = (Fraction(rtol) * share - gamma_n) / (1 + gamma_n)
    if budget <= 0:
        return rtol, True
    exact_target = (u + (1 + u) * budget) / share  # encoding_budget(target) == budget
    target = float(exact_target)
    if Fraction(target) > exact_target:  # (rounded down: the budget it gives is never larger)
        target = math.nextafter(target, 0.0)
    return target, False


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
    k = max(int(k), 1)
    known = _verdicts(k, budget)  # (a Fraction hashes slowly: one table per k and budget, keyed by the exponents)
    key = (rho_a, rho_b)
    if key not in known:
        ra = Fraction(2) ** rho_a if rho_a is not None else Fraction(0)
        rb = Fraction(2) ** rho_b if rho_b is not None else Fraction(0)
        known[key] = ra + rb + ra * rb <= (Fraction(k - 1, 1 << 53) if budget is None else budget)
    return known[key]


@lru_cache(maxsize=64)
def _verdicts(k: int, budget: Optional[Fraction]) -> dict:
    """The :func:`classical_fits` verdicts found so far for ``k`` and ``budget``, by ``(rho_a, rho_b)``."""
    return {}


def _measured_fits(k: int, t: int, cplx: bool, ratio: float, budget: Optional[Fraction] = None) -> bool:
    """The classical bound entry by entry at width ``t`` from :func:`magnitude_ratio`.

    With ``e = 2**(-t-1)`` (complex: ``sqrt 2`` times that, both parts
    rounded) the error of entry ``ij`` is at most ``2**(Ea_i + Eb_j) e (d_ij +
    k e)`` where ``d_ij >= 1`` is the ratio's denominator, so at most ``e (1 + k
    e) d_ij``; that at most ``(k - 1) u / (1 + u)`` times ``|A||B|_ij >= ratio
    d_ij`` keeps ``gamma_k`` as :func:`classical_fits` does: ``ratio`` at least
    :func:`_measured_threshold`. Exact rationals.
    """
    return _above(ratio, _measured_threshold(k, t, cplx, budget))


def _above(ratio: float, found) -> bool:
    """Whether ``ratio`` reaches the threshold ``found`` of :func:`_measured_threshold` (``None``: none does)."""
    if found is None:
        return False
    lo, hi, least = found
    return ratio >= hi or (ratio >= lo and Fraction(ratio) >= least)


@lru_cache(maxsize=1024)
def _measured_threshold(k: int, t: int, cplx: bool, budget: Optional[Fraction]):
    """``(lo, hi, least)``: the least ratio :func:`_measured_fits` accepts at width ``t``, ``e (1 + k e) (1 + u) /
    rho`` exactly, and floats below and above it (the exact test runs between them only); ``None`` where no ratio
    does (``rho = 0``)."""
    e = Fraction(1, 1 << (t + 1)) * (Fraction(3, 2) if cplx else 1)  # 3/2 > sqrt 2
    u = Fraction(1, 1 << 53)
    rho = (max(k, 1) - 1) * u if budget is None else budget
    if rho <= 0:
        return None
    least = e * (1 + k * e) * (1 + u) / rho
    if least > Fraction(_FLOAT_MAX):
        return math.inf, math.inf, least
    near = float(least)  # within half an ulp: its neighbours bracket it
    return math.nextafter(near, 0.0), math.nextafter(near, math.inf), least


def _agreed_ratio(measured: MeasuredRatio, choice: Callable[[float], Optional[int]]) -> Optional[float]:
    """A ratio whose ``choice`` every device makes alike: the measured one where no device's measurement could choose
    otherwise, else the settled one (:meth:`MeasuredRatio.settle`; ``None``: the spreads decide, the ratio not)."""
    band = 2 * measured.spread
    if choice(measured.value * (1 - band)) == choice(measured.value * (1 + band)):
        return measured.value
    return measured.settle()


def classical_moduli(k: int, cplx: bool, a_stats, b_stats, lsb_of: Optional[Callable] = None,
                     magnitudes_of: Optional[Callable] = None, rtol: Optional[float] = None, xp=None) -> int:
    """The fewest moduli (at least ``moduli_for_bits(k, 53)``) whose width keeps the default's target: ``moduli=None``.

    The target is :func:`~rnstensor.run.policy.default_target` (``(1 +
    2**-5) u (|A||B|)_ij`` with the decode's rounding, or ``gamma_k`` where
    that is smaller), its encoding share :func:`encoding_budget`; the tests
    below are written for that budget.

    From the per row / column exponents of :func:`group_stats`: first
    :func:`classical_fits` on the largest relative encoding error of either
    side (the spreads: nothing but the scan). Where that asks for more than
    the 53-bit width, the lowest set bits ``lsb_of()`` refine the spreads
    (one pass over the significands): groups exact at a width need no more,
    so small integers, or ``U[0, 1)`` data from ``random()``, exact at 53
    bits whatever their spread, stop at the 53-bit count there. Otherwise
    either test, or entry by entry with the measured magnitudes
    (:func:`_measured_fits` on ``magnitudes_of()``,
    :func:`~rnstensor.magnitude.measure_ratio`: one float32 GEMM of ``|A|``
    and ``|B|``, whose last bits differ between devices: where that could
    change the choice, the ratio settled alike on every device decides,
    :func:`_agreed_ratio`; an ``|A||B|`` entry that is zero, as in sparse
    matrices, or no float32 bound at this ``k`` leave it to the spreads and
    bits). Every test only
    improves with ``s``, so a galloping search from the 53-bit count finds
    the least. Scalars only come back from the device.

    ``rtol``: the target ``|C~ - C| <= rtol |A||B|`` in place of the
    classical bound (:func:`encoding_budget`), from the fewest moduli that
    hold any width (a loose target takes fewer than the 53-bit count).
    ``xp``: the statistics' array module, where the caller has it.

    Raises
    ------
    SplitNeeded
        No ``s <= 49`` fits: some row or column spans more binades than 49
        moduli hold at the classical accuracy (or at ``rtol``).
    """
    s = classical_moduli_stack(
        k, cplx, one_matrix(a_stats), one_matrix(b_stats),
        None if lsb_of is None else (lambda: one_matrix(lsb_of())),
        None if magnitudes_of is None else (lambda which: [magnitudes_of()]), rtol, xp)[0]
    if s is None:
        raise SplitNeeded(
            f"a row of op(a) or column of op(b) spans more binades than {_MAX_MODULI} INT8 moduli hold at the "
            f"{'classical float64 accuracy' if rtol is None else f'accuracy rtol={rtol:g}'} (k={k})"
        )
    return s


def one_matrix(stats) -> tuple:
    """One matrix's statistics (vectors, or ``None``) as a stack of one: a leading matrix axis on each."""
    return tuple(None if v is None else v[None] for v in stats)


class _Spreads:
    """``log2`` of the largest relative encoding error of each matrix's rows (or columns) at each moduli count's width
    (:func:`_inexact_rho` of every matrix of a stack at every width). Host statistics: one table of every matrix and
    width. Device ones: a width's column for every matrix of the stack when a search first asks for it, one copy
    of one number per matrix (the searches of a stack's matrices visit mostly the same widths: a few copies for
    the stack, where an entry at a time was a wait for the device each)."""

    def __init__(self, group, widths: dict, cplx: bool, xp):
        self.group, self.widths, self.cplx, self.xp = group, widths, cplx, xp  # (matrices, rows)
        self.column = {s: j for j, s in enumerate(widths)}
        self.worst = None
        self.found: dict = {}  # (device) the columns read so far, by moduli count
        self.shared = group[1].shape[0] == 1  # one matrix's groups, shared by every matrix of the stack
        if group[1].size and xp is np:
            self.worst = _worst_spreads(group, np.asarray(list(widths.values()), dtype=np.int64), np).tolist()

    def rho(self, i: int, s: int) -> Optional[int]:
        """Matrix ``i``'s ``rho`` at ``s`` moduli (``None``: every group exact)."""
        i = 0 if self.shared else i
        if self.worst is None:
            if not self.group[1].size:
                return None
            if s not in self.found:
                self.found[s] = to_host(_worst_spreads(self.group, self.widths[s], self.xp)).reshape(-1).tolist()
            return _rho_of(self.found[s][i], self.widths[s], self.cplx)
        return _rho_of(self.worst[i][self.column[s]], self.widths[s], self.cplx)


def classical_moduli_stack(k: int, cplx: bool, a_stats, b_stats, lsb_of: Optional[Callable] = None,
                           magnitudes_of: Optional[Callable] = None, rtol: Optional[float] = None, xp=None) -> list:
    """:func:`classical_moduli` of every matrix of a stack (``None`` where no ``s <= 49`` fits), each as alone.

    The statistics carry a leading matrix axis (``(matrices, rows)``; ``b_stats``'s of length one where every
    matrix of ``a`` multiplies the same ``b``);
    ``lsb_of()`` gives the lowest set bits of every matrix, ``magnitudes_of(which)``
    the :class:`~rnstensor.magnitude.MeasuredRatio` (or ``None``) of the
    matrices listed. The spreads of every matrix at every width are one
    table; each matrix then takes the steps of :func:`classical_moduli` on
    its own row of it, so its count is the one it gets alone.
    """
    kind = "complex" if cplx else "real"
    budget = encoding_budget(k, cplx, default_target(k, rtol))  # the default's (1 + 2**-5) u, or the caller's rtol
    # the classical default never takes fewer than the 53-bit count; a target, the fewest that hold a width
    s0 = moduli_for_bits(k, 53, kind=kind) if rtol is None else moduli_for_bits(k, 1, kind=kind)
    widths = {s: gemm_width(s, k, kind) for s in range(s0, _MAX_MODULI + 1)}
    (fa, Ea, la, Na), (fb, Eb, lb, Nb) = a_stats, b_stats
    known = _verdicts(max(int(k), 1), budget)

    # the measured test's thresholds per count, looked up once (a Fraction budget hashes slowly)
    limits = {s: _measured_threshold(k, t, cplx, budget) for s, t in widths.items()}

    def fits(i, s, spreads, ratio):
        if ratio is not None and _above(ratio, limits[s]):
            return True
        key = (spreads[0].rho(i, s), spreads[1].rho(i, s))
        return known[key] if key in known else classical_fits(k, *key, budget)

    def least(i, spreads, ratio):  # galloping from s0 (the usual answer is near it), then a bisection
        return least_moduli(lambda s: fits(i, s, spreads, ratio), s0)

    xp = array_module(Ea, Eb) if xp is None else xp  # (the statistics' module, where the caller did not say)
    plain = (_Spreads(_groups(fa, Ea, Na, la, xp), widths, cplx, xp),
             _Spreads(_groups(fb, Eb, Nb, lb, xp), widths, cplx, xp))
    chosen = [least(i, plain, None) for i in range(fa.shape[0])]
    # the lowest bits cost a pass over every significand (O(mk + kn)), the magnitudes one float32 GEMM (O(mnk)):
    # the bits first, and where they alone give the 53-bit count (random() data, small integers: exact at 53 bits)
    # that is the answer, as s0 is the floor; otherwise both, as before (sparse integer matrices: an |A||B| entry
    # of zero leaves the magnitudes undecided)
    left = [i for i, s in enumerate(chosen) if s != s0]
    refined = None
    if left and lsb_of is not None and (la is None or lb is None):
        got_a, got_b = lsb_of()
        refined = (_Spreads(_groups(fa, Ea, Na, la if la is not None else got_a, xp), widths, cplx, xp),
                   _Spreads(_groups(fb, Eb, Nb, lb if lb is not None else got_b, xp), widths, cplx, xp))
        for i in left:
            if least(i, refined, None) == s0:
                chosen[i] = s0
        left = [i for i in left if chosen[i] != s0]
    ratios: dict = {}
    if left and magnitudes_of is not None:
        for i, measured in zip(left, magnitudes_of(left)):
            if measured is not None:
                ratios[i] = _agreed_ratio(measured, lambda r, i=i: least(i, plain, r))
                if ratios[i] is not None:
                    chosen[i] = least(i, plain, ratios[i])
    for i in left:
        if chosen[i] != s0 and refined is not None:
            chosen[i] = least(i, refined, ratios.get(i))
    return chosen
