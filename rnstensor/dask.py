"""Dask: element batches through plans / expressions / FEM operators, and DGEMM tiles reduced in residues."""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from .backends import get_backend
from .basis import Basis
from .chain import ChainPlan
from .contract import ContractExpression
from .gemm import _check_moduli, _check_scalar, _check_trans, _decode_scaled, blas_operands, gemm_width, moduli_for_bits
from .gemm import matmul as _matmul_in_memory
from .tensor import RNSTensor, Scale

__all__ = ["apply", "dgemm", "zgemm", "matmul"]


def _dask_array():
    try:
        import dask.array as da
    except ImportError as exc:  # pragma: no cover - the 'dask' extra
        raise ImportError("rnstensor.dask needs Dask: pip install 'rnstensor[dask]'") from exc
    return da


def _check_batch_chunks(X, what: str) -> None:
    bad = [a for a in range(1, X.ndim) if len(X.chunks[a]) > 1]
    if bad:
        fix = ", ".join(f"{a}: -1" for a in bad)
        raise ValueError(
            f"{what}: X is chunked along axes {bad}; chunk it along the element (batch) axis 0 only: "
            f"X.rechunk({{{fix}}})"
        )


def _blockwise_function(f, X) -> tuple[Callable, tuple]:
    """A function of one block, prepared on the client (operators encoded once), and one element's output shape."""
    probe = np.ones((1,) + X.shape[1:], dtype=X.dtype)
    if isinstance(f, ChainPlan):
        out = f(probe)
        return (lambda blk: f(blk)), out.shape[1:]
    if isinstance(f, ContractExpression):
        if f.num_args != 1:
            raise ValueError(f"apply: the expression takes {f.num_args} operands; it must take exactly one (the batch)")
        sizes = sorted({c for c in X.chunks[0]})
        # one expression per distinct chunk length, all sharing the constants' residues (encoded here, once)
        exprs = {n: f.with_shapes((n,) + X.shape[1:]) for n in sizes}
        for n, e in exprs.items():
            e(np.ones((n,) + X.shape[1:], dtype=X.dtype))
        out = exprs[sizes[0]](np.ones((sizes[0],) + X.shape[1:], dtype=X.dtype))
        return (lambda blk: exprs[blk.shape[0]](blk)), np.shape(out)[1:]
    if hasattr(f, "elements") and hasattr(f, "nelem"):
        # a FEM operator: its geometric data is per element, so each block takes its own slice
        if X.shape[0] != f.nelem:
            raise ValueError(f"apply: X has {X.shape[0]} elements but the operator's geometric data has {f.nelem}")
        out = np.asarray(f.elements(0, 1).apply(probe))
        return "elements", out.shape[1:]
    if callable(f):
        out = np.asarray(f(probe))
        return f, out.shape[1:]
    raise TypeError(f"apply: f must be a ChainPlan, a ContractExpression or a callable on batches; got {type(f).__name__}")


