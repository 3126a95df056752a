"""The GEMM entry points: :func:`dgemm`, :func:`zgemm`, :func:`matmul` and :func:`gemm_moduli`."""

from __future__ import annotations

import math
from typing import Optional, Union

import numpy as np

from ..arrays import (CASTINGS, array_module, exact_float, exact_result, is_device_array, refuse_rnstensor, to_host,
                      to_module)
from ..backends import dispatch
from ..basis import Basis
from ..errors import renamed
from ..planner.methods import MIN_BITS
from ..run.epilogue import gemm_epilogue
from .checks import (_check_array, _check_moduli, _check_scalar, _check_target, _check_trans, _check_workspace,
                     blas_operands)
from .stack import gemm_shared, gemm_stack
from .split import _choose, _exact_auto, _resolve_moduli, _slice_exponent, _sum_slices, row_slices
from .tiles import _exact_whole, _phase, _run_product, gemm_program
from .width import gemm_targets, gemm_width

__all__ = ["dgemm", "zgemm", "matmul", "gemm_moduli"]

Moduli = Union[None, int, str]


# ----- the driver --------------------------------------------------------------------------------


def gemm_moduli(a, b, moduli: Moduli = None, *, trans_a: str = "N", trans_b: str = "N",
                rtol: Optional[float] = None) -> int:
    """The number of moduli ``s`` that :func:`dgemm` / :func:`zgemm` use for ``op(a) @ op(b)`` with this ``moduli``.

    An integer is returned as is; ``None`` gives :func:`classical_moduli`
    (the fewest that keep the default's componentwise target, ``(1 +
    2**-5) u |A||B|``; for rows or
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
    (16, 14, 29, 9)
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
    # a target meets the epilogue's float64 roundings too: the product is held to a smaller one, or the exact
    # epilogue rounds once where the target lies within those roundings
    target, exact_epilogue = gemm_targets(moduli, rtol, alpha, beta, cplx)
    combined = False
    if alpha != 0 and k > 0 and m > 0 and n > 0:
        with _phase("other"):
            mode, s, t, ea, eb, A, Bm, fa, fb = _choose(moduli, opa, opb, k, cplx, fn, min_bits, target)
            transposed = getattr(be, "gemm_layout", "NN") == "TN"
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
            # (the exact integers on the host, as einsum's: the operands come over once, the limbs' residue GEMM
            # runs on the call's backend, the rounded result goes back)
            with _phase("products"):
                term[...] = to_module(_exact_auto(to_host(A), to_host(Bm), cplx, alpha, beta if exact_epilogue else 0,
                                                  to_host(c) if exact_epilogue and beta != 0 else None, be), xp)
            combined = exact_epilogue
        else:
            ms, ns = A.shape[0], Bm.shape[1]
            pairs = xp.zeros((ms, ns), dtype)
            _run_product(pairs, prog, A, Bm, ea, eb, ms, ns, k, s, cplx, workspace, be, xp, backend_name, transposed)
            own_a, rank_a, own_b, rank_b = slices
            with _phase("decode"):  # each pair correctly rounded, summed in float64 slice by slice
                with np.errstate(invalid="ignore", over="ignore"):
                    by_row = _sum_slices(pairs, own_a, rank_a, m)
                    term[...] = _sum_slices(by_row.T, own_b, rank_b, n).T
        term = gemm_epilogue(term, alpha, beta, c, fa, fb, xp, opa=opa, opb=opb, combined=combined,
                             exact=exact_epilogue, cplx=cplx)
    else:
        term = gemm_epilogue(term, alpha, beta, c, None, None, xp, multiplied=False, exact=exact_epilogue, cplx=cplx)
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
        ``None``: every entry within ``1.03 u`` of its exact magnitude
        product, ``|C~ - C| <= (1 + 2**-5) u |alpha| (|A||B|)_ij`` (``u = 2**-53``,
        the final rounding included; complex: of the complex magnitudes; a
        ``beta * c`` term is then added in float64, as BLAS adds it: its
        roundings come on top, ``rtol`` counts them),
        or the classical bound ``gamma_k |alpha| |A||B|`` where that is
        smaller (``gamma_k = k u / (1 - k u)``), from the fewest moduli
        whose width keeps every entry's encoding error within it
        (:func:`classical_moduli`: from the rows' and columns' binade
        spreads and lowest set bits, else from one float32 GEMM of the
        scaled magnitudes, :func:`magnitude_ratio`). Results then depend on
        the whole operands' data through the width (``'fast'`` or an
        explicit ``moduli`` keep
        rows and columns independent). Rows or
        columns spanning more binades than 49 moduli hold are split exactly
        into slices of bounded span, every pair of slices is one residue
        product, correctly rounded, and the pairs are summed in float64
        (:func:`row_slices`): those entries meet the classical bound
        (complex ``sqrt(2) gamma_{k+2}``). ``'fast'``: ``moduli_for_bits(k, 53)``, the
        53-bit width (float64-level accuracy on well-scaled data; a row mixing
        very different magnitudes loses its small entries' bits). ``'auto'``:
        the smallest ``s`` whose width ``t``
        encodes every entry of ``op(a)`` and ``op(b)`` exactly
        (:func:`exact_bits_needed`: per row / column, from the leading bit of
        the largest magnitude to the lowest set bit of the smallest nonzero
        one), so the integer product is the exact product and the result is
        correctly rounded, ``beta * c`` included. Where 49 moduli cannot hold
        that width, the exact product in integers (every row and column cut
        into 62-bit limbs, all limb pairs one residue GEMM on the call's
        backend, :func:`rnstensor.run.exact_path.exact_int_matmul`) before
        its one rounding: correctly rounded on any exponent range, subnormal
        results and overflow included (CuPy operands too: their integers are
        made on the host, as einsum's, the result goes back to the device).
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
        A target in place of the default's (with ``moduli=None``):
        every entry within ``rtol`` times its ``|alpha| (|A||B|)_ij + |beta|
        |C_ij|`` (complex: of the complex magnitudes; the float64 roundings
        of ``beta * c``, of the sum and of a complex ``alpha``'s two terms
        counted, :func:`~rnstensor.gemm.width.gemm_targets`, or the sum
        rounded once where the target lies within them), from the fewest moduli whose rigorous
        bound meets it (:func:`classical_moduli`; a loose target takes fewer
        than the default). At least ``(1 + 2**-5) 2**-53`` (a tighter one raises
        ``ValueError`` pointing to ``moduli='auto'``); where 49 moduli cannot
        meet it, the exact product as ``'auto'`` gives it (correctly rounded,
        so within any target).

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
        A target in place of the default's (with ``moduli=None``):
        every entry within ``rtol`` times its ``|alpha| (|A||B|)_ij + |beta|
        |C_ij|`` (complex: of the complex magnitudes; the float64 roundings
        of ``beta * c``, of the sum and of a complex ``alpha``'s two terms
        counted, :func:`~rnstensor.gemm.width.gemm_targets`, or the sum
        rounded once where the target lies within them), from the fewest moduli whose rigorous
        bound meets it (:func:`classical_moduli`; a loose target takes fewer
        than the default). At least ``(1 + 2**-5) 2**-53`` (a tighter one raises
        ``ValueError`` pointing to ``moduli='auto'``); where 49 moduli cannot
        meet it, the exact product as ``'auto'`` gives it (correctly rounded,
        so within any target).

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
    the device. A stack, real or complex, on the host or the device, runs
    batched: every matrix on the moduli dgemm (zgemm) chooses for it alone,
    the matrices on equal moduli as one product (the bits of dgemm or zgemm,
    matrix by matrix; a device stack reads back one number per matrix once,
    its measured ratio or width, where a loop would wait for the device on
    scalars matrix by matrix).

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
    try:
        return _matmul(a, b, out, dtype, casting, moduli, backend, workspace_bytes, min_bits, rtol)
    except (ValueError, TypeError) as exc:  # (its 2-D products are dgemm's and zgemm's: their errors name matmul)
        raise renamed(exc, "matmul", ("dgemm", "zgemm")) from None


def _matmul(a, b, out, dtype, casting, moduli, backend, workspace_bytes, min_bits, rtol):
    """:func:`matmul`'s body."""
    if isinstance(out, tuple) and len(out) == 1:
        out = out[0]
    if casting not in CASTINGS:
        raise ValueError(f"matmul: casting must be one of {CASTINGS}; got {casting!r}")
    refuse_rnstensor(a, "a", "matmul")
    refuse_rnstensor(b, "b", "matmul")
    xp = array_module(a, b, out, names=("a", "b", "out"), fn="matmul")
    a, b = (x if xp is not np else np.asarray(x) for x in (a, b))
    for name, x in (("a", a), ("b", b)):
        if x.ndim == 0:
            raise ValueError(f"matmul: {name} is 0-d; matmul needs at least 1-D operands (use * for scalars)")
    dt = _matmul_dtype(a, b, dtype)
    if dt.kind in "biu" and rtol is not None:
        raise ValueError(f"matmul: integer and bool operands give exact integer results, which no target changes; "
                         f"drop rtol (got rtol={rtol!r})")
    if dt.kind in "biu" and moduli not in (None, "auto"):
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
    count = math.prod(batch)
    alone = list(range(count))
    k = a2.shape[-1]
    if count > 1 and m and n and k:
        # a stack: each matrix on the moduli dgemm (zgemm) gives it alone, the products on equal moduli batched
        flat = res.reshape(count, m, n)
        shared = None
        one_b = math.prod(b2.shape[:-2]) == 1  # (b one matrix, broadcast along every batch axis)
        b1 = b2.reshape(b2.shape[-2:]) if one_b else None
        if one_b and rtol is None and moduli is not None:
            # every matrix shares b, and a policy whose integers are each row's and column's alone (a fixed width)
            # or whose result is unique (correctly rounded): one GEMM of the stacked rows gives each matrix's bits
            gemm(A.reshape(count * m, k), b1, moduli=moduli, out=flat.reshape(count * m, n), backend=backend,
                 workspace_bytes=workspace_bytes, min_bits=min_bits)
            shared = []
        elif one_b and rtol is None:
            shared = gemm_shared(flat, A.reshape(count, m, k), b1, backend, workspace_bytes)
        alone = shared if shared is not None else gemm_stack(
            flat, A.reshape(count, m, -1), B.reshape(count, -1, n), moduli, backend, workspace_bytes, min_bits, rtol)
    for i in alone:
        idx = np.unravel_index(i, batch) if batch else ()
        gemm(A[idx], B[idx], moduli=moduli, out=res[idx], backend=backend, workspace_bytes=workspace_bytes,
             min_bits=min_bits, rtol=rtol)
    if out is not None:
        narrower_int = dt.kind in "biu" and out.dtype.kind in "biu"
        # res is a fresh array, so out may overlap a or b
        out[...] = exact_result(res.reshape(shape), out.dtype if narrower_int else dt, "matmul",
                                "pass an out of a wider integer dtype such as int64" if narrower_int else
                                "cast the operands to a wider integer dtype such as int64")
        return out
    res = exact_result(res.reshape(shape), dt, "matmul")
    return res[()] if xp is np and res.ndim == 0 else res

