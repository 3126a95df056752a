"""The residue program of one GEMM and its run over output tiles in a workspace (and the benchmarks' phase timing)."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from functools import lru_cache
from typing import Iterator

import numpy as np

from ..arrays import array_module, to_module
from ..basis import Basis
from ..errors import RNSRangeError
from ..planner.program import Failure, Given, plan_drops
from .. import ir
from ..program.execute import DeferredValue, Value
from ..run.tiles import tile_result
from ..run.epilogue import exact_epilogue

__all__ = ["gemm_program"]

# ----- tiling --------------------------------------------------------------------------------


def _tile_bytes(mb: int, nb: int, k: int, s: int, cplx: bool) -> int:
    """Peak bytes of one ``mb x nb`` output tile (inputs, residue planes, backend staging, decode).

    Real: per input entry ``s`` int8 planes, a float64 copy and float32 BLAS
    staging (``s + 16``); per output entry ``s`` planes, the float64 chunk
    accumulator, a float32 partial, the decoded float64 and its exponent
    (``s + 32``). Complex: both parts, the sums and three products.
    """
    ins = mb * k + k * nb
    if cplx:
        return (3 * s + 40) * ins + (6 * s + 64) * mb * nb
    return (s + 16) * ins + (s + 32) * mb * nb


def _tiles(m: int, n: int, k: int, s: int, cplx: bool, workspace: int) -> tuple[int, int]:
    """Tile sizes: start from the whole C and halve the longer side until one tile fits the workspace."""
    mb, nb = max(m, 1), max(n, 1)
    while _tile_bytes(mb, nb, k, s, cplx) > workspace and (mb > 1 or nb > 1):
        if mb >= nb:
            mb = -(-mb // 2)
        else:
            nb = -(-nb // 2)
    return mb, nb


def _plan_tiles(m: int, n: int, k: int, s: int, cplx: bool, workspace: int) -> tuple[int, int, bool]:
    """``(mb, nb, cache_a)``: tile sizes, and whether ``op(a)`` is encoded once for all tiles.

    Untiled: one tile. Tiled: every column block of ``op(b)`` is encoded once
    (the outer loop) and reused by all its row tiles; ``op(a)`` is encoded
    once as a whole when its encoding peak (``(s + 16) m k`` bytes real,
    ``(3 s + 40) m k`` complex) fits half the workspace, its residue planes
    (``s m k``, complex ``3 s m k``) are then held and the tiles are sized in
    the rest of the workspace; otherwise each row block is encoded per tile.
    Results are bitwise the same in every case (exponents per row / column).
    """
    mb, nb = _tiles(m, n, k, s, cplx, workspace)
    if (mb, nb) == (max(m, 1), max(n, 1)):
        return mb, nb, False
    peak = (3 * s + 40 if cplx else s + 16) * m * k
    held = (3 * s if cplx else s) * m * k
    if peak > workspace // 2:
        return mb, nb, False
    mb, nb = _tiles(m, n, k, s, cplx, workspace - held)
    return mb, nb, True


# ----- timing hook (benchmarks) ---------------------------------------------------------------


@contextmanager
def _phase(name: str) -> Iterator[None]:
    # PHASES and PHASE_SYNC live on the package (rnstensor.gemm), where benchmarks set them: read there at each phase
    hooks = sys.modules[__package__]
    if hooks.PHASES is None:
        yield
        return
    if hooks.PHASE_SYNC is not None:
        hooks.PHASE_SYNC()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        if hooks.PHASE_SYNC is not None:
            hooks.PHASE_SYNC()
        hooks.PHASES[name] = hooks.PHASES.get(name, 0.0) + time.perf_counter() - t0


# ----- the program ------------------------------------------------------------------------------


@lru_cache(maxsize=256)
def gemm_program(basis: Basis, t: int, k: int, cplx: bool, alpha, transposed: bool = False,
                 stack: bool = False) -> ir.Program:
    """The residue program of ``alpha * op(a) @ op(b)`` at width ``t``: two encodes, one product, one exact decode.

    Slot 0 is ``op(a)`` (``'ik'``: one exponent per row), slot 1 ``op(b)``:
    ``'kj'`` (one exponent per column), or ``'jk'`` when ``transposed`` (the
    K-contiguous layout of the tensor-core engines, whose product is C^T).
    Complex operands carry their (re, im) parts first (``'cik'``, sharing the
    row exponent) and multiply by the exact 3M form. Bounds: ``2**t`` per
    operand, ``k 4**t`` for the product (``6 k 4**t`` for the 3M parts), which
    :func:`gemm_width` keeps inside the range. ``stack``: a stack of
    GEMMs ``A[b] @ B[b]``, a batch index ``b`` first (``'bik'``, ``'bkj'``:
    one exponent per row of each ``A[b]``, per column of each ``B[b]``);
    complex, each operand's (re, im) axis first (``'cbik'``, ``'dbkj'``), one
    batched product of the parts and their exact 4M combination (bound
    ``2 k 4**t``, inside the 3M's ``6 k 4**t`` the width is chosen for: the
    same integers, so the same bits as one 3M product per matrix).

    Examples
    --------
    >>> p = gemm_program(Basis.int8(16), 56, 4096, False, 1.0)
    >>> [type(s).__name__ for s in p.steps]
    ['Encode', 'Encode', 'Contract', 'Decode']
    """
    B = 1 << t
    out = "ji" if transposed else "ij"
    final = 3
    if stack and cplx:
        steps = (
            ir.Encode(0, 0, t, (0, 3), "cbik", B, complex=True),
            ir.Encode(1, 1, t, (0, 2), "dbkj", B, complex=True),
            ir.Contract(2, 0, 1, "cbik", "dbkj", "", "", "k", "b", "ci", "dj", "matmul", "bcidj", 2 * k * B * B),
            ir.Combine(3, 2, "c", "d", "cbij"),
            ir.Decode(4, 3, "exact", alpha, complex=True),
        )
        out, final = "bij", 4
    elif stack:
        out = "bij"
        steps = (
            ir.Encode(0, 0, t, (2,), "bik", B),
            ir.Encode(1, 1, t, (1,), "bkj", B),
            ir.Contract(2, 0, 1, "bik", "bkj", "", "", "k", "b", "i", "j", "matmul", out, k * B * B),
            ir.Decode(3, 2, "exact", alpha),
        )
    elif not cplx:
        b_labels, b_shared = ("jk", (1,)) if transposed else ("kj", (0,))
        steps = (
            ir.Encode(0, 0, t, (1,), "ik", B),
            ir.Encode(1, 1, t, b_shared, b_labels, B),
            ir.Contract(2, 1, 0, b_labels, "ik", "", "", "k", "", "j", "i", "mode", out, k * B * B),
            ir.Decode(3, 2, "exact", alpha),
        )
    else:
        b_labels, b_shared = ("cjk", (0, 2)) if transposed else ("ckj", (0, 1))
        steps = (
            ir.Encode(0, 0, t, (0, 2), "cik", B, complex=True),
            ir.Encode(1, 1, t, b_shared, b_labels, B, complex=True),
            ir.Contract3M(2, 1, 0, b_labels, "cik", "k", "c" + out, 6 * k * B * B),
            ir.Decode(3, 2, "exact", alpha, complex=True),
        )
    planned = plan_drops(ir.Program(basis, steps, final, out, cplx), {}, Given([]))  # the range check of every step
    if isinstance(planned, Failure):
        raise RNSRangeError(f"gemm: width t={t} at k={k} does not fit {len(basis)} moduli ({planned})")
    return planned.program


def _encoded(x, e, st: ir.Encode, basis: Basis, be) -> Value:
    """An operand (or block of it) encoded with the exponents of the scan (``e`` keepdims, where ``x`` lives)."""
    return Value(be.encode(x, e, basis.moduli, st.bits), -e, 1, st.bound, st.labels)


def _rows(v: Value, lo: int, hi: int) -> Value:
    """Rows ``lo:hi`` (the ``'i'`` index) of an encoded ``op(a)``: contiguous planes, the same exponents."""
    xp = array_module(v.planes)
    ax = v.labels.index("i")
    idx = (slice(None),) * ax + (slice(lo, hi),)
    return Value(xp.ascontiguousarray(v.planes[(slice(None),) + idx]), v.exp[idx], v.factor, v.bound, v.labels)


def _run_tiles(term, prog: ir.Program, A, Bm, ea, eb, m: int, n: int, mb: int, nb: int, cache_a: bool, be, xp,
               backend_name, transposed: bool, finish=None) -> None:
    """Every output tile of ``prog``: ``op(b)`` encoded once per column block, ``op(a)`` once or per row block.

    ``finish(product value, i0, i1, j0, j1)`` gives the tile's result (in the product's layout) in place of the
    program's decode (the exact epilogue)."""
    enc_a, enc_b = prog.steps[:2]
    cplx = prog.complex
    basis = prog.basis

    def parts(x):
        return xp.stack([x.real, x.imag]) if cplx else x

    ea_k = ea[None, :, None] if cplx else ea[:, None]

    def encode_a(i0, i1):
        return _encoded(parts(A[i0:i1]), ea_k[..., i0:i1, :], enc_a, basis, be)

    whole_a = None
    if cache_a:
        with _phase("encode"):
            whole_a = encode_a(0, m)
    for j0 in range(0, n, nb):
        j1 = min(j0 + nb, n)
        with _phase("encode"):
            if transposed:
                xb = parts(xp.ascontiguousarray(Bm[:, j0:j1].T))
                e = eb[None, j0:j1, None] if cplx else eb[j0:j1, None]
            else:
                xb = parts(Bm[:, j0:j1])
                e = eb[None, None, j0:j1] if cplx else eb[None, j0:j1]
            vb = _encoded(xb, e, enc_b, basis, be)
        for i0 in range(0, m, mb):
            i1 = min(i0 + mb, m)
            if whole_a is not None:
                va = _rows(whole_a, i0, i1)
            else:
                with _phase("encode"):
                    va = encode_a(i0, i1)
            done = None if finish is None else (lambda v, i0=i0, i1=i1, j0=j0, j1=j1: finish(v, i0, i1, j0, j1))
            res = tile_result(prog, [(va, vb)], be, backend_name, xp, done, _phase)
            term[i0:i1, j0:j1] = res.T if transposed else res


