"""The fused CPU interpreter of residue programs: each block of tensors from the float64 load to the store in cache.

The step-by-step executor (:mod:`rnstensor.program.execute`) runs a chain
one primitive at a time: every pass streams all residue planes of the whole
batch through memory and back, and each step pays Python's dispatch. Here
the same kernels run per *block* of ``nb`` tensors (a few thousand entries,
every plane of them in L1/L2): the tensor's exponent (its largest magnitude,
as :func:`~rnstensor.encode.group_exponents` takes it), the encode, every
mode product, drop and base extension, and the decode, before the next block
is loaded. Blocks are split across the backend's threads.

The blocks are the batch cut into pieces, and every step is the CPU
backend's own per-block code (``_encode_block``, ``_product_direct``,
``_drop_extend_block``, ``_decode_*_block``) on the same integers: a
tensor's residues and its decode do not depend on which other tensors share
its block, so the results are bitwise those of the step-by-step run.

The program is read through :func:`rnstensor.ir.lower.program_stages`,
the fused kernels' view of a residue program (the CUDA kernel's packer reads
the same view), and packed here into flat tables (:class:`CpuChainProgram`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
from numba import njit

from ... import arith
from . import common, decoding, drop_extend, encoding, products

__all__ = ["CpuChainProgram", "cpu_compile", "run_chain", "scratch_bytes", "tensor_exponents", "BLOCK_ENTRIES"]

#: entries a block aims for: every plane of two or three live tensors stays within L2
BLOCK_ENTRIES = 4096
# record fields (int64 rows of _REC): kind, out slot, in slot, planes, then per kind
_REC = 16
_PRODUCT, _DROP, _STACK, _HADAMARD = 0, 1, 2, 3
#: the most terms one output of a stage sums (the FEM Poisson operator's metric rows: 3)
TERMS_MAX = 3
_INF_BITS = 0x7FF0000000000000


@dataclass(frozen=True, eq=False)
class CpuChainProgram:
    """A residue program packed for :func:`run_chain`: its records, tables and the decode's scale.

    ``rec`` holds one row per product, drop, stack (the terms of a sum of
    mode products side by side along the contracted axis) or Hadamard
    product; ``ops`` the products' operator residues (int8), ``tabi``/``tabf``
    the drops' tables, each table named by a row of ``tdir`` (kind, offset,
    rows, columns). ``dexp`` is the exponent of every output entry for an
    input (and field) encoded with ``e = 0``; ``factor`` the output's
    integer factor; ``nfield``/``nq`` the field components per tensor and
    their entries (0 where the program has no Hadamard product).
    """

    rec: np.ndarray
    ops: np.ndarray
    tabi: np.ndarray
    tabf: np.ndarray
    tdir: np.ndarray
    in_shape: tuple
    out_shape: tuple
    bits: int
    first: tuple
    final_active: tuple
    final_slot: int
    nslots: int
    lmax: int
    emax: int
    nb: int
    dexp: np.ndarray
    factor: int
    nfield: int = 0
    nq: int = 0


def cpu_compile(request) -> CpuChainProgram:
    """The fused CPU program of a :class:`~rnstensor.ir.lower.FusionRequest` (a chain plan's, an einsum's mode
    chains', a FEM operator's: only the residue program is read), packed. Not cached: the front end keeps it.

    A FEM operator's Hadamard products read its encoded field per element
    (``(planes, B, request.ncomp, request.nq)`` int8), which :func:`run_chain`
    takes with its exponents.

    Raises
    ------
    ValueError
        If the program has a step the fused interpreter does not run (the reason).
    """
    from ...kernels.layout import KERNEL  # noqa: PLC0415 - the same sum limit as the CUDA kernel

    prog = request.stages(max_terms=KERNEL["TMAX"])
    return _pack(prog, request.ncomp, request.nq)


def _pack(prog, nfield: int, nq: int) -> CpuChainProgram:
    """The lowered program ``prog`` (:class:`rnstensor.ir.lower.Program`) as :func:`run_chain`'s tables."""
    from ...ir.lower import SlotPool, last_uses  # noqa: PLC0415

    in_shape = prog.in_shape
    basis = tuple(prog.basis)
    rec: list = []
    ops: list = []
    nops = [0]
    tabi: list = []
    tabf: list = []
    tdir: list = []
    sizes = {"i": 0, "f": 0}

    def table(a) -> int:
        """Table ``a`` (int64, or float32 1-D or 2-D) appended; its directory row."""
        a = np.asarray(a)
        kind = "i" if a.dtype.kind in "iu" else "f"
        rows, cols = (a.shape[0], a.shape[1]) if a.ndim == 2 else (a.size, 0)
        (tabi if kind == "i" else tabf).append(a.reshape(-1).astype(np.int64 if kind == "i" else np.float32))
        tdir.append((0 if kind == "i" else 1, sizes[kind], rows, cols))
        sizes[kind] += a.size
        return len(tdir) - 1

    def record(*fields) -> None:
        rec.append(list(fields) + [0] * (_REC - len(fields)))

    def add_op(a: np.ndarray) -> int:
        off = nops[0]
        ops.append(np.ascontiguousarray(a, np.int8).reshape(-1))
        nops[0] += a.size
        return off

    # slots: a tensor lives from the stage that writes it to the last stage that reads it
    last_use = last_uses(prog)
    slot_of = {0: 0}
    pool = SlotPool()
    alloc = pool.alloc

    shapes = {0: tuple(in_shape)}
    lmax, emax = len(prog.first), math.prod(in_shape)
    tensor_max = emax  # the largest tensor, which sizes the block (emax: the largest slot, a stack of terms too)
    for k, st in enumerate(prog.stages):
        L = len(st.active)
        lmax = max(lmax, L, len(st.drop_active))
        red = [table(a) for a in common._mod_consts(tuple(st.active))[:3]][0]
        in_slots = [slot_of[i] for i in st.inputs]
        dead = [s for i, s in zip(st.inputs, in_slots) if last_use[i] == k]
        if st.dropped:
            order = arith.drop_order(tuple(st.drop_active), tuple(st.dropped))
            tabs, out_active = drop_extend._drop_plan(tuple(st.drop_active), basis, tuple(order), bool(prog.extend))
            if tuple(out_active) != tuple(st.active):
                raise AssertionError(f"drop tables give planes {out_active}, the program {st.active}")
            t0 = [table(a) for a in tabs][0]
            dropped = []
            for i, s_in in zip(st.inputs, in_slots):
                s_out = alloc()
                record(_DROP, s_out, s_in, L, math.prod(shapes[i]), t0, len(st.drop_active))
                dropped.append(s_out)
            pool.release(dead)
            dead = dropped
            in_slots = dropped
        for terms, oid in zip(st.outputs, st.out_ids):
            if len(terms) > TERMS_MAX:
                raise ValueError(f"a sum of {len(terms)} terms (the fused CPU interpreter adds at most {TERMS_MAX})")
            s_out = alloc()
            slot_of[oid] = s_out
            shp = shapes[st.inputs[terms[0].input]]
            if st.kind == "hadamard":
                if math.prod(shp) != nq:
                    raise ValueError(f"a Hadamard product of {math.prod(shp)} entries with a field of {nq}")
                fpl = table(np.array([basis.index(q) for q in st.active], np.int64))
                pairs = [v for t in terms for v in (in_slots[t.input], t.field)]
                record(_HADAMARD, s_out, in_slots[terms[0].input], L, nq, red, fpl, len(terms), *pairs)
                shapes[oid] = shp
                continue
            _, n_out, n_in = terms[0].op.shape
            pre, post = math.prod(shp[: st.axis]), math.prod(shp[st.axis + 1:])
            src = in_slots[terms[0].input]
            if len(terms) > 1:
                # a sum of mode products along one axis: the inputs side by side along it, times the operators side
                # by side, is one product over all their terms (exact in float32 while <= _DIRECT_MAX_K terms)
                if len(terms) * n_in > common._DIRECT_MAX_K:
                    raise ValueError(f"a sum of {len(terms)} mode products over {n_in} points "
                                     f"(the fused CPU interpreter sums at most {common._DIRECT_MAX_K} terms)")
                src = alloc()
                record(_STACK, src, 0, L, pre, n_in, post, len(terms), *(in_slots[t.input] for t in terms))
                emax = max(emax, len(terms) * math.prod(shp))
                op = np.concatenate([t.op for t in terms], axis=2)
                pool.release([src])  # free once the product below has read it
            else:
                op = terms[0].op
                if n_in > common._DIRECT_MAX_K:
                    raise ValueError(f"an operator has more than {common._DIRECT_MAX_K} columns (its products go "
                                     f"through BLAS)")
            record(_PRODUCT, s_out, src, L, pre, op.shape[2], post, n_out, add_op(op), red)
            shapes[oid] = shp[: st.axis] + (n_out,) + shp[st.axis + 1:]
            emax = max(emax, math.prod(shapes[oid]))
            tensor_max = max(tensor_max, math.prod(shapes[oid]))
        pool.release(dead)
    if not rec:
        raise ValueError("a program without a product")
    nb = max(1, BLOCK_ENTRIES // max(tensor_max, 1))
    arrays = dict(
        rec=np.array(rec, np.int64).reshape(-1, _REC),
        ops=np.concatenate(ops).astype(np.int8) if ops else np.zeros(1, np.int8),
        tabi=np.concatenate(tabi) if tabi else np.zeros(1, np.int64),
        tabf=np.concatenate(tabf) if tabf else np.zeros(1, np.float32),
        tdir=np.array(tdir, np.int64).reshape(-1, 4),
        dexp=np.ascontiguousarray(prog.dexp.reshape(-1), np.int64),
    )
    for a in arrays.values():
        a.setflags(write=False)
    return CpuChainProgram(in_shape=tuple(in_shape), out_shape=shapes[prog.final], bits=int(prog.bits),
                           first=tuple(prog.first), final_active=tuple(prog.final_active),
                           final_slot=slot_of[prog.final], nslots=pool.count, lmax=lmax, emax=emax, nb=nb,
                           factor=int(prog.factor), nfield=nfield, nq=nq, **arrays)


def scratch_bytes(program: CpuChainProgram) -> int:
    """The working memory :func:`run_chain` holds per thread beyond its input and output: the block's residue
    slots and the per-block scratch of the encode, drops and decode (numba's allocator, outside tracemalloc)."""
    BL = common._BLOCK
    slots = program.nslots * (-(-(program.lmax * program.emax * program.nb) // 64) * 64)
    m = len(program.final_active)
    per_block = (program.emax * program.nb * 8  # exponents
                 + BL * (3 * 8 + 4) + 2 * 64 * BL * 4 + 64 * BL  # encode, drops
                 + m * BL * 4 + 6 * BL * 8)  # decode (fp64 and exact, the larger of the two)
    return slots + per_block


def run_chain(program: CpuChainProgram, x: np.ndarray, decode: str, field: Optional[np.ndarray] = None,
              fexp: Optional[np.ndarray] = None) -> np.ndarray:
    """``x`` ``(B, *program.in_shape)`` (finite float64) through the whole program, block by block, decoded.

    A program with Hadamard products (a FEM operator's) reads tensor ``b``'s
    field from ``field[:, b]`` (``(basis planes, B, program.nfield,
    program.nq)`` int8, :func:`rnstensor.fem.fused.operator_field`), its
    exponent from ``fexp[b]``. The result ``(B, *program.out_shape)`` is
    bitwise the step-by-step execution's with the same decode (``'fp64'`` or
    ``'exact'``).
    """
    if decode not in ("fp64", "exact"):
        raise ValueError(f"decode must be 'fp64' or 'exact'; got {decode!r}")
    x = np.require(np.asarray(x, dtype=np.float64), requirements="C")
    B = x.shape[0]
    if tuple(x.shape[1:]) != tuple(program.in_shape):
        raise ValueError(f"x must be (B, {', '.join(map(str, program.in_shape))}); got {x.shape}")
    if program.nfield:
        if field is None or fexp is None:
            raise ValueError("this program multiplies by a field: pass field= and fexp=")
        field = np.require(field, np.int8, "C")
        fexp = np.require(fexp, np.int64, "C").reshape(-1)
        if field.ndim != 4 or field.shape[1:] != (B, program.nfield, program.nq) or fexp.shape != (B,):
            raise ValueError(f"field must be (planes, {B}, {program.nfield}, {program.nq}) and fexp ({B},); "
                             f"got {field.shape} and {fexp.shape}")
    else:
        field, fexp = np.zeros((1, 1, 1, 1), np.int8), np.zeros(1, np.int64)
    nin, nout = math.prod(program.in_shape), math.prod(program.out_shape)
    out = np.empty((B, nout), np.float64)
    if B == 0:
        return out.reshape((0,) + program.out_shape)
    first = program.first
    # the encode: k = ef - 1075 + e <= bits - 53 + 1 for every entry (e = bits - E of its tensor)
    width = max(program.bits - 51, 1)
    tab, pa, per, c24 = encoding._pow2_tables(first, 1 << width.bit_length())
    pf, ipf, hf = common._mod_consts(first)[3:]
    dtabs, nl = decoding._decode_plan(program.final_active)
    perm, C, qf, qip, qh, qd = dtabs
    if decode == "fp64":
        f, g, k = arith.float_factor(program.factor)
        flimbs, t2, fsign = np.ones(1, np.int64), 0, 1
    else:
        f, g, k = 1.0, 0.0, 0
        flimbs, t2, fsign = decoding._factor_limbs(program.factor)
    xi = common._ro(x.reshape(B, nin).view(np.int64))
    nblk = -(-B // program.nb)
    args = (xi, program.rec, program.ops, program.tabi, program.tabf, program.tdir, program.bits,
            pf, ipf, hf, c24, tab, pa, per, perm, C, qf, qip, qh, qd, program.dexp,
            decode == "exact", float(f), float(g), int(k), int(t2), flimbs, int(fsign), int(nl), common._P2,
            program.nb, program.nslots, program.lmax, program.emax, program.final_slot, common._ro(field),
            common._ro(fexp), program.nfield > 0, out)
    common._launch(_chain_blocks, nblk, B * nin * len(first) * 8, *args)
    return out.reshape((B,) + program.out_shape)


def tensor_exponents(x: np.ndarray, bits: int) -> np.ndarray:
    """``group_exponents(x, bits, shared=all but the first axis)`` of a float64 ``x``, as ``(B,)`` int64: the
    exponent each tensor is encoded with, in one threaded pass (numpy's value for inf and NaN too)."""
    x = np.require(np.asarray(x, dtype=np.float64), requirements="C")
    B = x.shape[0]
    et = np.empty(B, np.int64)
    if B:
        common._launch(_exponent_rows, -(-B // 64), x.size, common._ro(x.reshape(B, -1).view(np.int64)), int(bits), et)
    return et


@njit(cache=True, nogil=True)
def _exponent_rows(xi, bits, et, task0, task1):
    B = xi.shape[0]
    for t in range(task0, task1):
        b0 = 64 * t
        _tensor_exponents(xi, b0, min(64, B - b0), bits, et[b0:])


# ----- the kernel ---------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _tensor_exponents(xi, t0, nt, bits, et):
    # et[t] = bits - E, 2**(E-1) <= max|x| < 2**E over tensor t0 + t (0 where it is all zeros): group_exponents'
    # integer, from the IEEE fields (a subnormal maximum by its leading bit). The largest magnitude's bits are
    # the largest bits: a NaN's exceed inf's (numpy's maximum is NaN, exponent 0), inf's every finite one's
    # (frexp(inf) = (inf, 0): exponent bits)
    nin = xi.shape[1]
    for t in range(nt):
        row = xi[t0 + t]
        m = np.int64(0)
        for i in range(nin):
            a = row[i] & 0x7FFFFFFFFFFFFFFF
            m = max(m, a)
        if m == 0 or m > _INF_BITS:
            et[t] = 0
            continue
        if m == _INF_BITS:
            et[t] = bits
            continue
        ef = m >> 52
        if ef > 0:
            E = ef - 1022
        else:
            E = common._bitlen(np.int64(m >> 32)) + 32 - 1074 if m >= (np.int64(1) << 32) else common._bitlen(m) - 1074
        et[t] = bits - E


@njit(cache=True, nogil=True)
def _tab(tdir, tabf, j):
    # the 2-D float32 table j of the directory (_itab, _ftab: 1-D int64 and float32 tables)
    off, rows, cols = tdir[j, 1], tdir[j, 2], tdir[j, 3]
    return tabf[off: off + rows * cols].reshape(rows, cols)


@njit(cache=True, nogil=True)
def _itab(tdir, tabi, j):
    off, n = tdir[j, 1], tdir[j, 2]
    return tabi[off: off + n]


@njit(cache=True, nogil=True)
def _ftab(tdir, tabf, j):
    off, n = tdir[j, 1], tdir[j, 2]
    return tabf[off: off + n]


@njit(cache=True, nogil=True)
def _chain_blocks(xi, rec, ops, tabi, tabf, tdir, bits, pf, ipf, hf, c24, pw, pa, pper, perm, C, qf, qip, qh, qd,
                  dexp, exact, f, g, k, eadd, flimbs, fsign, nl40, p2, nb, nslots, lmax, emax, final_slot, field, fexp,
                  has_field, out, task0, task1):
    B, nin = xi.shape
    nout = out.shape[1]
    BL = common._BLOCK
    cap = (lmax * emax * nb + 63) // 64 * 64  # every slot starts on a cache line (the word moves read int64)
    S = np.zeros((nslots, cap), np.int8)
    et = np.empty(nb, np.int64)
    eb = np.empty(emax * nb, np.int64)  # the exponent of every entry of the block
    hi = np.empty(BL, np.float64)
    lo = np.empty(BL, np.float64)
    kb = np.empty(BL, np.int64)
    acc = np.empty(BL, np.float32)
    # drop scratch (at most 49 planes)
    Dd = np.empty((64, BL), np.float32)
    Dm = np.empty((64, BL), np.float32)
    Y = np.empty((64, BL), np.int8)
    # decode scratch
    m = perm.size
    D = np.empty((m, BL), np.float32)
    V = np.empty(BL, np.float64)
    Vl = np.empty(BL, np.float64)
    Vc = np.empty(BL, np.float64)
    Sw = np.empty(BL, np.int64)
    n30 = (40 * nl40 + 29) // 30
    V30 = np.zeros(n30, np.int64)
    P30 = np.zeros(n30 + flimbs.size + 1, np.int64)
    sgn = np.empty(BL, np.float64)
    carry = np.empty(BL, np.float64)
    Vf = np.empty((nl40, BL), np.float64)
    Rr = np.empty((decoding.ROUND_ROWS, BL), np.int64)
    L0 = pf.size
    Lf = perm.size
    for blk in range(task0, task1):
        t0 = blk * nb
        nt = min(nb, B - t0)
        _tensor_exponents(xi, t0, nt, bits, et)
        # the encode: tensor-major entries of the block, as the batch is laid out
        W = nt * nin
        X0 = S[0, : L0 * W].reshape(L0, W)
        xb = xi[t0: t0 + nt].reshape(-1)
        for t in range(nt):
            e_t = et[t]
            eb_t = eb[t * nin: (t + 1) * nin]
            for i in range(nin):
                eb_t[i] = e_t
        for c0 in range(0, W, BL):
            w = min(BL, W - c0)
            # (V and Vl, the decode's float64 scratch, hold the wide encode's multipliers until then)
            encoding._encode_block(xb[c0: c0 + w], eb[c0: c0 + w], hi, lo, kb, X0, c0, w, pf, ipf, hf, c24, pw, pa,
                                   pper, V, Vl)
        for r in range(rec.shape[0]):
            so, si, L = rec[r, 1], rec[r, 2], rec[r, 3]
            if rec[r, 0] == _PRODUCT:
                pre, n_in, post, n_out, oo = rec[r, 4], rec[r, 5], rec[r, 6], rec[r, 7], rec[r, 8]
                pre_b = pre * nt
                Xp = S[si, : L * pre_b * n_in * post].reshape(L, pre_b, n_in, post)
                Op = S[so, : L * pre_b * n_out * post].reshape(L, pre_b, n_out, post)
                A = ops[oo: oo + L * n_out * n_in].reshape(L, n_out, n_in)
                red = rec[r, 9]
                pf32, ip32, h32 = _ftab(tdir, tabf, red), _ftab(tdir, tabf, red + 1), _ftab(tdir, tabf, red + 2)
                Ba, tw, ntasks = products._product_tasks(L, pre_b, n_in, post)  # as CpuBackend.product lays them out
                products._product_direct(A, Xp, pf32, ip32, h32, Op, Ba, tw, 0, ntasks)
            elif rec[r, 0] == _STACK:
                _stack(S, rec[r], nt)
            elif rec[r, 0] == _HADAMARD:
                _hadamard(S, rec[r], nt, field, t0, _ftab(tdir, tabf, rec[r, 5]), _ftab(tdir, tabf, rec[r, 5] + 1),
                          _ftab(tdir, tabf, rec[r, 5] + 2), _itab(tdir, tabi, rec[r, 6]))
            elif rec[r, 0] == _DROP:
                ne, j, Lin = rec[r, 4], rec[r, 5], rec[r, 6]
                W = ne * nt
                Xd = S[si, : Lin * W].reshape(Lin, W)
                Od = S[so, : L * W].reshape(L, W)
                dperm, A2 = _itab(tdir, tabi, j), _tab(tdir, tabf, j + 1)
                for c0 in range(0, W, BL):
                    w = min(BL, W - c0)
                    drop_extend._drop_extend_block(
                        Xd, c0, w, dperm, A2, _ftab(tdir, tabf, j + 2), _ftab(tdir, tabf, j + 3),
                        _ftab(tdir, tabf, j + 4), _itab(tdir, tabi, j + 5), _ftab(tdir, tabf, j + 6),
                        _tab(tdir, tabf, j + 7), _ftab(tdir, tabf, j + 8), _ftab(tdir, tabf, j + 9),
                        _ftab(tdir, tabf, j + 10), _itab(tdir, tabi, j + 11), _tab(tdir, tabf, j + 12),
                        _ftab(tdir, tabf, j + 13), _ftab(tdir, tabf, j + 14), _ftab(tdir, tabf, j + 15),
                        _itab(tdir, tabi, j + 16), _tab(tdir, tabf, j + 17), _ftab(tdir, tabf, j + 18),
                        _ftab(tdir, tabf, j + 19), _ftab(tdir, tabf, j + 20), Od, Dd, Dm, Y, acc)
        # the decode, into the block's rows of the output
        W = nt * nout
        Xf = S[final_slot, : Lf * W].reshape(Lf, W)
        ob = out[t0: t0 + nt].reshape(-1)
        for t in range(nt):
            e_t = et[t] - (fexp[t0 + t] if has_field else 0)  # the field's exponent adds to the output's
            eb_t = eb[t * nout: (t + 1) * nout]
            for i in range(nout):
                eb_t[i] = dexp[i] - e_t
        for c0 in range(0, W, BL):
            w = min(BL, W - c0)
            if exact:
                decoding._decode_exact_block(Xf, c0, w, perm, C, qf, qip, qh, qd, eb[c0: c0 + w], eadd, flimbs, fsign,
                                             p2, ob[c0: c0 + w], V30, P30, D, acc, sgn, carry, Vf, Rr)
            else:
                decoding._decode_fp64_block(Xf, c0, w, perm, C, qf, qip, qh, qd, f, g, eb[c0: c0 + w], k, p2,
                                            ob[c0: c0 + w], V, Vl, Vc, D, acc, Sw)


@njit(cache=True, nogil=True)
def _stack(S, rc, nt):
    # the terms' inputs side by side along the contracted axis: out (L, pre nt, terms n_in, post) from the
    # inputs (L, pre nt, n_in, post), slots rc[8 ...]
    so, L, pre, n_in, post, nterms = rc[1], rc[3], rc[4], rc[5], rc[6], rc[7]
    pre_b = pre * nt
    run = n_in * post
    O = S[so, : L * pre_b * nterms * run].reshape(L, pre_b, nterms * run)
    for i in range(nterms):
        X = S[rc[8 + i], : L * pre_b * run].reshape(L, pre_b, run)
        for l in range(L):
            for a in range(pre_b):
                O[l, a, i * run: (i + 1) * run] = X[l, a]


@njit(cache=True, nogil=True)
def _hadamard(S, rc, nt, field, t0, pf, ipf, hf, fplane):
    # out = [sum of the terms' input times its field component]_p, entry by entry: tensor t of the block reads
    # the field of tensor t0 + t; terms (slot, component) from rc[8]. At most 3 terms of <= 2**14: exact
    so, L, nq, nterms = rc[1], rc[3], rc[4], rc[7]
    W = nt * nq
    O = S[so, : L * W].reshape(L, nt, nq)
    X0 = S[rc[8], : L * W].reshape(L, nt, nq)
    X1 = S[rc[10 if nterms > 1 else 8], : L * W].reshape(L, nt, nq)
    X2 = S[rc[12 if nterms > 2 else 8], : L * W].reshape(L, nt, nq)
    c0, c1, c2 = rc[9], rc[11], rc[13]
    for l in range(L):
        p, ip, h = pf[l], ipf[l], hf[l]
        fl = fplane[l]
        for t in range(nt):
            F = field[fl, t0 + t]
            x0, x1, x2, o = X0[l, t], X1[l, t], X2[l, t], O[l, t]
            F0 = F[c0]
            if nterms == 1:
                for q in range(nq):
                    o[q] = np.int8(common._cr32(np.float32(x0[q]) * np.float32(F0[q]), p, ip, h))
            else:
                F1 = F[c1]
                F2 = F[c2] if nterms > 2 else F[c1]
                w2 = np.float32(1.0 if nterms > 2 else 0.0)
                for q in range(nq):
                    acc = (np.float32(x0[q]) * np.float32(F0[q]) + np.float32(x1[q]) * np.float32(F1[q])
                           + w2 * (np.float32(x2[q]) * np.float32(F2[q])))
                    o[q] = np.int8(common._cr32(acc, p, ip, h))
