"""Dask: element batches through plans / expressions / FEM operators, and DGEMM tiles reduced in residues."""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from .chain import ChainPlan
from .contract import ContractExpression

__all__ = ["apply"]


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
    if callable(f):
        out = np.asarray(f(probe))
        return f, out.shape[1:]
    raise TypeError(f"apply: f must be a ChainPlan, a ContractExpression or a callable on batches; got {type(f).__name__}")


def apply(f: Any, X, *, dtype: Optional[np.dtype] = None):
    """Apply ``f`` to a Dask array of elements chunked along axis 0, block by block.

    ``f`` is a :class:`~rnstensor.ChainPlan`, a one-operand
    :class:`~rnstensor.ContractExpression`, or any function of a batch
    (``(nb, ...) -> (nb, ...)``) such as a FEM operator's ``apply``. Operators
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
    return X.map_blocks(
        lambda blk: np.asarray(fn(blk), dtype=dtype).reshape((blk.shape[0],) + tail),
        dtype=dtype, chunks=chunks, drop_axis=drop_axis or None, new_axis=new_axis or None,
    )