def apply(f: Any, X, *, dtype: Optional[np.dtype] = None):
    """Apply ``f`` to a Dask array of elements chunked along axis 0, block by block.

    ``f`` is a :class:`~rnstensor.ChainPlan`, a one-operand
    :class:`~rnstensor.ContractExpression`, a FEM operator
    (:class:`rnstensor.fem.MassOperator` / ``PoissonOperator``: each block
    runs on its own elements' geometric data, ``f.elements(lo, hi)``), or any
    function of a batch (``(nb, ...) -> (nb, ...)``). Operators
    are encoded once on the client and travel with the task graph; each
    element's result depends only on that element, so any chunking gives the
    in-memory result bit for bit.

    Parameters
    ----------
    f : ChainPlan, ContractExpression or callable
    X : dask.array.Array
        Elements along axis 0; one chunk along every other axis.
    dtype : numpy dtype, optional
        The result dtype (default: what ``f`` returns on one element).

    Returns
    -------
    dask.array.Array

    Examples
    --------
    >>> import numpy as np, dask.array as da, rnstensor as rt, rnstensor.dask as rd
    >>> A = np.array([[1.0, 2.0], [3.0, 4.0]])
    >>> plan = rt.plan_chain([A, A], [0, 1], ndim=2)
    >>> X = da.from_array(np.ones((5, 2, 2)), chunks=(2, 2, 2))
    >>> rd.apply(plan, X).compute()[0]
    array([[ 9., 21.],
           [21., 49.]])
    """
    da = _dask_array()
    if not isinstance(X, da.Array):
        raise TypeError(f"apply: X must be a dask.array.Array; got {type(X).__name__} (use f(X) for in-memory arrays)")
    if X.ndim < 1:
        raise ValueError("apply: X needs an element axis 0")
    _check_batch_chunks(X, "apply")
    fn, tail = _blockwise_function(f, X)
    probe_dtype = np.complex128 if np.iscomplexobj(np.empty(0, X.dtype)) else np.float64
    dtype = np.dtype(dtype or probe_dtype)
    chunks = (X.chunks[0],) + tuple((n,) for n in tail)
    drop_axis = list(range(1, X.ndim)) if len(tail) != X.ndim - 1 else []
    new_axis = list(range(1, 1 + len(tail))) if drop_axis else []
    if fn == "elements":
        def block(blk, block_info=None):
            lo, hi = block_info[0]["array-location"][0]
            return np.asarray(f.elements(lo, hi).apply(blk), dtype=dtype).reshape((blk.shape[0],) + tail)
    else:
        def block(blk):
            return np.asarray(fn(blk), dtype=dtype).reshape((blk.shape[0],) + tail)
    return X.map_blocks(block, dtype=dtype, chunks=chunks, drop_axis=drop_axis or None, new_axis=new_axis or None)


# ----- GEMM ---------------------------------------------------------------------------------------

_NONE = np.iinfo(np.int64).min // 4
_HUGE = np.iinfo(np.int64).max // 4


def _entry_stats(x: np.ndarray) -> np.ndarray:
    """Per entry ``(finite, frexp exponent or NONE, lowest set bit or HUGE)`` (complex: both parts) as int64 planes."""
    parts = [x.real, x.imag] if np.iscomplexobj(x) else [x]
    fin = np.ones(x.shape, bool)
    E = np.full(x.shape, _NONE, np.int64)
    lsb = np.full(x.shape, _HUGE, np.int64)
    for p in parts:
        p = np.asarray(p, dtype=np.float64)
        fin &= np.isfinite(p)
        ok = np.isfinite(p) & (p != 0)
        q = np.where(ok, p, 1.0)
        mant, ex = np.frexp(q)
        m = (mant * 2.0**53).astype(np.int64)
        low = np.abs(m) & -np.abs(m)
        tz = np.frexp(low.astype(np.float64))[1].astype(np.int64) - 1
        E = np.where(ok, np.maximum(E, ex.astype(np.int64)), E)
        lsb = np.where(ok, np.minimum(lsb, ex.astype(np.int64) - 53 + tz), lsb)
    return np.stack([fin.astype(np.int64), E, lsb])


def _group_stats(da, x, axis: int, need_lsb: bool):
    """``(finite, Emax, lsb_min)`` per row (``axis=1``) or column (``axis=0``) of a Dask matrix, as small Dask vectors.

    ``Emax`` is the frexp exponent of the largest finite magnitude (``NONE`` for
    all-zero groups): one reduction of ``|x|``, since frexp is monotone. The
    lowest set bits (``moduli='auto'`` only; else ``None``) need every entry's
    significand.
    """
    mag = abs(x) if x.dtype != np.complex128 else da.maximum(abs(x.real), abs(x.imag))
    finite = da.isfinite(x)
    amax = da.where(finite, mag, 0.0).max(axis=axis)
    fin = finite.all(axis=axis)
    Emax = amax.map_blocks(lambda a: np.where(a > 0, np.frexp(a)[1].astype(np.int64), _NONE), dtype=np.int64)
    if not need_lsb:
        return fin, Emax, None
    lsb = x.map_blocks(lambda b: _entry_stats(b)[2], dtype=np.int64).min(axis=axis)
    return fin, Emax, lsb


