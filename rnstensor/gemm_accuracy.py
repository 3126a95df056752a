"""GEMM accuracy harness ([2610.26945] Tables 6-8, ZGEMM rows): exact references by split float64 GEMMs, ulp / CR% / errors."""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import numpy as np

from .arith import float_parts, round_scaled_int
from .gemm import dgemm, gemm_moduli, gemm_width, zgemm

__all__ = [
    "GEMM_DATASETS",
    "TABLE7_DATASETS",
    "TABLE8_DATASETS",
    "PAPER_TABLE7",
    "EXTENDED_WIDTH",
    "gemm_dataset",
    "zgemm_dataset",
    "exact_gemm",
    "gemm_metrics",
    "ExactReference",
    "exact_zgemm",
    "gemm_accuracy",
    "gemm_thresholds",
]

#: The data sets of [2610.26945] Sec. 7-8.3.
GEMM_DATASETS = ("uniform", "phi0.5", "phi1", "phi2", "phi4", "sincos", "spike", "cancel", "boundary")

#: The data sets of [2610.26945] Table 7 (smallest s per accuracy level) and Table 8 (worst cases).
TABLE7_DATASETS = ("uniform", "phi0.5", "phi1", "phi2", "phi4", "sincos")
TABLE8_DATASETS = ("spike", "cancel", "boundary")

#: [2610.26945] Table 7 (Intel Arc B60, 512 x 512): ``(data, k) -> (s for ~DGEMM, 99.9% CR, 100% CR)``, None = not reached at s <= 24.
PAPER_TABLE7 = {
    ("uniform", 256): (14, 15, 15),
    ("uniform", 4096): (14, 16, 16),
    ("phi0.5", 256): (15, 18, 19),
    ("phi0.5", 4096): (15, 19, 20),
    ("phi1", 256): (15, 18, 20),
    ("phi1", 4096): (15, 19, 21),
    ("phi2", 256): (17, 19, 21),
    ("phi2", 4096): (17, 20, 22),
    ("phi4", 256): (21, 22, 24),
    ("phi4", 4096): (21, 23, None),
    ("sincos", 256): (14, 18, 19),
    ("sincos", 4096): (14, 19, 20),
}

#: Widths above this need the extended-width path in [2610.26945] (int64 residue path: t <= 62).
EXTENDED_WIDTH = 62

_CHUNK = 18  # bits per slice: k * 2**36 < 2**53 keeps every slice GEMM exact for k < 2**17


