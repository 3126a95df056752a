"""Dask: element batches through plans / expressions / FEM operators, and DGEMM tiles reduced in residues.

NumPy or CuPy chunks
--------------------
Every function here takes Dask arrays whose chunks are NumPy arrays (the CPU
backend, or whatever ``backend=`` names) or CuPy arrays (the CUDA backend).
The chunk type is read from the array's ``_meta`` (:func:`chunk_module`);
CuPy is never imported unless a chunk is a CuPy array. With CuPy chunks:

- ``backend=None`` means ``'cuda'``; any other name is refused (a CPU backend
  cannot read device memory: move the data first with
  ``X.map_blocks(cupy.asnumpy, meta=numpy.empty((0,) * X.ndim, X.dtype))``).
  ``backend='cuda'`` on a machine without CuPy or without a GPU raises the
  CUDA backend's ``RuntimeError`` when the graph is built.
- Results are Dask arrays with CuPy chunks (a CuPy ``_meta``), the same bits
  as the in-memory CPU result.
- NumPy and CuPy operands are never mixed implicitly: ``dgemm(a_cupy, b_numpy)``
  is a ``TypeError`` naming the operands; move one explicitly
  (``b.map_blocks(cupy.asarray)``). An in-memory ``c`` (not a Dask array) is
  moved to the operands' array type.
- :func:`dgemm` / :func:`zgemm` / :func:`matmul` keep every block on its
  device from encode to decode: the exponent pass reduces on the device and
  brings only the per-row / per-column exponent vectors to the client; the
  blocks are encoded to residue planes, multiplied, summed over ``k`` chunks
  and decoded by :class:`~rnstensor.backends.cuda.CudaBackend` calls on CuPy
  arrays. Two steps that are defined by NumPy's float64 arithmetic run on the
  host so that the bits stay NumPy's: rows / columns holding inf or NaN (their
  float64 fallback product) and ``beta * c`` for a complex ``beta`` with a
  nonzero imaginary part (NumPy's complex multiply).
- :func:`apply` hands CuPy blocks to a :class:`~rnstensor.ChainPlan`
  (``plan.run(block, backend='cuda')``, CuPy in, CuPy out). Contract
  expressions, FEM operators and plain functions take NumPy: their blocks make
  an explicit host round trip (``cupy.asnumpy`` → ``f`` → ``cupy.asarray``),
  the expression and the operator still running their residue work on
  ``backend``. For a function that takes CuPy itself, use ``X.map_blocks``.

One worker per GPU
------------------
A worker drives one device (the current CuPy device). With ``dask_cuda``
installed (not a dependency of rnstensor)::

    from dask_cuda import LocalCUDACluster
    from distributed import Client
    client = Client(LocalCUDACluster())        # one worker per visible GPU

Without it, start one single-threaded worker process per GPU, each seeing only
its own device, e.g. ``CUDA_VISIBLE_DEVICES=0 dask worker tcp://SCHEDULER
--nthreads 1`` and ``CUDA_VISIBLE_DEVICES=1 dask worker ...`` next to
``dask scheduler``. CuPy chunks are created on the workers (e.g.
``X.map_blocks(cupy.asarray)``); kernels compile once per process and are
cached on disk.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from .arrays import array_module, device_module as _cupy
from .backends import get_backend
from .basis import Basis
from .chain import ChainPlan
from .contract import ContractExpression
from .errors import RNSRangeError
from .gemm import _alpha_parts, _check_moduli, _check_scalar, _check_trans, blas_operands, gemm_width, moduli_for_bits
from .gemm import matmul as _matmul_in_memory

__all__ = ["apply", "dgemm", "zgemm", "matmul", "chunk_module"]


def _dask_array():
    try:
        import dask.array as da
    except ImportError as exc:  # pragma: no cover - the 'dask' extra
        raise ImportError("rnstensor.dask needs Dask: pip install 'rnstensor[dask]'") from exc
    return da


# ----- NumPy or CuPy chunks ---------------------------------------------------------------------


def chunk_module(x) -> str:
    """The top-level module of a Dask array's chunk type (from its ``_meta``), or of an array: ``'numpy'``, ``'cupy'``, ...

    Reads ``type(x._meta).__module__``; never imports CuPy.

    Examples
    --------
    >>> import numpy as np, dask.array as da
    >>> chunk_module(da.ones(3)), chunk_module(np.ones(3))
    ('numpy', 'numpy')
    """
    meta = getattr(x, "_meta", x)
    return type(meta).__module__.partition(".")[0]


def _namespace(a):
    """``numpy`` or ``cupy``: the array module of an array or of a Dask array's chunks (CuPy imported only for CuPy)."""
    return array_module(getattr(a, "_meta", a))