def _encoder(cplx: bool, s: int, t: int, axis: int, backend):
    """Encode one block of ``op(a)`` (``axis=0``: exponents per row) or ``op(b)`` (``axis=1``: per column).

    Returns planes ``(P, L, r, c)``: ``P = 1`` real; ``P = 3`` complex (real
    part, imaginary part and their residue sum, the 3M operands). Non-finite
    rows / columns are encoded as zeros (their results come from float64).
    """
    moduli = Basis.int8(s).moduli

    def enc(x: np.ndarray, e: np.ndarray, fin: np.ndarray) -> np.ndarray:
        be = get_backend(backend)
        ex, keep = (e[:, None], fin[:, None]) if axis == 0 else (e[None, :], fin[None, :])
        x = np.where(keep, x, 0)
        parts = [x.real, x.imag] if cplx else [x]
        planes = [be.encode(np.ascontiguousarray(p, dtype=np.float64), ex, moduli, t) for p in parts]
        if cplx:
            planes.append(be.add(planes[0], planes[1], moduli))
        return np.stack(planes)

    return enc


def _leaves(x) -> list:
    """The blocks blockwise hands over for contracted indices (nested lists), in order: the k chunks."""
    if not isinstance(x, list):
        return [x]
    return [leaf for item in x for leaf in _leaves(item)]


def _tile_fn(cplx: bool, s: int, t: int, k: int, alpha, beta, backend):
    basis = Basis.int8(s)
    moduli = basis.moduli
    kind_bound = (k << (2 * t))  # |sum_k a b| <= k 2^t 2^t

    def fn(pa_blocks, pb_blocks, ea, eb, fa, fb, *rest):
        be = get_backend(backend)
        pa_blocks, pb_blocks = _leaves(pa_blocks), _leaves(pb_blocks)
        mb, nb = pa_blocks[0].shape[2], pb_blocks[0].shape[3]
        dtype = np.complex128 if cplx else np.float64
        term = np.zeros((mb, nb), dtype)
        if alpha != 0 and k > 0 and mb > 0 and nb > 0:
            acc = None
            for pa, pb in zip(pa_blocks, pb_blocks):
                # one batched residue GEMM per k chunk: the P products (1 real, 3 for the 3M form)
                ps = be.matmul(pa.transpose(1, 0, 2, 3), pb.transpose(1, 0, 2, 3), moduli).transpose(1, 0, 2, 3)
                acc = ps if acc is None else np.stack([be.add(u, v, moduli) for u, v in zip(acc, ps)])
            scale = Scale(0, 1, (-ea, -eb), None)
            if cplx:
                P0, P1, P2 = (np.ascontiguousarray(x) for x in acc)
                re = be.add(P0, P1, moduli, True)
                im = be.add(be.add(P2, P0, moduli, True), P1, moduli, True)
                R = RNSTensor(re, basis, moduli, 2 * kind_bound, scale)
                I = RNSTensor(im, basis, moduli, 6 * kind_bound, scale)
                ar, ai = alpha.real, alpha.imag
                term.real = _decode_scaled(R, ar, backend) - _decode_scaled(I, ai, backend) if ai else _decode_scaled(R, ar, backend)
                term.imag = _decode_scaled(I, ar, backend) + _decode_scaled(R, ai, backend) if ai else _decode_scaled(I, ar, backend)
            else:
                Z = RNSTensor(np.ascontiguousarray(acc[0]), basis, moduli, kind_bound, scale)
                term[...] = _decode_scaled(Z, alpha, backend)
            # rows / columns holding inf or NaN: float64 products with IEEE propagation, as in memory
            if not fa.all() or not fb.all():
                a_blocks, b_blocks = _leaves(rest[0]), _leaves(rest[1])
                Af, Bf = np.concatenate(a_blocks, axis=1), np.concatenate(b_blocks, axis=0)
                with np.errstate(invalid="ignore", over="ignore"):
                    if not fa.all():
                        term[~fa, :] = alpha * (Af[~fa] @ Bf)
                    if not fb.all():
                        term[:, ~fb] = alpha * (Af @ Bf[:, ~fb])
        if beta != 0:
            with np.errstate(invalid="ignore", over="ignore"):
                term = term + (rest[-1] if beta == 1 else beta * rest[-1])
        return term

    return fn