def gemm_dataset(name: str, m: int = 512, k: int = 4096, n: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(A, B)`` of the named [2610.26945] data set, ``A`` m x k and ``B`` k x n.

    ``uniform``: U[-1, 1). ``phiX``: ``(U(0,1) - 1/2) exp(X N(0,1))``.
    ``sincos``: ``A = sin(i * j)``, ``B = cos(i * j)`` on index grids.
    ``spike``: U[-1, 1) with one entry per row of ``A`` ``2**40`` times larger.
    ``cancel``: ``A = [X X]``, ``B = [Y; -Y + 2**-30 Z]``.
    ``boundary``: all entries ``1 - 2**-53`` (the CRT range limit).

    Examples
    --------
    >>> A, B = gemm_dataset("uniform", 4, 8, 3)
    >>> A.shape, B.shape
    ((4, 8), (8, 3))
    """
    r = np.random.default_rng(seed)
    if name == "uniform":
        return r.uniform(-1, 1, (m, k)), r.uniform(-1, 1, (k, n))
    if name.startswith("phi"):
        p = float(name[3:])
        f = lambda s: (r.uniform(0, 1, s) - 0.5) * np.exp(p * r.standard_normal(s))  # noqa: E731
        return f((m, k)), f((k, n))
    if name == "sincos":
        i = np.arange(m)[:, None] + 1.0
        j = np.arange(k)[None, :] + 1.0
        return np.sin(i * j / k), np.cos((np.arange(k)[:, None] + 1.0) * (np.arange(n)[None, :] + 1.0) / k)
    if name == "spike":
        A = r.uniform(-1, 1, (m, k))
        A[np.arange(m), r.integers(0, k, m)] *= 2.0**40
        return A, r.uniform(-1, 1, (k, n))
    if name == "cancel":
        h = k // 2
        X, Y, Z = r.uniform(-1, 1, (m, h)), r.uniform(-1, 1, (h, n)), r.uniform(-1, 1, (h, n))
        return np.hstack([X, X]), np.vstack([Y, -Y + 2.0**-30 * Z])
    if name == "boundary":
        x = 1.0 - 2.0**-53
        return np.full((m, k), x), np.full((k, n), x)
    raise ValueError(f"unknown data set {name!r}; one of {GEMM_DATASETS}")


def zgemm_dataset(name: str, m: int = 512, k: int = 4096, n: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Complex ``(A, B)`` built from the real data set ``name``: real parts with ``seed``, imaginary parts with ``seed + 1``.

    The deterministic sets take other imaginary parts: ``sincos`` uses
    ``A = sin + i cos`` and ``B = cos + i sin`` (same index grids);
    ``boundary`` has every real and imaginary part ``1 - 2**-53`` (so the
    real part of the product cancels to exactly 0, the imaginary part is at
    the range limit of the 3M sums).

    Examples
    --------
    >>> A, B = zgemm_dataset("phi2", 2, 8, 3)
    >>> A.dtype, A.shape, B.shape, bool(np.all(A.imag != 0))
    (dtype('complex128'), (2, 8), (8, 3), True)
    """
    Ar, Br = gemm_dataset(name, m, k, n, seed)
    if name == "sincos":
        Ai = np.cos((np.arange(m)[:, None] + 1.0) * (np.arange(k)[None, :] + 1.0) / k)
        Bi = np.sin((np.arange(k)[:, None] + 1.0) * (np.arange(n)[None, :] + 1.0) / k)
    else:
        Ai, Bi = gemm_dataset(name, m, k, n, seed + 1)
    return Ar + 1j * Ai, Br + 1j * Bi


def _slices(x: np.ndarray, axis: int) -> tuple[list[np.ndarray], np.ndarray]:
    """``x = sum_c S_c * 2**(18 c) * 2**f`` with integer-valued float64 slices ``|S_c| < 2**18``; ``f`` per group.

    Groups are rows (``axis=1``) or columns (``axis=0``); ``f`` is the lowest
    set bit over the group's nonzero entries, so every slice is exact.
    """
    m, q = float_parts(x)
    am = np.abs(m)
    nz = am != 0
    low = np.where(nz, am & -am, 1)
    lsb = np.where(nz, q + np.frexp(low.astype(np.float64))[1] - 1, np.iinfo(np.int64).max // 4)
    f = lsb.min(axis=axis, keepdims=True)
    f = np.where(f > 1 << 40, 0, f)
    sh = np.where(nz, q - f, 0)  # x = m * 2**sh * 2**f, sh >= 0
    top = int((sh + 53).max()) if x.size else 0
    if top > 960:
        raise ValueError(f"exact_gemm: a row / column spans {top} bits; at most 960 are supported")
    sign = np.sign(m).astype(np.float64)
    out = []
    for c in range(-(-top // _CHUNK)):
        v = np.floor(np.ldexp(am.astype(np.float64), (sh - _CHUNK * c).astype(np.int32)))
        out.append(sign * np.fmod(v, 2.0**_CHUNK))
    return out, f


def exact_gemm(A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The exact ``A @ B`` as ``(S, e)``: an object array of Python ints and int64 exponents, value ``S * 2**e``.

    Each operand is cut into 18-bit integer slices per row / column; every
    slice product is an exact float64 GEMM (``k < 2**17``), and the slices are
    combined in Python ints. Independent of the residue code.

    Examples
    --------
    >>> S, e = exact_gemm(np.array([[0.5, 3.0]]), np.array([[2.0], [0.25]]))
    >>> float(S[0, 0]) * 2.0 ** int(e[0, 0])
    1.75
    """
    k = A.shape[1]
    if k >= 1 << 17:
        raise ValueError("exact_gemm: k must be below 2**17")
    sa, fa = _slices(A, 1)
    sb, fb = _slices(B, 0)
    levels: dict[int, np.ndarray] = {}
    for c, Sa in enumerate(sa):
        for d, Sb in enumerate(sb):
            P = (Sa @ Sb).astype(np.int64)  # exact: |P| <= k * 2**36 < 2**53
            levels[c + d] = levels.get(c + d, 0) + P
    S = np.zeros((A.shape[0], B.shape[1]), dtype=object)
    for lvl, P in levels.items():
        S = S + (P.astype(object) * (1 << (_CHUNK * lvl)))
    return S, fa + fb


def gemm_metrics(C: np.ndarray, S: np.ndarray, e: np.ndarray, absA_absB: np.ndarray) -> dict:
    """Max ulp error, correctly-rounded %, max componentwise ``|e|/(|A||B|)`` and normwise ``||e||_F/||C||_F``.

    Exact per entry (Python ints, one rounding of each error); slow on large
    outputs, where :meth:`ExactReference.metrics` gives the same CR count.

    Examples
    --------
    >>> A, B = np.array([[1.0, 2.0**-60]]), np.array([[1.0], [1.0]])
    >>> S, e = exact_gemm(A, B)
    >>> m = gemm_metrics(A @ B, S, e, np.abs(A) @ np.abs(B))
    >>> m["cr_percent"], m["max_ulp"] == 2.0**-60 / 2.0**-52
    (100.0, True)
    """
    eb = np.broadcast_to(e, S.shape)
    ref = np.empty(S.shape)
    ulps = np.empty(S.shape)
    err = np.empty(S.shape)
    for idx in np.ndindex(S.shape):
        s, ex = int(S[idx]), int(eb[idx])
        r = round_scaled_int(s, ex)
        ref[idx] = r
        c = float(C[idx])
        if not math.isfinite(c):
            ulps[idx] = err[idx] = math.inf
            continue
        # exact difference c - S 2**ex, as an int times 2**lo
        mc, qc = float_parts(np.array(c))
        lo = min(int(qc), ex)
        diff = (int(mc) << (int(qc) - lo)) - (s << (ex - lo))
        err[idx] = abs(round_scaled_int(diff, lo))
        ulp = math.ulp(r) if r != 0 else 2.0**-1074
        ulps[idx] = err[idx] / ulp
    with np.errstate(invalid="ignore", divide="ignore"):
        comp = np.where(absA_absB > 0, err / absA_absB, err)
    nref = float(np.linalg.norm(ref))
    return {
        "max_ulp": float(ulps.max()),
        "cr_percent": 100.0 * float((C == ref).mean()),
        "componentwise": float(comp.max()),
        "normwise": float(np.linalg.norm(err)) / nref if nref > 0 else float(np.linalg.norm(err)),
    }


def _float_int_parts(x: float) -> tuple[int, int]:
    """``x == m * 2**q`` with Python ints (``x`` finite)."""
    f, q = math.frexp(x)
    return int(f * (1 << 53)), q - 53


def _exact_abs_error(c: float, s: int, ex: int) -> float:
    """``|c - s * 2**ex|`` rounded once (inf for non-finite ``c``)."""
    if not math.isfinite(c):
        return math.inf
    mc, qc = _float_int_parts(c)
    lo = min(qc, ex)
    return abs(round_scaled_int((mc << (qc - lo)) - (s << (ex - lo)), lo))


class ExactReference:
    """The exact product ``S * 2**e`` of one real GEMM with its correctly rounded value and residual, for fast metrics.

    ``rounded`` is the correctly rounded float64 of every entry and
    ``residual`` the exact ``S 2**e - rounded``, rounded once; both are
    computed once (Python ints), after which :meth:`metrics` of a result
    ``C`` is vectorized: where ``C`` and ``rounded`` have the same sign and
    lie within a factor 2 of each other ``C - rounded`` is exact (Sterbenz)
    and the error is ``|(C - rounded) - residual|`` -- exactly the rounded
    error where ``C == rounded``, within a relative ``2**-52`` of it
    elsewhere; all other entries (and zeros) take the exact Python-int path of
    :func:`gemm_metrics`. The correctly-rounded count is exact.

    Parameters
    ----------
    S, e : as returned by :func:`exact_gemm` (``e`` broadcasts to ``S``)
    abs_product : ndarray
        ``|A| @ |B|`` (float64), the scale of the componentwise error.

    Examples
    --------
    >>> A, B = np.array([[1.0, 2.0**-60]]), np.array([[1.0], [1.0]])
    >>> ref = ExactReference.of(A, B)
    >>> float(ref.rounded[0, 0]), float(ref.residual[0, 0]) == 2.0**-60
    (1.0, True)
    >>> ref.metrics(A @ B)["cr_percent"], ref.metrics(np.array([[1.0 + 2.0**-52]]))["max_ulp"]
    (100.0, 0.99609375)
    """

    def __init__(self, S: np.ndarray, e: np.ndarray, abs_product: np.ndarray):
        self.S = np.asarray(S, dtype=object)
        self.e = np.broadcast_to(np.asarray(e, dtype=np.int64), self.S.shape)
        self.abs_product = np.asarray(abs_product, dtype=np.float64)
        self.rounded = np.empty(self.S.shape)
        self.residual = np.empty(self.S.shape)
        for idx in np.ndindex(self.S.shape):
            w, ex = int(self.S[idx]), int(self.e[idx])
            r = round_scaled_int(w, ex)
            self.rounded[idx] = r
            if not math.isfinite(r):
                self.residual[idx] = math.nan
                continue
            mr, qr = _float_int_parts(r)
            lo = min(qr, ex)
            self.residual[idx] = round_scaled_int((w << (ex - lo)) - (mr << (qr - lo)), lo)

    @classmethod
    def of(cls, A: np.ndarray, B: np.ndarray) -> "ExactReference":
        """The reference of the real product ``A @ B`` (:func:`exact_gemm`, ``|A| @ |B|``)."""
        S, e = exact_gemm(A, B)
        return cls(S, e, np.abs(A) @ np.abs(B))

    def errors(self, C: np.ndarray) -> np.ndarray:
        """``|C - exact|`` per entry, float64 (inf where ``C`` is not finite)."""
        C = np.asarray(C, dtype=np.float64)
        ref = self.rounded
        with np.errstate(all="ignore"):
            fast = np.isfinite(C) & (C * ref > 0) & (np.abs(C) <= 2 * np.abs(ref)) & (np.abs(ref) <= 2 * np.abs(C))
            err = np.abs((C - ref) - self.residual)
        for idx in zip(*np.nonzero(~fast)):
            err[idx] = _exact_abs_error(float(C[idx]), int(self.S[idx]), int(self.e[idx]))
        return err

    def _parts(self, C: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        err = self.errors(C)
        ulp = np.where(self.rounded != 0, np.spacing(np.abs(self.rounded)), 2.0**-1074)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            comp = np.where(self.abs_product > 0, err / self.abs_product, err)
            ulps = err / ulp  # inf for a nonzero result where the exact value is 0 and the error is above 2**-50
        return err, ulps, comp

    def metrics(self, C: np.ndarray) -> dict:
        """``{'max_ulp', 'cr_percent', 'componentwise', 'normwise'}`` of ``C`` (as :func:`gemm_metrics`)."""
        err, ulps, comp = self._parts(C)
        return _summary([err], [ulps], [comp], [np.asarray(C) == self.rounded], [self.rounded])


def _summary(errs, ulps, comps, crs, refs) -> dict:
    nref = math.sqrt(sum(float(np.linalg.norm(r)) ** 2 for r in refs))
    nerr = math.sqrt(sum(float(np.linalg.norm(e)) ** 2 for e in errs))
    size = sum(c.size for c in crs)
    return {
        "max_ulp": max((float(u.max()) for u in ulps if u.size), default=0.0),
        "cr_percent": 100.0 * sum(int(c.sum()) for c in crs) / size if size else 100.0,
        "componentwise": max((float(c.max()) for c in comps if c.size), default=0.0),
        "normwise": nerr / nref if nref > 0 else nerr,
    }


def _shift_sum(S1, e1, S2, e2, sign: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact ``S1 2**e1 + sign * S2 2**e2`` as ``(S, e)`` (object ints, aligned to the smaller exponent)."""
    e1, e2 = np.broadcast_arrays(np.asarray(e1, dtype=np.int64), np.asarray(e2, dtype=np.int64))
    lo = np.minimum(e1, e2)
    a = S1 * np.left_shift(1, (e1 - lo).astype(object))
    b = S2 * np.left_shift(1, (e2 - lo).astype(object))
    return (a + b if sign > 0 else a - b), lo


def exact_zgemm(A: np.ndarray, B: np.ndarray) -> tuple[ExactReference, ExactReference]:
    """Exact references of the real and imaginary parts of the complex ``A @ B`` from four real :func:`exact_gemm`.

    ``Re = Ar Br - Ai Bi`` and ``Im = Ar Bi + Ai Br`` are combined in Python
    ints (independent of the 3M form and of the residue code); the
    componentwise scales are ``|Ar||Br| + |Ai||Bi|`` and ``|Ar||Bi| + |Ai||Br|``.

    Examples
    --------
    >>> re, im = exact_zgemm(np.array([[1 + 2j]]), np.array([[3 - 1j]]))
    >>> float(re.rounded[0, 0]), float(im.rounded[0, 0])
    (5.0, 5.0)
    """
    Ar, Ai, Br, Bi = A.real, A.imag, B.real, B.imag
    rr, ii, ri, ir = exact_gemm(Ar, Br), exact_gemm(Ai, Bi), exact_gemm(Ar, Bi), exact_gemm(Ai, Br)
    aAr, aAi, aBr, aBi = np.abs(Ar), np.abs(Ai), np.abs(Br), np.abs(Bi)
    re = ExactReference(*_shift_sum(*rr, *ii, -1), aAr @ aBr + aAi @ aBi)
    im = ExactReference(*_shift_sum(*ri, *ir, +1), aAr @ aBi + aAi @ aBr)
    return re, im


def _zmetrics(C: np.ndarray, re: ExactReference, im: ExactReference) -> dict:
    """Metrics of a complex result over both parts: CR % counts real and imaginary parts separately."""
    C = np.asarray(C)
    er, ur, cr = re._parts(C.real)
    ei, ui, ci = im._parts(C.imag)
    return _summary(
        [er, ei], [ur, ui], [cr, ci], [C.real == re.rounded, C.imag == im.rounded], [re.rounded, im.rounded]
    )


def _label(moduli) -> str:
    return "default" if moduli in (None, "default") else str(moduli)


def gemm_accuracy(
    datasets: Sequence[str] = ("uniform", "phi2", "sincos"),
    moduli: Sequence = (12, 14, 16, 18, 20, 24),
    m: int = 512,
    k: int = 4096,
    n: int = 512,
    seed: int = 0,
    include_numpy: bool = True,
    progress: Optional[Callable[[dict], None]] = None,
    complex: bool = False,
    step: Optional[Callable[[dict], None]] = None,
) -> list[dict]:
    """[2610.26945] Table 6 / 8 rows: for each data set, numpy matmul and :func:`dgemm` (or :func:`zgemm`) at each ``moduli``.

    Returns a list of dicts ``{'data', 'method', 'moduli', 's', 't',
    'max_ulp', 'cr_percent', 'componentwise', 'normwise'}``: ``moduli`` is
    the requested value (an int, ``'auto'`` or ``'default'`` for None),
    ``s`` the number of moduli the call used (:func:`rnstensor.gemm.gemm_moduli`)
    and ``t`` its width (None for numpy). ``complex=True`` runs
    :func:`zgemm` on :func:`zgemm_dataset` data against :func:`exact_zgemm`
    (errors over real and imaginary parts). ``progress`` is called with each
    row, ``step`` with ``{'data', 'stage': 'reference'}`` before each data
    set's exact product (Python ints: the slow part of a short sweep).
    Errors come from :class:`ExactReference` (exact CR counts).

    Examples
    --------
    >>> rows = gemm_accuracy(["uniform"], [16], m=3, k=64, n=2, include_numpy=False)
    >>> rows[0]["method"], rows[0]["cr_percent"]
    ('dgemm', 100.0)
    >>> rows = gemm_accuracy(["spike"], ["auto"], m=2, k=32, n=2, include_numpy=False, complex=True)
    >>> rows[0]["method"], rows[0]["s"] > 16, rows[0]["cr_percent"]
    ('zgemm', True, 100.0)
    """
    rows = []
    kind = "complex" if complex else "real"
    gemm = zgemm if complex else dgemm
    for name in datasets:
        if step is not None:
            step({"data": name, "stage": "reference"})
        if complex:
            A, B = zgemm_dataset(name, m, k, n, seed)
            re, im = exact_zgemm(A, B)
            measure = lambda C: _zmetrics(C, re, im)  # noqa: E731
        else:
            A, B = gemm_dataset(name, m, k, n, seed)
            measure = ExactReference.of(A, B).metrics
        runs: list = [("numpy", None)] if include_numpy else []
        runs += [(gemm.__name__, s) for s in moduli]
        for method, mod in runs:
            row = {"data": name, "method": method, "moduli": None, "s": None, "t": None}
            if method == "numpy":
                C = A @ B
            else:
                mod = None if mod == "default" else mod
                C = gemm(A, B, moduli=mod, min_bits=0)  # the sweep reports every s, however few bits
                s = gemm_moduli(A, B, mod)
                row.update(moduli=_label(mod), s=s, t=gemm_width(s, k, kind))
            row.update(measure(C))
            rows.append(row)
            if progress is not None:
                progress(row)
    return rows


#: The accuracy levels of :func:`gemm_thresholds` ([2610.26945] Table 7 and one machine-independent level).
CRITERIA = {
    "float64": "max componentwise error <= that of numpy float64 matmul on the same data",
    "unit": "max componentwise error <= u = 2**-53",
    "cr99.9": ">= 99.9 % of the entries correctly rounded",
    "cr100": "100 % of the entries correctly rounded",
}


def _meets(crit: str, met: dict, numpy_comp: float) -> bool:
    if crit == "float64":
        return met["componentwise"] <= numpy_comp
    if crit == "unit":
        return met["componentwise"] <= 2.0**-53
    if crit == "cr99.9":
        return met["cr_percent"] >= 99.9
    return met["cr_percent"] == 100.0


def gemm_thresholds(
    datasets: Sequence[str] = TABLE7_DATASETS,
    ks: Sequence[int] = (256, 4096),
    m: int = 512,
    n: int = 512,
    seed: int = 0,
    s_min: int = 10,
    s_max: int = 49,
    progress: Optional[Callable[[dict], None]] = None,
    step: Optional[Callable[[dict], None]] = None,
) -> list[dict]:
    """[2610.26945] Table 7: the smallest ``s`` at which :func:`dgemm` reaches each accuracy level of :data:`CRITERIA`.

    For every data set and ``k``, ``dgemm(A, B, moduli=s)`` is measured
    against the exact product for ``s = s_min, s_min + 1, ...`` until every
    level is reached, until ``s`` reaches the ``'auto'`` choice (from there
    on the encoding is exact and the result correctly rounded, the same bits
    for every larger ``s``) or ``s_max``. A level's threshold is the first
    ``s`` of the scan that meets it; ``<key>_noext`` is the first one with
    width ``t <= EXTENDED_WIDTH`` (62, [2610.26945]'s int64 path), None if
    none does. ``float64`` compares with numpy's float64 matmul on the same
    data (measured in the same call). ``progress`` is called with each row
    when it is complete, ``step`` with each scanned ``{'data', 'k', 's',
    't', ...metrics}`` (the scan of one row can take dozens of products).

    Returns
    -------
    list of dict
        Per data set and ``k``: ``data, k, m, n, numpy`` (numpy's metrics),
        ``auto`` (the ``s`` of ``moduli='auto'``), ``default`` (of
        ``moduli=None``), and for each level ``key``: ``key`` (s or None),
        ``key_t`` (its width), ``key_noext``; ``paper`` ([2610.26945]'s
        ``(float64, 99.9 %, 100 %)`` thresholds or None) and ``scan`` (a
        list of ``{'s', 't', ...metrics}``).

    Examples
    --------
    >>> r = gemm_thresholds(["uniform"], [64], m=4, n=4, s_min=12)[0]
    >>> r["cr100"], r["cr100_t"], r["cr100_noext"], r["auto"]
    (15, 55, 15, 15)
    """
    if not 2 <= s_min <= s_max <= 49:
        raise ValueError(f"gemm_thresholds: need 2 <= s_min <= s_max <= 49; got s_min={s_min}, s_max={s_max}")
    rows = []
    for name in datasets:
        for k in ks:
            A, B = gemm_dataset(name, m, k, n, seed)
            ref = ExactReference.of(A, B)
            npm = ref.metrics(A @ B)
            row: dict = {"data": name, "k": int(k), "m": m, "n": n, "numpy": npm}
            row["auto"] = gemm_moduli(A, B, "auto")
            row["default"] = gemm_moduli(A, B)
            for crit in CRITERIA:
                row[crit] = row[crit + "_t"] = row[crit + "_noext"] = None
            scan = []
            for s in range(s_min, s_max + 1):
                t = gemm_width(s, k)
                if t < 1:
                    continue
                met = ref.metrics(dgemm(A, B, moduli=s, min_bits=0))
                scan.append(dict(s=s, t=t, **met))
                if step is not None:
                    step(dict(data=name, k=int(k), **scan[-1]))
                for crit in CRITERIA:
                    if not _meets(crit, met, npm["componentwise"]):
                        continue
                    if row[crit] is None:
                        row[crit], row[crit + "_t"] = s, t
                    if row[crit + "_noext"] is None and t <= EXTENDED_WIDTH:
                        row[crit + "_noext"] = s
                if all(row[c] is not None for c in CRITERIA) or s >= row["auto"]:
                    break
            row["scan"] = scan
            row["paper"] = PAPER_TABLE7.get((name, int(k)))
            rows.append(row)
            if progress is not None:
                progress(row)
    return rows