def _host(a) -> np.ndarray:
    """A NumPy copy of a (small) array: CuPy arrays come to the host, NumPy ones stay."""
    return a.get() if chunk_module(a) == "cupy" else np.asarray(a)


def _resolve_backend(fn: str, backend: Optional[str], arrays: dict) -> tuple[Optional[str], bool]:
    """``(backend, device)`` for Dask operands ``{name: array}``: CuPy chunks mean ``'cuda'``; mixing is refused.

    ``backend=None`` stays None (the current default) for NumPy chunks and
    becomes ``'cuda'`` for CuPy chunks. A named backend is created here, on
    the client, so ``'cuda'`` without CuPy or a GPU fails before any task runs.
    """
    kinds = {name: chunk_module(x) for name, x in arrays.items()}
    for name, kind in kinds.items():
        if kind not in ("numpy", "cupy"):
            meta = arrays[name]._meta
            raise TypeError(
                f"{fn}: {name} has chunks of type {type(meta).__module__}.{type(meta).__name__}; "
                "rnstensor takes NumPy or CuPy chunks"
            )
    if len(set(kinds.values())) > 1:
        on = ", ".join(f"{n} has {'CuPy' if k == 'cupy' else 'NumPy'} chunks" for n, k in kinds.items())
        raise TypeError(
            f"{fn}: operands on the host and on the device: {on}. Nothing is moved implicitly; move one "
            "explicitly: x.map_blocks(cupy.asarray) to the device, or "
            "x.map_blocks(cupy.asnumpy, meta=numpy.empty((0,) * x.ndim, x.dtype)) to the host"
        )
    device = "cupy" in kinds.values()
    if device and backend is None:
        backend = "cuda"
    if device and backend != "cuda":
        raise ValueError(
            f"{fn}: CuPy chunks run on backend='cuda' (or backend=None); got backend={backend!r}. "
            "To use a CPU backend, move the data to the host first: "
            "x.map_blocks(cupy.asnumpy, meta=numpy.empty((0,) * x.ndim, x.dtype))"
        )
    if backend is not None:
        get_backend(backend)  # an unknown name, or 'cuda' without CuPy / a GPU: the backend's clear error, now
    return backend, device


def _meta(X, ndim: int, dtype):
    """An empty array of ``X``'s chunk type (NumPy or CuPy) with ``ndim`` dims and ``dtype``: the ``meta=`` of a result."""
    return _namespace(X._meta).empty((0,) * ndim, dtype)


def _check_batch_chunks(X, what: str) -> None:
    bad = [a for a in range(1, X.ndim) if len(X.chunks[a]) > 1]
    if bad:
        fix = ", ".join(f"{a}: -1" for a in bad)
        raise ValueError(
            f"{what}: X is chunked along axes {bad}; chunk it along the element (batch) axis 0 only: "
            f"X.rechunk({{{fix}}})"
        )