def _run_product(term, prog: ir.Program, A, Bm, ea, eb, m: int, n: int, k: int, s: int, cplx: bool, workspace: int,
                 be, xp, backend_name, transposed: bool, finish=None) -> None:
    """``term <- prog(A, Bm)``: the backend's own exact GEMM engine where it takes the shape, else the INT8 tiles
    (``finish``: see :func:`_run_tiles`; the engine decodes itself, so it is not used then)."""
    engine = getattr(be, "exact_gemm", None)
    if engine is not None and not transposed and finish is None:
        with _phase("products"):  # the engine's encode and decode count here too
            res = engine(prog, A, Bm, ea, eb, workspace)
        if res is not None:
            term[...] = res
            return
    takes = getattr(be, "takes_product", None)
    if (finish is not None and takes is not None and not cplx and not transposed
            and takes(m, n, k, s, prog.steps[2].bound, workspace)):
        # the exact epilogue reads the product's residues: the engine's, from the floats (the planes never made)
        enc_a, enc_b = prog.steps[:2]
        va = DeferredValue(lambda: _encoded(A, ea[:, None], enc_a, prog.basis, be).planes, -ea[:, None], 1,
                           enc_a.bound, enc_a.labels, A)
        vb = DeferredValue(lambda: _encoded(Bm, eb[None, :], enc_b, prog.basis, be).planes, -eb[None, :], 1,
                           enc_b.bound, enc_b.labels, Bm)
        term[...] = tile_result(prog, [(va, vb)], be, backend_name, xp, lambda v: finish(v, 0, m, 0, n), _phase)
        return
    with _phase("other"):
        mb, nb, cache_a = _plan_tiles(m, n, k, s, cplx, workspace)
    _run_tiles(term, prog, A, Bm, ea, eb, m, n, mb, nb, cache_a, be, xp, backend_name, transposed, finish)


def _exact_whole(prog: ir.Program, A, Bm, ea, eb, m: int, n: int, k: int, s: int, cplx: bool, workspace: int, be, xp,
                 backend_name, transposed: bool, alpha, beta, c):
    """``alpha * A @ Bm + beta * c`` rounded once per entry (part): ``prog``'s exact products, tile by tile, through
    the exact epilogue (:func:`rnstensor.run.epilogue.exact_epilogue`; ``c`` on the host, or ``None``)."""
    term = np.zeros((m, n), np.complex128 if cplx else np.float64)

    def finish(v: Value, i0: int, i1: int, j0: int, j1: int):
        ct = None if c is None else (c[i0:i1, j0:j1].T if transposed else c[i0:i1, j0:j1])
        return exact_epilogue(v, prog.basis, alpha, beta, ct, cplx)

    _run_product(term, prog, A, Bm, ea, eb, m, n, k, s, cplx, workspace, be, xp, backend_name, transposed, finish)
    return to_module(term, xp)
