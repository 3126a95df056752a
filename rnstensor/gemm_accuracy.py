"""GEMM accuracy harness (papers/000 Tables 6-8): exact references by split float64 GEMMs, ulp / CR% / errors."""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import numpy as np

from .arith import float_parts, round_scaled_int
from .gemm import dgemm, gemm_width

__all__ = ["GEMM_DATASETS", "gemm_dataset", "exact_gemm", "gemm_metrics", "gemm_accuracy"]

#: The data sets of papers/000 Sec. 7-8.3.
GEMM_DATASETS = ("uniform", "phi0.5", "phi1", "phi2", "phi4", "sincos", "spike", "cancel", "boundary")

_CHUNK = 18  # bits per slice: k * 2**36 < 2**53 keeps every slice GEMM exact for k < 2**17


def gemm_dataset(name: str, m: int = 512, k: int = 4096, n: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(A, B)`` of the named papers/000 data set, ``A`` m x k and ``B`` k x n.

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
    """Max ulp error, correctly-rounded %, max componentwise ``|e|/(|A||B|)`` and normwise ``||e||_F/||C||_F``."""
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


def gemm_accuracy(
    datasets: Sequence[str] = ("uniform", "phi2", "sincos"),
    moduli: Sequence = (12, 14, 16, 18, 20, 24),
    m: int = 512,
    k: int = 4096,
    n: int = 512,
    seed: int = 0,
    include_numpy: bool = True,
    progress: Optional[Callable[[dict], None]] = None,
) -> list[dict]:
    """papers/000 Table 6 rows: for each data set, numpy float64 matmul and :func:`dgemm` at each ``moduli``.

    Returns a list of dicts ``{'data', 'method', 's', 't', 'max_ulp',
    'cr_percent', 'componentwise', 'normwise'}`` (``s``/``t`` None for numpy;
    ``moduli`` entries may be ``'auto'``). ``progress`` is called with each row.

    Examples
    --------
    >>> rows = gemm_accuracy(["uniform"], [16], m=3, k=64, n=2, include_numpy=False)
    >>> rows[0]["method"], rows[0]["cr_percent"]
    ('dgemm', 100.0)
    """
    rows = []
    for name in datasets:
        A, B = gemm_dataset(name, m, k, n, seed)
        S, e = exact_gemm(A, B)
        ab = np.abs(A) @ np.abs(B)
        runs: list = [("numpy", None)] if include_numpy else []
        runs += [("dgemm", s) for s in moduli]
        for method, s in runs:
            C = A @ B if method == "numpy" else dgemm(A, B, moduli=s)
            row = {"data": name, "method": method, "s": s, "t": None}
            if method == "dgemm" and isinstance(s, int):
                row["t"] = gemm_width(s, k)
            row.update(gemm_metrics(C, S, e, ab))
            rows.append(row)
            if progress is not None:
                progress(row)
    return rows