def _blockwise_function(f, X, backend: Optional[str]) -> tuple[Any, tuple, bool]:
    """A function of one block, prepared on the client (operators encoded once), one element's output shape,
    and whether it takes device (CuPy) blocks as they are (``True``: a ChainPlan) or host blocks (``False``).

    The output shape is found on the client from a one-element NumPy probe.
    """
    probe = np.ones((1,) + X.shape[1:], dtype=X.dtype)
    if isinstance(f, ChainPlan):
        out = f(probe)
        # CuPy in, CuPy out on backend 'cuda' (the plan's fused device path); NumPy blocks as before
        return (lambda blk: f.run(blk, backend=backend)), out.shape[1:], True
    if isinstance(f, ContractExpression):
        if f.num_args != 1:
            raise ValueError(f"apply: the expression takes {f.num_args} operands; it must take exactly one (the batch)")
        sizes = sorted({c for c in X.chunks[0]})
        # one expression per distinct chunk length, all sharing the constants' residues (encoded here, once)
        exprs = {n: f.with_shapes((n,) + X.shape[1:]) for n in sizes}
        for n, e in exprs.items():
            e(np.ones((n,) + X.shape[1:], dtype=X.dtype))
        out = exprs[sizes[0]](np.ones((sizes[0],) + X.shape[1:], dtype=X.dtype))
        if backend is None:
            return (lambda blk: exprs[blk.shape[0]](blk)), np.shape(out)[1:], False
        return (lambda blk: exprs[blk.shape[0]](blk, backend=backend)), np.shape(out)[1:], False
    if hasattr(f, "elements") and hasattr(f, "nelem"):
        # a FEM operator: its geometric data is per element, so each block takes its own slice
        if X.shape[0] != f.nelem:
            raise ValueError(f"apply: X has {X.shape[0]} elements but the operator's geometric data has {f.nelem}")
        out = np.asarray(f.elements(0, 1).apply(probe))
        return "elements", out.shape[1:], False
    if callable(f):
        out = np.asarray(f(probe))
        return f, out.shape[1:], False
    raise TypeError(f"apply: f must be a ChainPlan, a ContractExpression or a callable on batches; got {type(f).__name__}")


