"""The one GEMM epilogue (:func:`gemm_epilogue`, in-memory tiles and Dask blocks alike) and its exact forms.

:func:`gemm_epilogue` finishes a tile: ``+ beta * C``, numpy's inf / NaN
rows and columns, float64 sums past the range recomputed exactly
(:func:`exact_entries`). With ``moduli='auto'`` it is ``alpha * P + beta * C``
rounded once, from the exact product ``P``. The residue product is an exact integer per entry; ``alpha``, ``beta`` and
``C`` are exact float64 (or complex128) values. Their combination is a sum
of a few exact terms, integers times powers of two, which Python integers
add without rounding; the sum is rounded once to nearest-even (subnormals
and overflow as IEEE float64 has them). For a complex result each part is
``Re(alpha) Re(P) - Im(alpha) Im(P) + Re(beta) Re(C) - Im(beta) Im(C)``
(and its ``Im``), rounded once: the correctly rounded parts of the whole
expression, whatever ``alpha`` and ``beta``.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable, Optional, Sequence

import numpy as np

from ..arith import float_parts, round_scaled_int, to_int_ref
from ..arrays import to_host, to_module
from ..basis import Basis, int8_pool, pow2_cycle

__all__ = ["gemm_epilogue", "exact_combination", "exact_parts", "zero_parts", "needs_exact_epilogue", "plus_beta_c",
           "epilogue_roundings", "ieee_rows", "exact_entries", "two_term_alpha", "combined_planes", "combination_bits", "exact_epilogue"]


def needs_exact_epilogue(moduli, alpha, beta, cplx: bool) -> bool:
    """Whether ``moduli='auto'``'s one rounding needs :func:`exact_combination`: a ``beta * c`` term, or both parts
    of a complex ``alpha`` (a real or purely imaginary ``alpha`` is the exact decode's own factor)."""
    if moduli != "auto":
        return False
    a = complex(alpha)
    return beta != 0 or (cplx and a.real != 0 and a.imag != 0)


def epilogue_roundings(alpha, beta, cplx: bool) -> int:
    """The most roundings any term of an entry (of each part, complex) meets in the float64 epilogue: the decode of
    ``alpha * P`` (one; two where a complex ``alpha``'s two terms are rounded and summed), and where ``beta != 0``
    NumPy's ``beta * c`` (none for ``beta = 1``, one, two for a complex ``beta``'s two terms) and the sum of the two.

    Examples
    --------
    >>> epilogue_roundings(1.5, 0.0, False), epilogue_roundings(1.5, -0.3, False), epilogue_roundings(1 + 2j, 1j, True)
    (1, 2, 3)
    """
    a, b = complex(alpha), complex(beta)
    decode = 2 if cplx and a.real != 0 and a.imag != 0 else 1
    if beta == 0:
        return decode
    times_c = 0 if beta == 1 else 2 if cplx and b.real != 0 and b.imag != 0 else 1
    return max(decode, times_c) + 1


def zero_parts(shape: tuple, cplx: bool) -> list:
    """The parts of an all-zero product (``alpha = 0`` or ``k = 0``: ``beta * c`` alone, still rounded once)."""
    part = (np.zeros(shape, dtype=object), np.zeros(shape, np.int64))
    return [part, part] if cplx else [part]


def exact_parts(v, basis, cplx: bool) -> list:
    """``[(S, e)]`` (``[(Re), (Im)]`` complex) of a product value (:class:`rnstensor.program.execute.Value`): its
    exact integers as Python ints and their exponents, on the host (a device value is copied over)."""
    planes = to_host(v.planes)
    e = np.broadcast_to(to_host(v.exp.total()).astype(np.int64), planes.shape[1:])
    moduli = v.active or basis.moduli
    f = int(v.factor)
    if not cplx:
        return [(to_int_ref(planes, moduli) * f, e)]
    return [(to_int_ref(planes[:, 0], moduli) * f, e[0]), (to_int_ref(planes[:, 1], moduli) * f, e[1])]


def plus_beta_c(term, beta, c, xp):
    """``term + beta * c`` in float64 as NumPy rounds it (``term + c`` for ``beta = 1``), where ``term`` lives.

    A complex ``beta`` times a device ``c`` is formed on the host: NumPy's
    complex multiply (its own rounding, FMA where the CPU has it) is the
    reference every backend and chunking returns.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        if beta == 1:
            return term + c
        if xp is np or not isinstance(beta, complex) or beta.imag == 0:
            return term + beta * c
        return term + xp.asarray(beta * to_host(c))


def ieee_rows(term, opa, opb, fa, fb, alpha, beta=0, c=None) -> None:
    """Rows of ``op(a)`` (``~fa``) and columns of ``op(b)`` (``~fb``) holding inf or NaN, in place: ``alpha`` times
    their float64 product (plus ``beta * c`` where given), IEEE propagation, where the data lives.

    Every entry of such a row or column is inf or NaN, and which one IEEE
    arithmetic decides whatever the summation order: any backend gives the
    same values.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        if not bool(fa.all()):
            term[~fa, :] = alpha * (opa[~fa] @ opb) + (beta * c[~fa, :] if beta != 0 and c is not None else 0)
        if not bool(fb.all()):
            term[:, ~fb] = alpha * (opa @ opb[:, ~fb]) + (beta * c[:, ~fb] if beta != 0 and c is not None else 0)


def _scalar_parts(x: float) -> tuple[int, int]:
    """``x == m * 2**k`` exactly (``m = 0`` for zero)."""
    m, k = float_parts(np.float64(x))
    return int(m), int(k)


def _round_terms(terms) -> float:
    """``sum(w * 2**e for w, e in terms)`` rounded once (terms with ``w == 0`` skipped)."""
    live = [(int(w), int(e)) for w, e in terms if w]
    if not live:
        return 0.0
    lo = min(e for _, e in live)
    return round_scaled_int(sum(w << (e - lo) for w, e in live), lo)


def exact_combination(parts: Sequence[tuple[np.ndarray, np.ndarray]], alpha, beta, c: Optional[np.ndarray],
                      cplx: bool) -> np.ndarray:
    """``alpha * P + beta * c`` rounded once per entry (per part for complex results), on the host.

    Parameters
    ----------
    parts : sequence of (S, e)
        The exact product ``P = S * 2**e`` per entry: ``S`` an object array of
        Python ints, ``e`` an int array of the same shape; one pair for a real
        product, ``(Re, Im)`` for a complex one (:func:`exact_parts`,
        :func:`zero_parts`).
    alpha, beta : float or complex
    c : ndarray, optional
        Read only where ``beta != 0``.
    cplx : bool
        A complex128 result.

    Returns
    -------
    ndarray
        float64 or complex128, the shape of ``S``.

    Examples
    --------
    >>> import numpy as np
    >>> S = np.array([[3, 1 << 80]], dtype=object); e = np.array([[-2, -80]])
    >>> exact_combination([(S, e)], 1.0, 1.0, np.array([[2.0**-60, -1.0]]), False)  # 0.75 + 2**-60, 1 - 1: exact
    array([[0.75, 0.  ]])
    """
    shape = parts[0][0].shape
    use_c = beta != 0 and c is not None
    if use_c and not bool(np.isfinite(c).all()):  # (IEEE's beta * c where c is inf or NaN)
        return _ieee_where_nonfinite(lambda finite_c: exact_combination(parts, alpha, beta, finite_c, cplx), beta, c)
    if not cplx:
        (S, e), = parts
        ma, ka = _scalar_parts(float(alpha))
        mb, kb = _scalar_parts(float(beta))
        mc, kc = float_parts(np.asarray(c, dtype=np.float64)) if use_c else (None, None)
        out = np.empty(shape, np.float64)
        for idx in np.ndindex(*shape):
            terms = [(ma * S[idx], ka + e[idx])]
            if use_c:
                terms.append((mb * int(mc[idx]), kb + int(kc[idx])))
            out[idx] = _round_terms(terms)
        return out
    (Sr, er), (Si, ei) = parts
    alpha, beta = complex(alpha), complex(beta)
    (ar, kar), (ai, kai) = _scalar_parts(alpha.real), _scalar_parts(alpha.imag)
    (br, kbr), (bi, kbi) = _scalar_parts(beta.real), _scalar_parts(beta.imag)
    if use_c:
        c = np.asarray(c, dtype=np.complex128)
        (cr, kcr), (ci, kci) = float_parts(c.real), float_parts(c.imag)
    out = np.empty(shape, np.complex128)
    for idx in np.ndindex(*shape):
        pr, xr = Sr[idx], int(er[idx])
        pi, xi = Si[idx], int(ei[idx])
        re = [(ar * pr, kar + xr), (-ai * pi, kai + xi)]
        im = [(ar * pi, kar + xi), (ai * pr, kai + xr)]
        if use_c:
            gr, yr, gi, yi = int(cr[idx]), int(kcr[idx]), int(ci[idx]), int(kci[idx])
            re += [(br * gr, kbr + yr), (-bi * gi, kbi + yi)]
            im += [(br * gi, kbr + yi), (bi * gr, kbi + yr)]
        out[idx] = complex(_round_terms(re), _round_terms(im))
    return out


def _pow2_mod(s: np.ndarray, p: int) -> np.ndarray:
    """``[2**s]_p`` of every entry of the int64 array ``s >= 0`` (by the cycle of 2 modulo ``p``)."""
    a, t = pow2_cycle(p)
    table = np.array([pow(2, i, p) for i in range(a + t)], np.int64)
    return table[np.where(s < a, s, a + (s - a) % t)]


def _odd_parts(x: float) -> tuple[int, int]:
    """``x == m * 2**k`` exactly with ``m`` odd (``(0, 0)`` for zero): the fewest bits for the significand."""
    m, k = _scalar_parts(x)
    if not m:
        return 0, 0
    tz = (m & -m).bit_length() - 1
    return m >> tz, k + tz


def combination_bits(e, bound: int, alpha, beta, c) -> np.ndarray:
    """The bits of the integer ``W`` with ``alpha * S * 2**e + beta * c = W * 2**f`` (:func:`combined_planes`) for
    ``|S| <= bound``, per entry: ``2**bits`` bounds ``|W|`` (``e`` an int64 array of the entries' exponents; ``c``
    finite float64 where ``beta != 0``, else ``None``). A range that holds ``2**(bits + 1)`` holds ``W``."""
    ma, ka = _odd_parts(float(alpha))
    mb, kb = _odd_parts(float(beta))
    e = np.asarray(e, np.int64)
    g1 = ka + e
    if c is None or mb == 0:
        return np.full(e.shape, abs(ma).bit_length() + int(bound).bit_length(), np.int64) if ma else np.zeros(e.shape,
                                                                                                               np.int64)
    mc, kc = float_parts(c)
    g2 = kb + kc
    one, two = ma != 0, mc != 0
    f = np.where(two, np.minimum(g1, g2), g1) if one else g2
    bits1 = np.where(one, abs(ma).bit_length() + int(bound).bit_length() + (g1 - f), 0)
    bits2 = np.where(two, abs(mb).bit_length() + 53 + (g2 - f), 0)
    return np.maximum(bits1, bits2) + 1


def _distinct(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(values, at)`` with ``s == values[at]``: every integer from ``s``'s least to its largest where that span is
    short (exponent shifts: a few thousand at most; no sort), else :func:`numpy.unique`'s."""
    if s.size == 0:
        return np.zeros(1, np.int64), np.zeros(s.shape, np.int64)
    lo, hi = int(s.min()), int(s.max())
    if hi - lo < max(4096, s.size // 4):
        return np.arange(lo, hi + 1, dtype=np.int64), np.asarray(s - lo, np.int64)
    return np.unique(s, return_inverse=True)


def _flat64(x: np.ndarray) -> np.ndarray:
    """``x`` as a flat C-ordered int64 array (no copy where it is one)."""
    return np.ascontiguousarray(x, np.int64).reshape(-1)


def combined_planes(planes, moduli: Sequence[int], e, bound: int, alpha, beta, c,
                    bits: Optional[np.ndarray] = None) -> tuple:
    """``(W, f, ok)``: ``alpha * S * 2**e + beta * c = W * 2**f`` exactly, ``W`` as residues (int8, centered) on
    ``moduli`` where the range holds it (``ok``), from the residues ``planes`` of the integers ``S`` (``|S| <=
    bound``), on the host; real ``alpha``, ``beta`` and ``c`` (finite; ``None`` where ``beta = 0``).

    ``alpha = ma 2**ka``, ``beta = mb 2**kb`` and ``c = mc 2**kc`` are integers times powers of two, so the sum
    is ``(ma S 2**s1 + mb mc 2**s2) 2**f`` with ``f`` the smaller exponent and ``s1, s2 >= 0`` the shifts: every
    term's residues come from the planes, the significands and powers of two modulo each modulus. Its exact decode
    is the whole expression rounded once, as :func:`exact_combination` rounds it. ``bits``: the caller's
    :func:`combination_bits` of these entries, where it has them.
    """
    ma, ka = _odd_parts(float(alpha))
    mb, kb = _odd_parts(float(beta))
    e = np.asarray(e, np.int64)
    g1 = ka + e
    use_c = c is not None and mb != 0
    if use_c:
        mc, kc = float_parts(c)
        g2 = kb + kc
        two = mc != 0
        f = np.where(two, np.minimum(g1, g2), g1) if ma else np.where(two, g2, 0)
    else:
        f = g1 if ma else np.zeros(e.shape, np.int64)
    P = math.prod(int(p) for p in moduli)
    if bits is None:
        bits = combination_bits(e, bound, alpha, beta, c if use_c else None)
    ok = bits + 1 <= P.bit_length() - 1
    # the shifts take few distinct values (row and column exponents): their powers of two per modulus from those
    shifts1, at1 = _distinct(np.where(ok, g1 - f, 0) if ma else np.zeros(e.shape, np.int64))
    if use_c:
        shifts2, at2 = _distinct(np.where(ok & two, g2 - f, 0))
    from ..backends import get_backend  # noqa: PLC0415 - the CPU backend's one-pass kernel, on these host arrays

    fast = getattr(get_backend("cpu"), "combine_residues", None)
    if fast is not None:
        L = len(moduli)
        W = fast(np.ascontiguousarray(planes).reshape(L, -1), moduli, [ma % int(p) for p in moduli],
                 np.stack([_pow2_mod(shifts1, int(p)) for p in moduli]), _flat64(at1),
                 [(mb % int(p)) if use_c else 0 for p in moduli],
                 _flat64(mc) if use_c else np.zeros(e.size, np.int64),
                 np.stack([_pow2_mod(shifts2 if use_c else np.zeros(1, np.int64), int(p)) for p in moduli]),
                 _flat64(at2) if use_c else np.zeros(e.size, np.int64), ok.reshape(-1))
        if W is not None:
            return W.reshape(planes.shape), f, ok
    W = np.zeros(planes.shape, np.int8)  # (the reference: NumPy passes, plane by plane)
    for l, p in enumerate(int(q) for q in moduli):
        r = np.zeros(e.shape, np.int32)  # (every product below 2**16, every sum below 2**9)
        if ma:
            r = (ma % p) * np.asarray(planes[l], np.int32) % p * _pow2_mod(shifts1, p).astype(np.int32)[at1.reshape(
                e.shape)] % p
        if use_c:
            cp = (mb % p) * (mc % p).astype(np.int32) % p
            r = (r + cp * _pow2_mod(shifts2, p).astype(np.int32)[at2.reshape(e.shape)] % p) % p
        W[l] = np.where(ok, np.where(r < (p + 1) // 2, r, r - p), 0)
    return W, f, ok


def _ieee_where_nonfinite(combine: Callable, beta, c: Optional[np.ndarray]) -> np.ndarray:
    """``combine(c)`` rounded once, with IEEE's ``beta * c`` where ``c`` is inf or NaN (a finite ``alpha P``
    added to it changes nothing there): ``combine`` sees those entries of ``c`` as zeros."""
    bad = None if c is None else ~np.isfinite(c)
    if bad is None or not bool(bad.any()):
        return combine(c)
    y = combine(np.where(bad, 0, c))
    with np.errstate(invalid="ignore", over="ignore"):
        y[bad] = (beta * np.asarray(c))[bad]
    return y


#: Costs of the exact epilogue's two paths, from its phases timed on 512 x 512 outputs on 25 moduli (CPU, 2026-12-06:
#: combination 34 ms, exact decode 18 ms, extension 5 ms) and from :func:`exact_combination` on 65536 entries (0.3 s
#: with their integers): a modulus of range per entry, and one entry by Python integers. The end to end effect is in
#: benchmarks/bench_exact_path.py (a C with two entries 2**+-900 away from the rest)
EPILOGUE_MODULUS_ENTRY_S = 9e-9
EPILOGUE_PYTHON_ENTRY_S = 8e-6


def _extension_moduli(wbits: np.ndarray, s: int) -> int:
    """How many INT8 moduli the exact epilogue's residues extend to (at least ``s``): those the widest entry needs
    (``wbits``: :func:`combination_bits`), unless leaving the few widest to the per-entry Python path costs less
    than the moduli they would add for every entry (one far-out ``c`` entry then no longer widens all)."""
    pool = int8_pool()
    held = [math.prod(pool[:n]).bit_length() - 1 for n in range(len(pool) + 1)]
    w = np.maximum(np.asarray(wbits, np.int64).reshape(-1), 0) + 2  # (bits + 2: what combined_planes keeps)
    if w.size == 0:
        return s
    counts = np.bincount(w)
    beyond = w.size - np.cumsum(counts)  # beyond[b]: the entries wider than b bits
    best, pick = None, len(pool)  # (none within the pool: all of it, the widest left to Python)
    for b in np.flatnonzero(counts):
        n = max(s, int(np.searchsorted(held, b)))  # (the moduli that hold b bits)
        if n >= len(held):
            break
        cost = n * w.size * EPILOGUE_MODULUS_ENTRY_S + int(beyond[b]) * EPILOGUE_PYTHON_ENTRY_S
        if best is None or cost < best:
            best, pick = cost, n
    return max(s, pick)


def exact_epilogue(v, basis, alpha, beta, c: Optional[np.ndarray], cplx: bool) -> np.ndarray:
    """``alpha * P + beta * c`` rounded once per entry (per part) for a product value ``v``
    (:class:`rnstensor.program.execute.Value`), on the host: :func:`exact_combination`'s result.

    A real result is formed in residues where the basis holds the sum's integer (:func:`combined_planes`) and
    decoded exactly once (one vectorized pass); the entries it does not hold, a non-finite ``c`` and complex
    results take :func:`exact_combination` (Python integers, entry by entry).
    """
    from ..backends import get_backend  # noqa: PLC0415 - the backends' base extension and exact decode
    from ..primitives import decode  # noqa: PLC0415
    from ..tensor import RNSTensor, Scale  # noqa: PLC0415

    use_c = beta != 0 and c is not None
    if use_c and not bool(np.isfinite(c).all()):
        return _ieee_where_nonfinite(lambda finite_c: exact_epilogue(v, basis, alpha, beta, finite_c, cplx), beta, c)
    if cplx or v.factor != 1:
        return exact_combination(exact_parts(v, basis, cplx), alpha, beta, c, cplx)
    planes = to_host(v.planes)
    e = np.broadcast_to(np.asarray(to_host(v.exp.total()), np.int64), planes.shape[1:])
    moduli = tuple(v.active or basis.moduli)
    cc = np.asarray(c, np.float64) if use_c else None
    wbits = combination_bits(e, v.bound, alpha, beta, cc)
    s = _extension_moduli(wbits, len(moduli))
    if s > len(moduli) and moduli == tuple(int8_pool()[:len(moduli)]):
        # more INT8 moduli hold the sum: the product's residues base-extended to them (exact: |S| < P / 2)
        basis = Basis.int8(s)
        planes, moduli = get_backend("cpu").drop_extend(planes, moduli, basis, 0, True)
        moduli = tuple(int(p) for p in moduli)
    W, f, ok = combined_planes(planes, moduli, e, v.bound, alpha, beta, cc, wbits)
    # (the bound the decode is told: the largest |W| the kept entries may reach, within the range by ok)
    bits = int(wbits[ok].max(initial=0))
    y = np.asarray(decode(RNSTensor(W, basis, moduli, 1 << bits, Scale(0, 1, (None,) * (W.ndim - 1), f)), "exact"),
                   np.float64)
    if not bool(ok.all()):
        rest = ~ok
        S = to_int_ref(planes[:, rest], moduli)
        y[rest] = exact_combination([(S, e[rest])], alpha, beta, cc[rest] if use_c else None, False)
    return y


def exact_entries(A, Bm, alpha, rows, cols) -> np.ndarray:
    """``alpha * (A[i] . Bm[:, j])`` rounded once for each pair ``(rows[r], cols[r])`` (complex: each part), exactly
    (rationals, on the host): where a float64 sum past the range (a split product's slice products, a complex
    ``alpha``'s two terms) gave ``inf - inf`` or an inf where the exact value is finite."""
    a, b = to_host(A[rows]), to_host(Bm[:, cols]).T
    cplx = a.dtype.kind == "c" or b.dtype.kind == "c" or isinstance(alpha, complex)
    out = np.empty(len(rows), np.complex128 if cplx else np.float64)
    q = lambda v: Fraction(float(v))  # noqa: E731 - every float64 is a rational
    ar, ai = q(complex(alpha).real), q(complex(alpha).imag)
    for r in range(len(rows)):
        if not cplx:
            out[r] = _rounded(ar * sum((q(x) * q(y) for x, y in zip(a[r], b[r])), Fraction(0)))
            continue
        re = sum((q(x.real) * q(y.real) - q(x.imag) * q(y.imag) for x, y in zip(a[r], b[r])), Fraction(0))
        im = sum((q(x.real) * q(y.imag) + q(x.imag) * q(y.real) for x, y in zip(a[r], b[r])), Fraction(0))
        out[r] = complex(_rounded(ar * re - ai * im), _rounded(ar * im + ai * re))
    return out


def _rounded(v: Fraction) -> float:
    """``v`` rounded once to float64 (``±inf`` past the range)."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def two_term_alpha(alpha, cplx: bool) -> bool:
    """Whether the decode forms ``alpha * P`` as two rounded terms (a complex ``alpha`` with both parts nonzero,
    times a complex product), whose float64 sum may overflow where the exact value is finite."""
    a = complex(alpha)
    return cplx and a.real != 0 and a.imag != 0


def gemm_epilogue(term, alpha, beta, c, fa, fb, xp, *, opa=None, opb=None, multiplied: bool = True,
                  combined: bool = False, exact: bool = False, cplx: bool = False):
    """One GEMM tile finished, in memory and in a Dask block alike: ``term`` (``alpha * op(a) @ op(b)`` decoded)
    plus ``beta * c``, numpy's inf / NaN rows, float64 sums past the range recomputed exactly.

    Parameters
    ----------
    term : array
        The tile's decoded product (written in place), or the whole expression rounded once where ``combined``
        (``moduli='auto'``'s exact epilogue, :func:`exact_combination`); zeros where nothing was multiplied
        (``multiplied=False``: ``alpha = 0`` or ``k = 0``).
    fa, fb : array of bool
        The tile's rows of ``op(a)`` and columns of ``op(b)`` free of inf / NaN.
    opa, opb : array, optional
        The tile's operands (rows of ``op(a)``, columns of ``op(b)``): read for the rows and columns holding
        inf / NaN, and to recompute entries whose float64 sum overflowed. A caller may leave them out only where
        neither can occur (every row and column finite, and no split or :func:`two_term_alpha`).
    exact : bool
        ``moduli='auto'``'s promise: ``beta * c`` joins the product before the one rounding.
    """
    if multiplied:
        if not combined and opa is not None:
            # a float64 sum past the range (a split product's pair products, a complex alpha's two terms) gives
            # inf - inf or an inf where the exact value is finite: those entries exactly, rounded once
            over = ~xp.isfinite(term) & fa[:, None] & fb[None, :]
            if bool(over.any()):
                i, j = (to_host(v) for v in xp.nonzero(over))
                term[i, j] = to_module(exact_entries(opa, opb, alpha, i, j), xp)
        if not (bool(fa.all()) and bool(fb.all())):
            ieee_rows(term, opa, opb, fa, fb, alpha, *((beta, c) if combined else ()))
        if combined:
            return term
    elif exact and term.size:  # nothing multiplied: beta * c alone, still rounded once
        ch = None if c is None else to_host(c)
        y = _ieee_where_nonfinite(lambda finite_c: exact_combination(zero_parts(term.shape, cplx), alpha, beta,
                                                                     finite_c, cplx), beta, ch)
        return to_module(y, xp)
    return plus_beta_c(term, beta, c, xp) if beta != 0 else term
