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
- :func:`apply` hands CuPy blocks as they are to a :class:`~rnstensor.ChainPlan`
  (``plan.run(block, backend='cuda')``), a one-operand
  :class:`~rnstensor.ContractExpression` and a FEM operator (its fields placed
  on the device once, on the client; each block slices them): CuPy in, CuPy
  out. Plain functions take NumPy: their blocks make an explicit host round
  trip (``cupy.asnumpy`` → ``f`` → ``cupy.asarray``). For a function that
  takes CuPy itself, use ``X.map_blocks``.

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

from typing import Any, Optional

import numpy as np

from .arrays import array_module, device_module as _cupy
from .backends import get_backend
from .basis import Basis
from .encode import _NONE
from .errors import RNSRangeError
from .chain import ChainPlan
from .contract import ContractExpression
from .gemm import _check_moduli, _check_scalar, _check_target, _check_trans, _encoded, blas_operands, entry_stats, frexp_exponent
from .gemm import SplitNeeded, gemm_program, gemm_scale, gemm_targets
from .magnitude import measure_ratio
from .run.epilogue import exact_epilogue, gemm_epilogue, plus_beta_c, two_term_alpha
from .planner.methods import MIN_BITS
from .gemm import matmul as _matmul_in_memory
from .program.execute import Value
from .run.tiles import tile_result

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
        # CuPy blocks run on the device as they are (the expression dispatches on their type)
        return (lambda blk: exprs[blk.shape[0]](blk, backend=backend)), np.shape(out)[1:], True
    if hasattr(f, "elements") and hasattr(f, "nelem"):
        # a FEM operator: its geometric data is per element, so each block takes its own slice
        if X.shape[0] != f.nelem:
            raise ValueError(f"apply: X has {X.shape[0]} elements but the operator's geometric data has {f.nelem}")
        out = np.asarray(f.elements(0, 1).apply(probe))
        if backend == "cuda" or chunk_module(X) == "cupy":
            f.place(get_backend("cuda").xp)  # the blocks slice the operator's device copies
        return "elements", out.shape[1:], True
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
    in-memory result bit for bit. With the certified default
    (``moduli=None``, or ``rtol=``) too: each element's plan is the
    narrowest certified for that element alone (per-tensor verdicts,
    :class:`~rnstensor.program.classical.ClassicalErrors`), whatever block it
    comes in.

    CuPy chunks (see the module notes): a ChainPlan, a contract expression
    and a FEM operator run each block on the device, CuPy in and out. A plain
    function takes NumPy, so each of its blocks makes an explicit host round
    trip (``cupy.asnumpy(block)``, ``f``, ``cupy.asarray``). The result has
    CuPy chunks either way. A function that takes CuPy blocks itself belongs
    in ``X.map_blocks``.

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
# The in-memory GEMM's program (rnstensor.gemm.gemm_program), its steps run per block: the exponent scan of
# rnstensor.gemm reduced over all chunks first, every operand block encoded once, each tile's k-chunk
# products summed in residues (Add steps) and decoded once. The blocks are NumPy or CuPy arrays alike and go to
# the backend as they are: CuPy blocks never leave the device between encode and decode. Exponents and
# finite masks are per row / column vectors reduced where the chunks live, brought to the client to choose the
# width, and handed back to every task in the chunks' array type.


def _group_stats(da, x, axis: int, need_lsb: bool):
    """:func:`rnstensor.gemm.group_stats` of a Dask matrix, as small Dask vectors (reduced where the chunks live).

    ``Emax`` comes from one reduction of ``|x|`` (frexp is monotone),
    ``Emin`` from one of its nonzero parts; the lowest set bits
    (``moduli='auto'`` only) from every entry's significand.
    """
    mag = abs(x) if x.dtype != np.complex128 else da.maximum(abs(x.real), abs(x.imag))
    finite = da.isfinite(x)
    amax = da.where(finite, mag, 0.0).max(axis=axis)
    fin = finite.all(axis=axis)
    Emax = amax.map_blocks(frexp_exponent, dtype=np.int64, meta=_meta(x, 1, np.int64))
    parts = (mag,) if x.dtype != np.complex128 else (abs(x.real), abs(x.imag))
    amin = None
    for p in parts:
        low = da.where((p != 0) & da.isfinite(p), p, np.inf).min(axis=axis)
        amin = low if amin is None else da.minimum(amin, low)
    Emin = da.where(da.isfinite(amin), amin, 0.0).map_blocks(frexp_exponent, dtype=np.int64,
                                                              meta=_meta(x, 1, np.int64))
    return fin, Emax, (_group_lsb(x, axis) if need_lsb else None), Emin