def apply(f: Any, X, *, dtype: Optional[np.dtype] = None, backend: Optional[str] = None):
    """Apply ``f`` to a Dask array of elements chunked along axis 0, block by block.

    ``f`` is a :class:`~rnstensor.ChainPlan`, a one-operand
    :class:`~rnstensor.ContractExpression`, a FEM operator
    (:class:`rnstensor.fem.MassOperator` / ``PoissonOperator``: each block
    runs on its own elements' geometric data, ``f.elements(lo, hi)``), or any
    function of a batch (``(nb, ...) -> (nb, ...)``). Operators
    are encoded once on the client and travel with the task graph; each
    element's result depends only on that element, so any chunking gives the
    in-memory result bit for bit.

    CuPy chunks (see the module notes): a ChainPlan runs each block on the
    device, ``f.run(block, backend='cuda')``, CuPy in and out. A contract
    expression, a FEM operator or a plain function takes NumPy, so each of
    their blocks makes an explicit host round trip (``cupy.asnumpy(block)``,
    ``f``, ``cupy.asarray``); expressions and operators still do their
    residue work on ``backend`` (``'cuda'``). The result has CuPy chunks
    either way. A function that takes CuPy blocks itself belongs in
    ``X.map_blocks``.

    Parameters
    ----------
    f : ChainPlan, ContractExpression, FEM operator or callable
    X : dask.array.Array
        Elements along axis 0; one chunk along every other axis. NumPy or
        CuPy chunks.
    dtype : numpy dtype, optional
        The result dtype (default: what ``f`` returns on one element).
    backend : str, optional
        The residue backend of every block (``None``: the current default for
        NumPy chunks, ``'cuda'`` for CuPy chunks). Passed to a ChainPlan's
        ``run``, a contract expression's call and a FEM operator (a copy per
        block; ``f`` itself is not changed); a plain function gets none.

    Returns
    -------
    dask.array.Array
        Chunks of ``X``'s type (NumPy or CuPy).

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
    backend, device = _resolve_backend("apply", backend, {"X": X})
    fn, tail, takes_device = _blockwise_function(f, X, backend)
    probe_dtype = np.complex128 if np.iscomplexobj(np.empty(0, X.dtype)) else np.float64
    dtype = np.dtype(dtype or probe_dtype)
    chunks = (X.chunks[0],) + tuple((n,) for n in tail)
    drop_axis = list(range(1, X.ndim)) if len(tail) != X.ndim - 1 else []
    new_axis = list(range(1, 1 + len(tail))) if drop_axis else []
    # device chunks: blocks go to the host and back unless f takes them as they are (explicit, per block)
    to_host = device and not takes_device
    xp = _cupy() if device else np

    def back(y):
        return xp.asarray(y, dtype=dtype)

    if fn == "elements":
        def block(blk, block_info=None):
            lo, hi = block_info[0]["array-location"][0]
            op = f.elements(lo, hi)
            if backend is not None:
                op.backend = backend  # the per-block copy only
            x = _host(blk) if to_host else blk
            return back(op.apply(x)).reshape((blk.shape[0],) + tail)
    else:
        def block(blk):
            x = _host(blk) if to_host else blk
            return back(fn(x)).reshape((blk.shape[0],) + tail)
    return X.map_blocks(
        block, dtype=dtype, chunks=chunks, drop_axis=drop_axis or None, new_axis=new_axis or None,
        meta=_meta(X, 1 + len(tail), dtype),
    )


# ----- GEMM ---------------------------------------------------------------------------------------
#
# Every helper below works on NumPy or CuPy blocks alike (``xp`` is the block's array module) and
# calls the backend with them as they are: CuPy blocks never leave the device between encode and
# decode. Exponents and finite masks are per row / column vectors held on the host.

_NONE = np.iinfo(np.int64).min // 4
_HUGE = np.iinfo(np.int64).max // 4


def _entry_stats(x):
    """Per entry ``(finite, frexp exponent or NONE, lowest set bit or HUGE)`` (complex: both parts) as int64 planes."""
    xp = _namespace(x)
    parts = [x.real, x.imag] if x.dtype.kind == "c" else [x]
    fin = xp.ones(x.shape, bool)
    E = xp.full(x.shape, _NONE, np.int64)
    lsb = xp.full(x.shape, _HUGE, np.int64)
    for p in parts:
        p = p.astype(np.float64, copy=False)
        fin &= xp.isfinite(p)
        ok = xp.isfinite(p) & (p != 0)
        q = xp.where(ok, p, 1.0)
        mant, ex = xp.frexp(q)
        ex = ex.astype(np.int64)
        m = (mant * 2.0**53).astype(np.int64)
        low = xp.abs(m) & -xp.abs(m)
        tz = xp.frexp(low.astype(np.float64))[1].astype(np.int64) - 1
        E = xp.where(ok, xp.maximum(E, ex), E)
        lsb = xp.where(ok, xp.minimum(lsb, ex - 53 + tz), lsb)
    return xp.stack([fin.astype(np.int64), E, lsb])


def _frexp_exponent(a):
    """The frexp exponent of every positive entry, ``NONE`` for zeros (int64)."""
    xp = _namespace(a)
    return xp.where(a > 0, xp.frexp(a)[1].astype(np.int64), _NONE)


def _group_stats(da, x, axis: int, need_lsb: bool):
    """``(finite, Emax, lsb_min)`` per row (``axis=1``) or column (``axis=0``) of a Dask matrix, as small Dask vectors.

    ``Emax`` is the frexp exponent of the largest finite magnitude (``NONE`` for
    all-zero groups): one reduction of ``|x|``, since frexp is monotone. The
    lowest set bits (``moduli='auto'`` only; else ``None``) need every entry's
    significand. The vectors have ``x``'s chunk type (reduced on the device for CuPy).
    """
    mag = abs(x) if x.dtype != np.complex128 else da.maximum(abs(x.real), abs(x.imag))
    finite = da.isfinite(x)
    amax = da.where(finite, mag, 0.0).max(axis=axis)
    fin = finite.all(axis=axis)
    Emax = amax.map_blocks(_frexp_exponent, dtype=np.int64, meta=_meta(x, 1, np.int64))
    if not need_lsb:
        return fin, Emax, None
    lsb = x.map_blocks(lambda b: _entry_stats(b)[2], dtype=np.int64, meta=_meta(x, 2, np.int64)).min(axis=axis)
    return fin, Emax, lsb


def _block_stats(x, axis: int, need_lsb: bool):
    """:func:`_group_stats` of one in-memory (NumPy or CuPy) matrix with ``x.size > 0``, as host vectors."""
    xp = _namespace(x)
    mag = xp.abs(x) if x.dtype.kind != "c" else xp.maximum(xp.abs(x.real), xp.abs(x.imag))
    finite = xp.isfinite(x)
    amax = xp.where(finite, mag, 0.0).max(axis=axis)
    fin = finite.all(axis=axis)
    lsb = _host(_entry_stats(x)[2].min(axis=axis)) if need_lsb else None
    return _host(fin), _host(_frexp_exponent(amax)), lsb


def _width(fn_name: str, moduli, k: int, cplx: bool, fa, Ea, la, fb, Eb, lb):
    """``(s, t, ea, eb)``: moduli, width and the per row / column encoding exponents from the exponent pass (host)."""
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
    return s, t, ea, eb


def _encoder(cplx: bool, s: int, t: int, axis: int, backend):
    """Encode one block of ``op(a)`` (``axis=0``: exponents per row) or ``op(b)`` (``axis=1``: per column).

    Returns planes ``(P, L, r, c)`` of the block's array type: ``P = 1`` real;
    ``P = 3`` complex (real part, imaginary part and their residue sum, the 3M
    operands). Non-finite rows / columns are encoded as zeros (their results
    come from float64). ``e`` and ``fin`` are host vectors.
    """
    moduli = Basis.int8(s).moduli

    def enc(x, e: np.ndarray, fin: np.ndarray):
        be = get_backend(backend)
        xp = _namespace(x)
        ex, keep = (e[:, None], fin[:, None]) if axis == 0 else (e[None, :], fin[None, :])
        if not fin.all():
            x = xp.where(xp.asarray(keep), x, 0)
        parts = [x.real, x.imag] if cplx else [x]
        planes = [be.encode(xp.ascontiguousarray(p, dtype=np.float64), ex, moduli, t) for p in parts]
        if cplx:
            planes.append(be.add(planes[0], planes[1], moduli))
        return xp.stack(planes)

    return enc


def _leaves(x) -> list:
    """The blocks blockwise hands over for contracted indices (nested lists), in order: the k chunks."""
    if not isinstance(x, list):
        return [x]
    return [leaf for item in x for leaf in _leaves(item)]


def _decode_alpha(be, planes, moduli, exponent: np.ndarray, alpha: float):
    """The correctly rounded ``alpha * v * 2**exponent`` (as :func:`rnstensor.gemm._decode_scaled`), planes of any array type.

    ``alpha``'s odd significand joins the exact factor and its exponent the
    power of two; non-finite ``alpha`` multiplies the correctly rounded value
    (IEEE rules). One backend ``decode`` call, no host copy of the planes.
    """
    xp = _namespace(planes)
    if alpha == 0:
        return xp.zeros(planes.shape[1:])
    if not math.isfinite(alpha):
        with np.errstate(invalid="ignore"):
            return alpha * be.decode(planes, moduli, exponent, 1, "exact")
    ma, ea = _alpha_parts(alpha)
    out = be.decode(planes, moduli, exponent + ea, ma, "exact")
    return -out if alpha < 0 else out


def _tile_fn(cplx: bool, s: int, t: int, k: int, alpha, beta, backend):
    basis = Basis.int8(s)
    moduli = basis.moduli
    kind_bound = (k << (2 * t))  # |sum_k a b| <= k 2^t 2^t
    # the bounds the 3M sums and differences reach (6x for Im), as the in-memory range checks
    if 2 * (6 if cplx else 1) * kind_bound >= basis.product:
        raise RNSRangeError(f"rnstensor.dask: width t={t} at k={k} overflows {s} moduli")  # gemm_width rules this out

    def fn(pa_blocks, pb_blocks, ea, eb, fa, fb, *rest):
        be = get_backend(backend)
        pa_blocks, pb_blocks = _leaves(pa_blocks), _leaves(pb_blocks)
        xp = _namespace(pa_blocks[0])
        mb, nb = pa_blocks[0].shape[2], pb_blocks[0].shape[3]
        dtype = np.complex128 if cplx else np.float64
        term = xp.zeros((mb, nb), dtype)
        if alpha != 0 and k > 0 and mb > 0 and nb > 0:
            acc = None
            for pa, pb in zip(pa_blocks, pb_blocks):
                # one batched residue GEMM per k chunk: the P products (1 real, 3 for the 3M form)
                ps = be.matmul(pa.transpose(1, 0, 2, 3), pb.transpose(1, 0, 2, 3), moduli).transpose(1, 0, 2, 3)
                acc = ps if acc is None else xp.stack([be.add(u, v, moduli) for u, v in zip(acc, ps)])
            exponent = -ea[:, None] - eb[None, :]  # host int64, (mb, nb)

            def dec(planes, a):
                return _decode_alpha(be, planes, moduli, exponent, a)

            if cplx:
                P0, P1, P2 = (xp.ascontiguousarray(x) for x in acc)
                re = be.add(P0, P1, moduli, True)
                im = be.add(be.add(P2, P0, moduli, True), P1, moduli, True)
                ar, ai = alpha.real, alpha.imag
                term.real[...] = dec(re, ar) - dec(im, ai) if ai else dec(re, ar)
                term.imag[...] = dec(im, ar) + dec(re, ai) if ai else dec(im, ar)
            else:
                term[...] = dec(xp.ascontiguousarray(acc[0]), alpha)
            # rows / columns holding inf or NaN: NumPy float64 products with IEEE propagation, as in memory
            # (on the host, so that the bits are NumPy's; only these rows / columns come back)
            if not fa.all() or not fb.all():
                a_blocks, b_blocks = _leaves(rest[0]), _leaves(rest[1])
                Af = np.concatenate([_host(x) for x in a_blocks], axis=1)
                Bf = np.concatenate([_host(x) for x in b_blocks], axis=0)
                with np.errstate(invalid="ignore", over="ignore"):
                    if not fa.all():
                        rows = np.flatnonzero(~fa)
                        term[xp.asarray(rows), :] = xp.asarray(alpha * (Af[rows] @ Bf))
                    if not fb.all():
                        cols = np.flatnonzero(~fb)
                        term[:, xp.asarray(cols)] = xp.asarray(alpha * (Af @ Bf[:, cols]))
        if beta != 0:
            c = rest[-1]
            with np.errstate(invalid="ignore", over="ignore"):
                if beta == 1:
                    term = term + c
                elif xp is np or not isinstance(beta, complex) or beta.imag == 0:
                    term = term + beta * c
                else:
                    # NumPy's complex multiply (its own rounding, FMA where the CPU has it): on the host
                    term = term + xp.asarray(beta * _host(c))
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
    operands = {"a": a, "b": b}
    if isinstance(c, da.Array):
        operands["c"] = c
    backend, device = _resolve_backend(f"rnstensor.dask.{fn_name}", backend, operands)

    opa, opb = blas_operands(a, b, ta, tb, cplx, f"rnstensor.dask.{fn_name}")
    m, k = opa.shape
    n = opb.shape[1]
    if c is not None:
        if not isinstance(c, da.Array):
            # an in-memory c goes to the operands' array type
            if device:
                c = _cupy().asarray(c)
            else:
                c = np.asarray(c)
            c = da.from_array(c, chunks=(opa.chunks[0], opb.chunks[1]))
        if c.shape != (m, n):
            raise ValueError(f"rnstensor.dask.{fn_name}: c must have shape ({m}, {n}); got {c.shape}")
    elif beta != 0:
        raise ValueError(f"rnstensor.dask.{fn_name}: c is required when beta != 0 (got beta={beta!r})")
    # the k chunks of both operands must line up: take op(a)'s
    if opb.chunks[0] != opa.chunks[1]:
        opb = opb.rechunk({0: opa.chunks[1]})
    # pass 1: per row / column exponents (and the finite masks), as in memory; reduced where the chunks
    # live, only the vectors come to the client
    auto = moduli == "auto"
    fa, Ea, la = _group_stats(da, opa, 1, auto)
    fb, Eb, lb = _group_stats(da, opb, 0, auto)
    import dask

    got = [_host(v) for v in dask.compute(fa, Ea, fb, Eb, *((la, lb) if auto else ()))]
    fa, Ea, fb, Eb = got[:4]
    la, lb = got[4:] if auto else (None, None)
    s, t, ea, eb = _width(fn_name, moduli, k, cplx, fa, Ea, la, fb, Eb, lb)
    ea_d = da.from_array(ea, chunks=(opa.chunks[0],))
    eb_d = da.from_array(eb, chunks=(opb.chunks[1],))
    fa_d = da.from_array(fa, chunks=(opa.chunks[0],))
    fb_d = da.from_array(fb, chunks=(opb.chunks[1],))
    # every operand block is encoded once (op(a)'s block (i, k) serves every column tile j)
    P = 3 if cplx else 1
    L = s
    enc_a = da.blockwise(
        _encoder(cplx, s, t, 0, backend), "pLik", opa, "ik", ea_d, "i", fa_d, "i",
        new_axes={"p": P, "L": L}, dtype=np.int8, meta=_meta(opa, 4, np.int8),
    )
    enc_b = da.blockwise(
        _encoder(cplx, s, t, 1, backend), "pLkj", opb, "kj", eb_d, "j", fb_d, "j",
        new_axes={"p": P, "L": L}, dtype=np.int8, meta=_meta(opb, 4, np.int8),
    )
    fn = _tile_fn(cplx, s, t, k, alpha, beta, backend)
    args = [enc_a, "pLik", enc_b, "pLkj", ea_d, "i", eb_d, "j", fa_d, "i", fb_d, "j"]
    if not (fa.all() and fb.all()):
        args += [opa, "ik", opb, "kj"]
    if beta != 0:
        args += [c.rechunk((opa.chunks[0], opb.chunks[1])), "ij"]
    return da.blockwise(fn, "ij", *args, dtype=dtype, concatenate=False, meta=_meta(opa, 2, dtype))


def _block_gemm(x, y, cplx: bool, moduli, backend):
    """``x @ y`` of two in-memory 2-D blocks (NumPy or CuPy) as :func:`rnstensor.dgemm` / ``zgemm`` computes it.

    The same exponent pass, width rule, encoder and tile as the Dask GEMM,
    on one block with one ``k`` chunk: a CuPy block stays on the device.
    """
    xp = _namespace(x)
    (m, k), n = x.shape, y.shape[1]
    dtype = np.complex128 if cplx else np.float64
    if m == 0 or n == 0 or k == 0:
        return xp.zeros((m, n), dtype)
    auto = moduli == "auto"
    fa, Ea, la = _block_stats(x, 1, auto)
    fb, Eb, lb = _block_stats(y, 0, auto)
    s, t, ea, eb = _width("matmul", moduli, k, cplx, fa, Ea, la, fb, Eb, lb)
    pa = _encoder(cplx, s, t, 0, backend)(x, ea, fa)
    pb = _encoder(cplx, s, t, 1, backend)(y, eb, fb)
    one = complex(1.0) if cplx else 1.0
    return _tile_fn(cplx, s, t, k, one, 0.0, backend)(pa, pb, ea, eb, fa, fb, x, y)


def _matmul_block(x, y, cplx: bool, moduli, backend):
    """:func:`rnstensor.matmul` of two in-memory blocks of any array type (1-D operands, broadcast batches)."""
    xp = _namespace(x)
    x2 = x[None, :] if x.ndim == 1 else x
    y2 = y[:, None] if y.ndim == 1 else y
    batch = np.broadcast_shapes(x2.shape[:-2], y2.shape[:-2])
    m, n = x2.shape[-2], y2.shape[-1]
    X = xp.broadcast_to(x2, batch + x2.shape[-2:])
    Y = xp.broadcast_to(y2, batch + y2.shape[-2:])
    res = xp.empty(batch + (m, n), np.complex128 if cplx else np.float64)
    for idx in np.ndindex(*batch):
        res[idx] = _block_gemm(X[idx], Y[idx], cplx, moduli, backend)
    if x.ndim == 1:
        res = res[..., 0, :]
    if y.ndim == 1:
        res = res[..., 0]
    return res


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

    Operands with batch axes are multiplied block by block on whole ``k``
    panels (the contracted axis is rechunked to one chunk), every 2-D product
    as :func:`rnstensor.matmul` computes it: NumPy blocks by
    :func:`rnstensor.matmul` itself, CuPy blocks on the device (the same
    exponents, width, encode, residue product and exact decode).
    """
    da = _dask_array()
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, da.Array):
            raise TypeError(f"rnstensor.dask.matmul: {name} must be a dask.array.Array; got {type(x).__name__}")
        if x.dtype not in (np.float64, np.complex128):
            raise TypeError(f"rnstensor.dask.matmul: {name} must be float64 or complex128; got {x.dtype}")
    moduli = _check_moduli(moduli, "matmul")
    backend, device = _resolve_backend("rnstensor.dask.matmul", backend, {"a": a, "b": b})
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
    if device:
        def block(x, y):
            return _matmul_block(x, y, cplx, moduli, backend)
    else:
        def block(x, y):
            return _matmul_in_memory(x, y, moduli=moduli, backend=backend)
    return da.blockwise(block, out, a, ia, b, ib, dtype=dtype, concatenate=True, meta=_meta(a, len(out), dtype))
