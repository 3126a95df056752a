"""One output tile of a GEMM program, in memory or in a Dask task: its k chunks' exact products, decoded once."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Optional

from ..ir import Add
from ..program.execute import run_step

__all__ = ["tile_result"]


def tile_result(prog, pairs: Iterable, be, backend_name, xp, finish: Optional[Callable] = None,
                phase: Callable = lambda name: contextlib.nullcontext()):
    """The tile of ``prog`` (a :func:`rnstensor.gemm.gemm_program`: two encodes, one product, one decode) over
    ``pairs``: ``(op(a) rows, op(b) columns)`` encoded values, one pair per chunk of the contracted index (the
    in-memory tiles: one; a Dask tile: one per k chunk), their exact products summed in residues (the product's
    bound is the whole sum's), then the program's decode, or ``finish(value)`` (the exact epilogue's). ``xp``:
    the planes' array module (the caller's, found once).
    ``phase(name)``: a context around the ``'products'`` and the ``'decode'`` (a benchmark's timer).

    Examples
    --------
    >>> import numpy as np
    >>> from rnstensor.backends import get_backend
    >>> from rnstensor.basis import Basis
    >>> from rnstensor.gemm.tiles import _encoded, gemm_program
    >>> prog = gemm_program(Basis.int8(16), 40, 4, False, 1.0)
    >>> a, b = np.array([[1.0, 2.0, 3.0, 4.0]]), np.array([[1.0], [1.0], [1.0], [0.5]])
    >>> be, ea, eb = get_backend("numpy"), np.array([[40 - 3]]), np.array([[40 - 1]])  # t - frexp exponent
    >>> halves = [(_encoded(a[:, :2], ea, prog.steps[0], prog.basis, be),
    ...            _encoded(b[:2], eb, prog.steps[1], prog.basis, be)),
    ...           (_encoded(a[:, 2:], ea, prog.steps[0], prog.basis, be),
    ...            _encoded(b[2:], eb, prog.steps[1], prog.basis, be))]
    >>> tile_result(prog, halves, be, "numpy", np)
    array([[8.]])
    """
    enc_a, enc_b, product, dec = prog.steps
    running = max(product.out, dec.out) + 1  # a free slot: the sum so far
    total = Add(product.out, product.out, running, False, product.bound)
    vals: dict = {}
    with phase("products"):
        for n, (va, vb) in enumerate(pairs):
            vals[enc_a.out], vals[enc_b.out] = va, vb
            run_step(product, vals, prog.basis, be, backend_name, xp)
            if n:
                run_step(total, vals, prog.basis, be, backend_name, xp)
            vals[running] = vals[product.out]
    with phase("decode"):
        if finish is not None:
            return finish(vals[product.out])
        return run_step(dec, vals, prog.basis, be, backend_name, xp)