def _gemm(fn_name: str, cplx: bool, a, b, c, alpha, beta, trans_a, trans_b, moduli, backend):
    da = _dask_array()
    dtype = np.dtype(np.complex128 if cplx else np.float64)
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, da.Array):
            raise TypeError(f"rnstensor.dask.{fn_name}: {name} must be a dask.array.Array; got {type(x).__name__}")
        if x.ndim != 2:
            raise ValueError(f"rnstensor.dask.{fn_name}: {name} must be 2-D; got shape {x.shape}")
        if x.dtype != dtype:
            raise TypeError(f"rnstensor.dask.{fn_name}: {name} must be {dtype.name}; got {x.dtype}")
    ta = _check_trans(trans_a, "trans_a", ("N", "T", "C"))
    tb = _check_trans(trans_b, "trans_b", ("N", "T", "C"))
    moduli = _check_moduli(moduli, fn_name)
    alpha = _check_scalar(alpha, "alpha", fn_name, cplx)
    beta = _check_scalar(beta, "beta", fn_name, cplx)

    opa, opb = blas_operands(a, b, ta, tb, cplx, f"rnstensor.dask.{fn_name}")
    m, k = opa.shape
    n = opb.shape[1]
    if c is not None:
        if not isinstance(c, da.Array):
            c = da.from_array(np.asarray(c), chunks=(opa.chunks[0], opb.chunks[1]))
        if c.shape != (m, n):
            raise ValueError(f"rnstensor.dask.{fn_name}: c must have shape ({m}, {n}); got {c.shape}")
    elif beta != 0:
        raise ValueError(f"rnstensor.dask.{fn_name}: c is required when beta != 0 (got beta={beta!r})")
    # the k chunks of both operands must line up: take op(a)'s
    if opb.chunks[0] != opa.chunks[1]:
        opb = opb.rechunk({0: opa.chunks[1]})
    # pass 1: per row / column exponents (and the finite masks), as in memory
    auto = moduli == "auto"
    fa, Ea, la = _group_stats(da, opa, 1, auto)
    fb, Eb, lb = _group_stats(da, opb, 0, auto)
    import dask

    got = dask.compute(fa, Ea, fb, Eb, *((la, lb) if auto else ()))
    fa, Ea, fb, Eb = got[:4]
    la, lb = got[4:] if auto else (None, None)
    kind = "complex" if cplx else "real"
    if moduli is None:
        s = moduli_for_bits(k, 53, kind=kind) if k > 0 else 2
    elif moduli == "auto":
        need = 1
        for f, E, lo in ((fa, Ea, la), (fb, Eb, lb)):
            ok = f & (E != _NONE)
            if ok.any():
                need = max(need, int((E[ok] - lo[ok]).max()))
        try:
            s = moduli_for_bits(k, need, kind=kind)
        except ValueError:
            s = 49
    else:
        s = moduli
    t = gemm_width(s, k, kind) if k > 0 else 1
    if k > 0 and t < 1:
        raise ValueError(f"rnstensor.dask.{fn_name}: moduli={s} cannot hold a product of length k={k}; use more moduli")
    ea = np.where(fa & (Ea != _NONE), t - Ea, 0).astype(np.int64)
    eb = np.where(fb & (Eb != _NONE), t - Eb, 0).astype(np.int64)
    ea_d = da.from_array(ea, chunks=(opa.chunks[0],))
    eb_d = da.from_array(eb, chunks=(opb.chunks[1],))
    fa_d = da.from_array(fa, chunks=(opa.chunks[0],))
    fb_d = da.from_array(fb, chunks=(opb.chunks[1],))
    # every operand block is encoded once (op(a)'s block (i, k) serves every column tile j)
    P = 3 if cplx else 1
    L = s
    enc_a = da.blockwise(
        _encoder(cplx, s, t, 0, backend), "pLik", opa, "ik", ea_d, "i", fa_d, "i",
        new_axes={"p": P, "L": L}, dtype=np.int8, meta=np.empty((0, 0, 0, 0), np.int8),
    )
    enc_b = da.blockwise(
        _encoder(cplx, s, t, 1, backend), "pLkj", opb, "kj", eb_d, "j", fb_d, "j",
        new_axes={"p": P, "L": L}, dtype=np.int8, meta=np.empty((0, 0, 0, 0), np.int8),
    )
    fn = _tile_fn(cplx, s, t, k, alpha, beta, backend)
    args = [enc_a, "pLik", enc_b, "pLkj", ea_d, "i", eb_d, "j", fa_d, "i", fb_d, "j"]
    if not (fa.all() and fb.all()):
        args += [opa, "ik", opb, "kj"]
    if beta != 0:
        args += [c.rechunk((opa.chunks[0], opb.chunks[1])), "ij"]
    return da.blockwise(fn, "ij", *args, dtype=dtype, concatenate=False, meta=np.empty((0, 0), dtype))