def _group_lsb(x, axis: int):
    """:func:`rnstensor.gemm.group_lsb` of a Dask matrix: every significand's lowest set bit, reduced per group."""
    return x.map_blocks(lambda b: entry_stats(b)[2], dtype=np.int64, meta=_meta(x, 2, np.int64)).min(axis=axis)


def _encoder(prog, axis: int, backend):
    """Encode one block of ``op(a)`` (``axis=0``: exponents per row) or ``op(b)`` (``axis=1``: per column).

    Returns the block's residue planes in its own array type: ``(L, r, c)``
    real, ``(L, 2, r, c)`` complex (the parts share their exponents).
    Non-finite rows / columns are encoded as zeros (their results come from
    float64). ``e`` and ``fin`` are the block's slices of the exponent and
    finite vectors, in its array type.
    """
    st = prog.steps[axis]
    cplx = prog.complex

    def enc(x, e, fin):
        be = get_backend(backend)
        xp = _namespace(x)
        keep = fin[:, None] if axis == 0 else fin[None, :]
        if not bool(fin.all()):
            x = xp.where(keep, x, 0)
        if cplx:
            x = xp.stack([x.real, x.imag])
            e = e[None, :, None] if axis == 0 else e[None, None, :]
        else:
            e = e[:, None] if axis == 0 else e[None, :]
        return _encoded(xp.ascontiguousarray(x, dtype=np.float64), e, st, prog.basis, be).planes

    return enc


def _leaves(x) -> list:
    """The blocks blockwise hands over for contracted indices (nested lists), in order: the k chunks."""
    if not isinstance(x, list):
        return [x]
    return [leaf for item in x for leaf in _leaves(item)]


def _tile_fn(prog, k: int, alpha, beta, backend, exact: bool = False, with_operands: bool = False):
    """One output tile's task, finished by the one GEMM epilogue (:func:`rnstensor.run.epilogue.gemm_epilogue`);
    ``exact``: ``moduli='auto'``'s exact epilogue; ``with_operands``: the tile also reads its blocks of ``op(a)``
    and ``op(b)``."""
    enc_a, enc_b = prog.steps[:2]
    cplx = prog.complex

    def fn(pa_blocks, pb_blocks, ea, eb, fa, fb, *rest):
        be = get_backend(backend)
        pa_blocks, pb_blocks = _leaves(pa_blocks), _leaves(pb_blocks)
        xp = _namespace(pa_blocks[0])
        mb, nb = pa_blocks[0].shape[-2], pb_blocks[0].shape[-1]
        dtype = np.complex128 if cplx else np.float64
        term = xp.zeros((mb, nb), dtype)
        if alpha != 0 and k > 0 and mb > 0 and nb > 0:
            # the exponents, host vectors, as the encoded values carry them (keepdims)
            exp_a = (-ea)[None, :, None] if cplx else (-ea)[:, None]
            exp_b = (-eb)[None, None, :] if cplx else (-eb)[None, :]
            pairs = ((Value(pa, exp_a, 1, enc_a.bound, enc_a.labels), Value(pb, exp_b, 1, enc_b.bound, enc_b.labels))
                     for pa, pb in zip(pa_blocks, pb_blocks))
            c = rest[-1] if beta != 0 else None
            # exact: the tile's exact integers, alpha, beta and c, rounded once (on the host)
            finish = (lambda v: xp.asarray(exact_epilogue(v, prog.basis, alpha, beta, None if c is None else _host(c),
                                                          cplx))) if exact else None
            term[...] = tile_result(prog, pairs, be, backend, xp, finish)
            # the operands, where a row / column holds inf or NaN or alpha's two terms may overflow (see _gemm)
            A, B = ((xp.concatenate(_leaves(rest[0]), axis=1), xp.concatenate(_leaves(rest[1]), axis=0))
                    if with_operands else (None, None))
            return gemm_epilogue(term, alpha, beta, c, fa, fb, xp, opa=A, opb=B, combined=exact, exact=exact,
                                 cplx=cplx)
        return gemm_epilogue(term, alpha, beta, rest[-1] if beta != 0 else None, None, None, xp, multiplied=False,
                             exact=exact, cplx=cplx)

    return fn