def dgemm(a, b, c=None, *, alpha: float = 1.0, beta: float = 0.0, trans_a: str = "N", trans_b: str = "N",
          moduli=None, backend: Optional[str] = None):
    """:func:`rnstensor.dgemm` on Dask arrays: bitwise the in-memory result for any chunking.

    Output tiles follow ``op(a)``'s row chunks and ``op(b)``'s column chunks.
    A first pass reduces the per-row / per-column exponents (and ``moduli='auto'``'s
    width) over all chunks; then every tile encodes its ``k`` chunks with those
    exponents, sums the chunk products *in residues* (exact) and decodes once
    with ``alpha``. The exact integer product does not depend on the
    chunking, so neither does a single bit of the result, unlike a float64
    sum whose order follows the chunks.

    Examples
    --------
    >>> import numpy as np, dask.array as da, rnstensor as rt, rnstensor.dask as rd
    >>> A = np.random.default_rng(0).uniform(-1, 1, (6, 9))
    >>> D = rd.dgemm(da.from_array(A, chunks=(4, 4)), da.from_array(A.T, chunks=(4, 2)))
    >>> bool((D.compute() == rt.dgemm(A, A.T)).all())
    True
    """
    return _gemm("dgemm", False, a, b, c, alpha, beta, trans_a, trans_b, moduli, backend)


def zgemm(a, b, c=None, *, alpha: complex = 1.0, beta: complex = 0.0, trans_a: str = "N", trans_b: str = "N",
          moduli=None, backend: Optional[str] = None):
    """:func:`rnstensor.zgemm` on Dask arrays (the exact 3M form, chunk products summed in residues); see :func:`dgemm`."""
    return _gemm("zgemm", True, a, b, c, alpha, beta, trans_a, trans_b, moduli, backend)


def matmul(a, b, *, moduli=None, backend: Optional[str] = None):
    """``a @ b`` on Dask arrays with numpy's semantics: 2-D (and 1-D) by :func:`dgemm` / :func:`zgemm`.

    Operands with batch axes are multiplied block by block with
    :func:`rnstensor.matmul` on whole ``k`` panels (the contracted axis is
    rechunked to one chunk).
    """
    da = _dask_array()
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, da.Array):
            raise TypeError(f"rnstensor.dask.matmul: {name} must be a dask.array.Array; got {type(x).__name__}")
        if x.dtype not in (np.float64, np.complex128):
            raise TypeError(f"rnstensor.dask.matmul: {name} must be float64 or complex128; got {x.dtype}")
    cplx = np.complex128 in (a.dtype, b.dtype)
    if cplx:
        a, b = a.astype(np.complex128), b.astype(np.complex128)
    if a.ndim <= 2 and b.ndim <= 2:
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        res = (zgemm if cplx else dgemm)(a2, b2, moduli=moduli, backend=backend)
        if a.ndim == 1:
            res = res[0]
        if b.ndim == 1:
            res = res[..., 0]
        return res
    a = a.rechunk({a.ndim - 1: -1})
    b = b.rechunk({b.ndim - 2: -1} if b.ndim > 1 else {0: -1})
    nd = max(a.ndim, b.ndim)
    letters = "abcdefghijklmnopqrstuvwxyz"
    batch = letters[: nd - 2]
    ia = batch[nd - a.ndim :] + "yk" if a.ndim > 1 else "k"
    ib = batch[nd - b.ndim :] + "kz" if b.ndim > 1 else "k"
    out = batch + ("y" if a.ndim > 1 else "") + ("z" if b.ndim > 1 else "")
    dtype = np.complex128 if cplx else np.float64
    return da.blockwise(
        lambda x, y: _matmul_in_memory(x, y, moduli=moduli, backend=backend), out, a, ia, b, ib,
        dtype=dtype, concatenate=True,
    )