def _gemm(fn_name: str, cplx: bool, a, b, c, alpha, beta, trans_a, trans_b, moduli, backend, min_bits, rtol=None):
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
    rtol = _check_target(rtol, moduli, f"rnstensor.dask.{fn_name}")
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
    fa, Ea, la, Na = _group_stats(da, opa, 1, auto)
    fb, Eb, lb, Nb = _group_stats(da, opb, 0, auto)
    import dask

    got = [_host(v) for v in dask.compute(fa, Ea, Na, fb, Eb, Nb, *((la, lb) if auto else ()))]
    fa, Ea, Na, fb, Eb, Nb = got[:6]
    la, lb = got[6:] if auto else (None, None)

    def lsb_of():  # only when the spreads alone ask for more than the 53-bit width
        return [_host(v) for v in dask.compute(_group_lsb(opa, 1), _group_lsb(opb, 0))]

    def magnitudes_of():  # the in-memory criterion, reduced where the chunks live (one scalar comes back)
        xp = _namespace(opa)  # the vectors in the chunks' array type (NumPy or CuPy)
        rows, cols = (opa.chunks[0],), (opb.chunks[1],)
        A = da.where(da.from_array(xp.asarray(fa), chunks=rows)[:, None], opa, 0)
        Bm = da.where(da.from_array(xp.asarray(fb), chunks=cols)[None, :], opb, 0)
        # (the rows and columns zeroed for their inf / NaN have no encoding error: exponent NONE, as zero ones)
        return measure_ratio(A, da.from_array(xp.asarray(np.where(fa, Ea, _NONE)), chunks=rows), Bm,
                               da.from_array(xp.asarray(np.where(fb, Eb, _NONE)), chunks=cols), xp=da)

    # (the product's target and the epilogue as the in-memory call has them: gemm_targets)
    target, exact = gemm_targets(moduli, rtol, alpha, beta, cplx)
    try:
        s, t, ea, eb = gemm_scale(moduli, max(k, 1), cplx, (fa, Ea, la, Na), (fb, Eb, lb, Nb),
                                  f"rnstensor.dask.{fn_name}", min_bits, lsb_of, magnitudes_of, target)
    except SplitNeeded as exc:
        if moduli == "auto" or rtol is not None:  # (a target takes the exact split in memory too)
            return _split_tiles(fn_name, opa, opb, c, alpha, beta, backend, dtype, exact)
        said = str(exc).removeprefix(f"rnstensor.dask.{fn_name}: ")
        raise RNSRangeError(
            f"rnstensor.dask.{fn_name}: {said}; the in-memory {fn_name} splits such rows and columns exactly, the "
            f"Dask default does not: pass moduli='auto' (correctly rounded, each output tile split exactly as in "
            f"memory), or compute this product in memory (rnstensor.{fn_name} on the arrays), or pass "
            f"moduli='fast' (float64-level accuracy on well-scaled data) or an explicit moduli, without rtol"
        ) from None
    prog = gemm_program(Basis.int8(s), t, max(k, 1), cplx, alpha)
    # the vectors go back to the operands' array type (once per call): each task finds its slice there
    xp = _namespace(opa)
    ea_d, fa_d = (da.from_array(xp.asarray(v), chunks=(opa.chunks[0],)) for v in (ea, fa))
    eb_d, fb_d = (da.from_array(xp.asarray(v), chunks=(opb.chunks[1],)) for v in (eb, fb))
    # every operand block is encoded once (op(a)'s block (i, k) serves every column tile j)
    lab_a, lab_b = ("Lpik", "Lpkj") if cplx else ("Lik", "Lkj")
    axes = {"L": s, "p": 2} if cplx else {"L": s}
    enc_a = da.blockwise(_encoder(prog, 0, backend), lab_a, opa, "ik", ea_d, "i", fa_d, "i",
                         new_axes=axes, dtype=np.int8, meta=_meta(opa, len(lab_a), np.int8))
    enc_b = da.blockwise(_encoder(prog, 1, backend), lab_b, opb, "kj", eb_d, "j", fb_d, "j",
                         new_axes=axes, dtype=np.int8, meta=_meta(opb, len(lab_b), np.int8))
    # the epilogue reads the operands for rows / columns holding inf or NaN, and to recompute the entries where a
    # complex alpha's two float64 terms overflow (the in-memory zgemm does); a real alpha's one rounding cannot
    with_operands = not (fa.all() and fb.all()) or (two_term_alpha(alpha, cplx) and not exact)
    fn = _tile_fn(prog, k, alpha, beta, backend, exact, with_operands)
    args = [enc_a, lab_a, enc_b, lab_b, ea_d, "i", eb_d, "j", fa_d, "i", fb_d, "j"]
    if with_operands:
        args += [opa, "ik", opb, "kj"]
    if beta != 0:
        args += [c.rechunk((opa.chunks[0], opb.chunks[1])), "ij"]
    return da.blockwise(fn, "ij", *args, dtype=dtype, concatenate=False, meta=_meta(opa, 2, dtype))


def _split_tiles(fn_name: str, opa, opb, c, alpha, beta, backend, dtype, exact: bool = True):
    """``moduli='auto'`` (or a target) where some row or column needs more than 49 moduli: each output tile by the
    in-memory :func:`rnstensor.dgemm` / :func:`rnstensor.zgemm` on its rows of ``op(a)`` and columns of ``op(b)``,
    whole along ``k`` (its exact product in integers). The product is correctly rounded, so unique: the bits of
    one in-memory call, for any chunking; ``beta * c`` joins it before that rounding (``exact``: 'auto', or a target
    within the float64 epilogue's roundings) or after it in float64, as the in-memory call adds it. CuPy chunks
    stay CuPy chunks: the in-memory call takes them as it takes any device operands."""
    from .gemm import dgemm as _dgemm, zgemm as _zgemm  # noqa: PLC0415 - (the module's names are the Dask ones)

    gemm = _zgemm if fn_name == "zgemm" or dtype.kind == "c" else _dgemm

    def tile(pa, pb, *rest):
        xp = _namespace(pa)
        ct = rest[0] if rest else None
        kw = dict(alpha=alpha, moduli="auto", backend=backend if xp is np else None)
        if exact:
            return gemm(pa, pb, ct, beta=beta, **kw)
        y = gemm(pa, pb, **kw)
        return y if ct is None else plus_beta_c(y, beta, ct, xp)

    args = [opa, "ik", opb, "kj"]
    if beta != 0:
        args += [c.rechunk((opa.chunks[0], opb.chunks[1])), "ij"]
    return _dask_array().blockwise(tile, "ij", *args, dtype=dtype, concatenate=True, meta=_meta(opa, 2, dtype))


def dgemm(a, b, c=None, *, alpha: float = 1.0, beta: float = 0.0, trans_a: str = "N", trans_b: str = "N",
          moduli=None, backend: Optional[str] = None, min_bits: int = MIN_BITS, rtol: Optional[float] = None):
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
    return _gemm("dgemm", False, a, b, c, alpha, beta, trans_a, trans_b, moduli, backend, min_bits, rtol)


def zgemm(a, b, c=None, *, alpha: complex = 1.0, beta: complex = 0.0, trans_a: str = "N", trans_b: str = "N",
          moduli=None, backend: Optional[str] = None, min_bits: int = MIN_BITS, rtol: Optional[float] = None):
    """:func:`rnstensor.zgemm` on Dask arrays (the exact 3M form, chunk products summed in residues); see :func:`dgemm`."""
    return _gemm("zgemm", True, a, b, c, alpha, beta, trans_a, trans_b, moduli, backend, min_bits, rtol)


def matmul(a, b, *, moduli=None, backend: Optional[str] = None, min_bits: int = MIN_BITS,
           rtol: Optional[float] = None):
    """``a @ b`` on Dask arrays with numpy's semantics: 2-D (and 1-D) by :func:`dgemm` / :func:`zgemm`.

    Operands with batch axes are multiplied block by block on whole ``k``
    panels (the contracted axis is rechunked to one chunk; with the default
    ``moduli=None``, whose width depends on every row and column, the row and
    column axes too), every 2-D product
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
    rtol = _check_target(rtol, moduli, "rnstensor.dask.matmul")
    backend, device = _resolve_backend("rnstensor.dask.matmul", backend, {"a": a, "b": b})
    cplx = np.complex128 in (a.dtype, b.dtype)
    if cplx:
        a, b = a.astype(np.complex128), b.astype(np.complex128)
    if a.ndim <= 2 and b.ndim <= 2:
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        res = (zgemm if cplx else dgemm)(a2, b2, moduli=moduli, backend=backend, min_bits=min_bits, rtol=rtol)
        if a.ndim == 1:
            res = res[0]
        if b.ndim == 1:
            res = res[..., 0]
        return res
    if moduli is None:  # the default's (and a target's) width depends on every row and column: whole matrices
        a = a.rechunk({a.ndim - 1: -1, **({a.ndim - 2: -1} if a.ndim > 1 else {})})
        b = b.rechunk({b.ndim - 1: -1, **({b.ndim - 2: -1} if b.ndim > 1 else {})})
    else:
        a = a.rechunk({a.ndim - 1: -1})
        b = b.rechunk({b.ndim - 2: -1} if b.ndim > 1 else {0: -1})
    nd = max(a.ndim, b.ndim)
    letters = "abcdefghijklmnopqrstuvwxyz"
    batch = letters[: nd - 2]
    ia = batch[nd - a.ndim :] + "yk" if a.ndim > 1 else "k"
    ib = batch[nd - b.ndim :] + "kz" if b.ndim > 1 else "k"
    out = batch + ("y" if a.ndim > 1 else "") + ("z" if b.ndim > 1 else "")
    dtype = np.complex128 if cplx else np.float64

    def block(x, y):  # NumPy or CuPy blocks: the in-memory matmul keeps each where it is
        return _matmul_in_memory(x, y, moduli=moduli, backend=backend, min_bits=min_bits, rtol=rtol)

    return da.blockwise(block, out, a, ia, b, ib, dtype=dtype, concatenate=True, meta=_meta(a, len(out), dtype))
