"""The CPU backend's class: the backend contract on numpy layout, float32 BLAS and the numba kernels of this package."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import numpy as np

from ... import arith
from ...arrays import default_workspace_bytes
from ...basis import Basis, mrc_order
from .. import NumpyBackend, elementwise_shape, matmul_shape, product_layout
from .common import (_BLAS_CHUNK, _BLOCK, _CHUNK, _DIRECT_MAX_K, _P2, _exponent_runs, _launch, _mod_consts,
                     _nthreads, _ro)
from .decoding import _decode_exact_kernel, _decode_fp64_kernel, _decode_plan, _digits_kernel, _factor_limbs
from .drop_extend import _drop_extend_kernel, _drop_plan
from .encoding import _encode_kernel, _pow2_tables
from .products import _elementwise, _product_direct, _product_tasks, _reduce_swap
from . import wide as wide_engine
from .warm import warm

_REFERENCE = NumpyBackend()  # the path of a small call on a cold kernel (warm.py): the same bits

__all__ = ["CpuBackend", "ExactProduct", "FUSED_ALONE_MAX"]

#: entries of a tensor from which the fused interpreter, given fewer tensors than threads, runs slower than the
#: step-by-step passes (between 16**3, faster fused alone, and 32**3, slower: CpuBackend.fuses)
FUSED_ALONE_MAX = 16384


# ----- the backend --------------------------------------------------------------------------


def _exact_matmul(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``left @ right`` of int8 matrices, exactly: float32 GEMM per chunk of <= 1024 terms, chunks summed in float64."""
    n = left.shape[1]
    if n <= _BLAS_CHUNK:
        return left.astype(np.float32) @ right.astype(np.float32)
    acc = None
    for c0 in range(0, n, _BLAS_CHUNK):
        c1 = min(c0 + _BLAS_CHUNK, n)
        y = left[:, c0:c1].astype(np.float32) @ right[c0:c1].astype(np.float32)
        acc = y.astype(np.float64) if acc is None else acc + y
    return acc


def _planes_2d(planes: np.ndarray, L: int) -> tuple[np.ndarray, tuple[int, ...]]:
    planes = np.asarray(planes)
    if planes.dtype != np.int8:
        raise TypeError(f"planes must be int8; got {planes.dtype}")
    if planes.ndim < 1 or planes.shape[0] != L:
        raise ValueError(f"planes must have shape (L, ...) with L = {L}; got {planes.shape}")
    shape = planes.shape[1:]
    return _ro(np.ascontiguousarray(planes).reshape(L, math.prod(shape))), shape


class CpuBackend:
    """Fused numba kernels with numpy layout and float32 BLAS; bit-identical to :class:`NumpyBackend`."""

    name = "cpu"
    xp = np  # the array module it computes with

    # ----- encode -------------------------------------------------------------------------

    def constants(self, key, make):
        """Host tables as they are (see the backend contract)."""
        return make()

    def encode(self, x: np.ndarray, exponent: np.ndarray, moduli: Sequence[int], bits: int) -> np.ndarray:
        # not ascontiguousarray: it would turn a 0-d x into shape (1,)
        x = np.require(np.asarray(x, dtype=np.float64), requirements="C")
        mods = tuple(int(p) for p in moduli)
        out = np.empty((len(mods),) + x.shape, np.int8)
        ev, inner = _exponent_runs(exponent, x.shape)
        if not mods or x.size == 0:
            return out
        if not warm(_encode_kernel, x.size * len(mods)):
            return _REFERENCE.encode(x, exponent, mods, bits)
        # k = ef - 1075 + e <= 971 + max(e): size the direct [2^k]_p table for that
        width = 971 + int(ev.max()) + 1
        width = 1 << max(width, 1).bit_length() if width <= 8192 else 256
        tab, pa, per, c24 = _pow2_tables(mods, width)
        _, _, _, pf, ipf, hf = _mod_consts(mods)
        nblk = -(-x.size // _BLOCK)
        xi = _ro(x.reshape(-1).view(np.int64))
        args = (xi, ev, inner, pf, ipf, hf, c24, tab, pa, per, out.reshape(len(mods), -1))
        _launch(_encode_kernel, nblk, x.size * len(mods), *args)
        return out

    # ----- products -----------------------------------------------------------------------

    def product(self, op_planes: np.ndarray, planes: np.ndarray, moduli: Sequence[int], axis: int) -> np.ndarray:
        mods = tuple(int(p) for p in moduli)
        L = len(mods)
        op = np.ascontiguousarray(op_planes)
        X = np.ascontiguousarray(planes)
        if op.dtype != np.int8 or X.dtype != np.int8:
            raise TypeError(f"product: op_planes and planes must be int8; got {op.dtype} and {X.dtype}")
        axis, n_out, n_in, pre, post, oshape = product_layout(op.shape, X.shape, L, axis)
        out = np.empty((L,) + oshape, np.int8)
        if out.size == 0:
            return out
        if n_in == 0:
            out[...] = 0
            return out
        if not warm(_product_direct if n_in <= _DIRECT_MAX_K else _reduce_swap, out.size * n_in):
            return _REFERENCE.product(op, X, mods, axis)
        X4 = X.reshape(L, pre, n_in, post)
        O4 = out.reshape(L, pre, n_out, post)
        pf32, ip32, h32, pf, ipf, hf = _mod_consts(mods)
        if n_in <= _DIRECT_MAX_K:
            Ba, tw, ntasks = _product_tasks(L, pre, n_in, post)
            _launch(_product_direct, ntasks, out.size * n_in, _ro(op), _ro(X4), pf32, ip32, h32, O4, Ba, tw)
            return out
        for l in range(L):
            if post == 1:
                # rows of the tensor times the operator's transpose: no transposed copy
                Y = _exact_matmul(X4[l, :, :, 0], op[l].T)
                Y3, O3 = _ro(Y.reshape(1, pre, n_out)), O4[l].reshape(pre, 1, n_out)
                _launch(_reduce_swap, pre, Y.size, Y3, O3, pf[l], ipf[l], hf[l])
            else:
                Y = _exact_matmul(op[l], X4[l].transpose(1, 0, 2).reshape(n_in, pre * post))
                Y3 = _ro(Y.reshape(n_out, pre, post))
                _launch(_reduce_swap, pre * n_out, Y.size, Y3, O4[l], pf[l], ipf[l], hf[l])
        return out

    def matmul(self, a_planes: np.ndarray, b_planes: np.ndarray, moduli: Sequence[int]) -> np.ndarray:
        mods = tuple(int(p) for p in moduli)
        L = len(mods)
        a, b = np.asarray(a_planes), np.asarray(b_planes)
        if a.dtype != np.int8 or b.dtype != np.int8:
            raise TypeError(f"matmul: planes must be int8; got {a.dtype} and {b.dtype}")
        batch, M, K, N = matmul_shape(a.shape, b.shape, L)
        out = np.empty((L,) + batch + (M, N), np.int8)
        if out.size == 0:
            return out
        if K == 0:
            out[...] = 0
            return out
        if not warm(_reduce_swap, out.size * K):
            return _REFERENCE.matmul(a, b, mods)
        pf, ipf, hf = _mod_consts(mods)[3:]
        rows = math.prod(batch) * M
        if K <= _BLAS_CHUNK:  # (one float32 GEMM a modulus: its operands and result in the kept workspace)
            self._matmul_kept(a, b, batch, M, K, N, out, pf, ipf, hf)
            return out
        for l in range(L):
            # float32 GEMMs are exact on chunks of <= 1024 terms (|r| <= 128); chunks sum exactly in float64
            acc = None
            for c0 in range(0, K, _BLAS_CHUNK):
                c1 = min(c0 + _BLAS_CHUNK, K)
                y = np.matmul(a[l, ..., c0:c1].astype(np.float32), b[l, ..., c0:c1, :].astype(np.float32))
                acc = y if acc is None else acc.astype(np.float64) + y
            Y = _ro(np.ascontiguousarray(np.broadcast_to(acc, batch + (M, N))).reshape(1, rows, N))
            _launch(_reduce_swap, rows, Y.size, Y, out[l].reshape(rows, 1, N), pf[l], ipf[l], hf[l])
        return out

    @staticmethod
    def _matmul_kept(a, b, batch, M: int, K: int, N: int, out, pf, ipf, hf) -> None:
        """:meth:`matmul` where ``K`` fits one exact float32 GEMM: each modulus' operands cast into buffers of the
        kept workspace (:func:`rnstensor.backends.cpu.gemm.release_workspace`), its product into another, the
        same three for every modulus. Fresh ones each time took new pages from the kernel, whose zeroing cost as
        much as the GEMMs on small stacks (a 64 x (100 x 60)(60 x 80) stack on 15 moduli)."""
        from . import gemm  # noqa: PLC0415 - the workspace the wide engine keeps

        sa, sb = a.shape[1:], b.shape[1:]
        rows = math.prod(batch) * M
        with gemm._arena(4 * (math.prod(sa) + math.prod(sb) + rows * N)) as ws:
            a32, b32, y = ws.take(sa, np.float32), ws.take(sb, np.float32), ws.take(batch + (M, N), np.float32)
            Y = _ro(y.reshape(1, rows, N))
            for l in range(out.shape[0]):
                np.copyto(a32, a[l])
                np.copyto(b32, b[l])
                np.matmul(a32, b32, out=y)
                _launch(_reduce_swap, rows, Y.size, Y, out[l].reshape(rows, 1, N), pf[l], ipf[l], hf[l])

    # ----- elementwise --------------------------------------------------------------------

    def _elementwise(self, a, b, moduli, mode, what):
        mods = tuple(int(p) for p in moduli)
        L = len(mods)
        a = np.asarray(a)
        b = np.asarray(b)
        if a.dtype != np.int8 or b.dtype != np.int8:
            raise TypeError(f"{what}: residue planes must be int8; got {a.dtype} and {b.dtype}")
        shape = elementwise_shape(a.shape, b.shape, L, mode, what)
        sa, sb = a.shape[1:], b.shape[1:]
        out = np.empty((L,) + shape, np.int8)
        if out.size == 0:
            return out
        if not warm(_elementwise, out.size):
            return (_REFERENCE.hadamard(a, b, mods) if mode == 0 else _REFERENCE.add(a, b, mods, mode == 2))
        nd = len(shape)
        sbp = (1,) * (nd - len(sb)) + sb
        # the longest suffix b shares with the result, everything before it size 1
        k = nd
        while k > 0 and sbp[k - 1] == shape[k - 1]:
            k -= 1
        inner = math.prod(shape[k:])
        if sa == shape and all(d == 1 for d in sbp[:k]) and (inner >= 256 or inner == math.prod(shape)):
            A3 = np.ascontiguousarray(a).reshape(L, -1, inner)
            B2 = np.ascontiguousarray(b).reshape(L, inner)
        else:
            # per-plane broadcasting: align the entry dims, not the plane axis
            sap = (1,) * (nd - len(sa)) + sa
            A3 = np.ascontiguousarray(np.broadcast_to(a.reshape((L,) + sap), out.shape)).reshape(L, 1, -1)
            B2 = np.ascontiguousarray(np.broadcast_to(b.reshape((L,) + sbp), out.shape)).reshape(L, -1)
        pf, ipf, hf = _mod_consts(mods)[:3]
        ntasks = A3.shape[0] * A3.shape[1] * -(-A3.shape[2] // _CHUNK)
        _launch(_elementwise, ntasks, out.size, _ro(A3), _ro(B2), pf, ipf, hf, mode, out.reshape(A3.shape))
        return out

    def hadamard(self, planes: np.ndarray, field_planes: np.ndarray, moduli: Sequence[int]) -> np.ndarray:
        return self._elementwise(planes, field_planes, moduli, 0, "hadamard")

    def add(self, a: np.ndarray, b: np.ndarray, moduli: Sequence[int], subtract: bool = False) -> np.ndarray:
        return self._elementwise(a, b, moduli, 2 if subtract else 1, "add")

    # ----- drop and base extension --------------------------------------------------------

    def drop_extend(self, planes: np.ndarray, active: Sequence[int], basis: Basis, drops, extend: bool):
        active = tuple(int(p) for p in active)
        if isinstance(drops, (int, np.integer)) and drops < 0:
            raise ValueError(f"drop_extend: drops must be a non-negative count or a tuple of moduli; got {drops}")
        order = arith.drop_order(active, drops)
        X, shape = _planes_2d(planes, len(active))
        if not order and not extend:
            return X.reshape((len(active),) + shape).copy(), active
        if len(order) >= len(active) or X.shape[1] == 0 or not warm(_drop_extend_kernel, X.size * 4):
            return arith.drop_extend_ref(planes, active, basis, drops, extend)
        tabs, out_active = _drop_plan(active, tuple(basis.moduli), order, bool(extend))
        out = np.empty((len(out_active), X.shape[1]), np.int8)
        _launch(_drop_extend_kernel, -(-X.shape[1] // _BLOCK), X.size * 4, X, *tabs, out)
        return out.reshape((len(out_active),) + shape), out_active

    # ----- whole programs -----------------------------------------------------------------

    def exact_gemm(self, program, a: np.ndarray, b: np.ndarray, ea: np.ndarray, eb: np.ndarray, workspace_bytes: int):
        """The two-operand program ``gemm_program`` (real, or complex 3M) on wide moduli in float64 BLAS, or ``None``.

        Taken where it should be faster than the INT8 product (by shape and
        width, :func:`rnstensor.backends.cpu.gemm.prefers_wide`, or as
        ``gemm.ENGINE`` says) and its planes fit ``workspace_bytes``; the
        same integers and the same correctly rounded decode, so the same bits.
        """
        from . import gemm  # noqa: PLC0415 - the engine's kernels compile on first use

        if gemm.ENGINE == "int8" or len(program.steps) != 4:
            return None
        enc_a, enc_b, product, dec = program.steps
        want = ("ckj", "cij") if program.complex else ("kj", "ij")
        if (enc_b.labels, product.labels) != want or dec.mode != "exact":
            return None
        alpha = complex(dec.alpha) if program.complex else complex(dec.alpha).real
        if not (math.isfinite(alpha.real) and math.isfinite(alpha.imag)):
            return None
        wide = self._wide(a.shape[0], b.shape[1], a.shape[1], len(program.basis), product.bound, program.complex,
                          workspace_bytes)
        return None if wide is None else gemm.exact_gemm(a, b, ea, eb, product.bound, alpha, *wide)

    def exact_gemm_shared(self, programs: list, As: list, eas: list, Bm: np.ndarray, ebs: list, shifts: list,
                          workspace_bytes: int) -> Optional[list]:
        """:meth:`exact_gemm` of each real ``programs[g]`` (``gemm_program``, alpha 1, the narrowest width first)
        on ``As[g]`` and one shared ``Bm`` whose exponents ``ebs[g]`` are ``ebs[0] + shifts[g]``, ``Bm``'s residues
        made once (:func:`rnstensor.backends.cpu.gemm.exact_gemm_shared`), on the wide moduli of the widest; the
        same integers and decode, so each product's bits. A wider product is lifted from the narrowest where it
        has at most ``k`` rows (the lift touches each of its results, a fresh encode each entry of ``Bm``: each
        costs a few operations per residue); ``None`` for a product left alone, or for all where the engine
        would not take the widest product."""
        from . import gemm  # noqa: PLC0415

        if gemm.ENGINE == "int8" or not warm(wide_engine._lift_into, Bm.size * len(programs)):
            return None
        for prog in programs:
            steps = prog.steps if len(prog.steps) == 4 else (None,) * 4
            if prog.complex or steps[2] is None or (steps[1].labels, steps[2].labels) != ("kj", "ij") \
                    or steps[3].mode != "exact" or complex(steps[3].alpha) != 1:
                return None
        k, n = Bm.shape
        take = [g for g, (a, d) in enumerate(zip(As, shifts)) if d == 0 or a.shape[0] <= k]
        if len(take) < 2:
            return None
        bounds = [programs[g].steps[2].bound for g in take]
        wide = self._wide(sum(As[g].shape[0] for g in take), n, k, max(len(programs[g].basis) for g in take),
                          max(bounds), False, workspace_bytes)
        if wide is None:
            return None
        got = gemm.exact_gemm_shared([As[g] for g in take], Bm, [eas[g] for g in take], [ebs[g] for g in take],
                                     [shifts[g] for g in take], bounds, *wide)
        out = [None] * len(programs)
        for g, y in zip(take, got):
            out[g] = y
        return out

    def exact_product(self, a: np.ndarray, b: np.ndarray, ea: np.ndarray, eb: np.ndarray, bound: int,
                      moduli: Sequence[int], workspace_bytes: Optional[int] = None) -> Optional["ExactProduct"]:
        """The exact product of the integers ``round_half_even(a_ik 2**ea_i)`` and ``round_half_even(b_kj 2**eb_j)``
        (real, ``|c| <= bound``) taken by the wide engine, made when its residues on the INT8 ``moduli`` or its
        values are asked for (:class:`ExactProduct`); ``None`` where it should not beat the INT8 product
        (:meth:`exact_gemm`'s rule) or does not fit the workspace (default
        :func:`~rnstensor.arrays.default_workspace_bytes`). The same integers, so the INT8 product's bits."""
        wide = self._product_plan(a.shape[0], b.shape[1], a.shape[1], len(moduli), bound, workspace_bytes)
        return None if wide is None else ExactProduct(a, b, ea, eb, bound, tuple(int(p) for p in moduli), wide)

    def combine_residues(self, S: np.ndarray, moduli: Sequence[int], mam, T1, at1, mbm, mc, T2, at2, ok):
        """The exact epilogue's residues (:func:`rnstensor.run.epilogue.combined_planes`) in one threaded pass, or
        ``None`` while the kernel is cold for a small call (the caller's NumPy reference then: the same residues)."""
        from .combine import combine_kernel  # noqa: PLC0415 - compiled on first use

        L, N = S.shape
        if not warm(combine_kernel, L * N):
            return None
        out = np.empty((L, N), np.int8)
        _launch(combine_kernel, N, L * N, S, np.asarray(mam, np.int64), T1, at1, np.asarray(mbm, np.int64), mc, T2,
                at2, np.asarray(moduli, np.int64), ok, out)
        return out

    def takes_product(self, m: int, n: int, k: int, s: int, bound: int, workspace_bytes: Optional[int] = None) -> bool:
        """Whether :meth:`exact_product` takes a real ``m x k x n`` product on ``s`` INT8 moduli (its operands then
        need no INT8 planes)."""
        # (a question ahead of exact_product, which asks again: the cold-start charge is its call's)
        return self._product_plan(m, n, k, s, bound, workspace_bytes, charge=False) is not None

    def _product_plan(self, m: int, n: int, k: int, s: int, bound: int, workspace_bytes: Optional[int],
                      charge: bool = True):
        """:meth:`_wide` for :meth:`exact_product` (``None`` where the engine is switched off)."""
        from . import gemm  # noqa: PLC0415

        if gemm.ENGINE == "int8":
            return None
        return self._wide(m, n, k, s, bound, False,
                          default_workspace_bytes() if workspace_bytes is None else workspace_bytes, charge)

    @staticmethod
    def _wide(m: int, n: int, k: int, s: int, bound: int, cplx: bool, workspace_bytes: int, charge: bool = True):
        """``(wide moduli, chunk)`` where the wide engine takes an ``m x k x n`` product (instead of ``s`` INT8
        moduli) within the workspace, else ``None`` (``charge``: see :func:`~rnstensor.backends.cpu.warm.warm`)."""
        from . import gemm  # noqa: PLC0415

        if gemm.ENGINE != "wide" and not gemm.prefers_wide(m, n, k, s, bound):
            return None
        if gemm.ENGINE != "wide" and not warm(wide_engine._wide_decode, m * n * k, charge=charge):
            return None  # a small product while the engine's kernels are cold: the INT8 product, the same bits
        try:
            mods, chunk = gemm.wide_plan(k, bound)
        except ValueError:
            return None
        if gemm.wide_bytes(m, n, k, len(mods), cplx) > workspace_bytes:
            return None
        return mods, chunk

    def compile_program(self, request, decode: str):
        """``(program, None)``: a :class:`~rnstensor.ir.lower.FusionRequest` (a chain plan's, an einsum's, a FEM
        operator's residue program) packed for :meth:`chain`, or ``(None, reason)``."""
        from . import fused  # noqa: PLC0415 - loaded on first use

        try:
            return fused.cpu_compile(request), None
        except ValueError as exc:
            return None, str(exc)

    def fuses(self, program, tensors: int) -> Optional[str]:
        """Why :meth:`chain` should not run ``tensors`` tensors of ``program`` (``None``: it should). A tensor is
        one thread's block there: fewer tensors than threads, each of at least :data:`FUSED_ALONE_MAX` entries
        (past the caches), run faster step by step, whose passes thread inside a tensor (measured: one tensor of
        32**3 entries 1.3x, of 4096 x 8**3 2.3x slower fused on 2 threads; 16**3 2.4x faster fused); and a small
        call while the interpreter is cold (:mod:`~rnstensor.backends.cpu.warm`)."""
        entries = math.prod(program.in_shape)
        if tensors < _nthreads() and entries >= FUSED_ALONE_MAX:
            return (f"{tensors} tensor(s) of {entries} entries for {_nthreads()} threads: the fused interpreter runs a "
                    f"tensor on one thread, the step-by-step passes on all")
        from . import fused  # noqa: PLC0415

        # its reference is the chain step by step, a few NumPy passes per record (the demo's 11-step chain on
        # 4 x 8**3 entries: 42 ms on the reference paths)
        if not warm(fused._chain_blocks, tensors * entries, call_s=4e-3 * len(program.rec)):
            return "a small call while the fused interpreter is not compiled (its first compile takes about 18 s)"
        return None

    def chain(self, program, x: np.ndarray, decode: str, field=None, fexp=None) -> np.ndarray:
        """A whole chain, block by block in cache (:mod:`rnstensor.backends.cpu.fused`): ``x`` ``(B, *in_shape)``
        (finite) -> ``(B, *out_shape)``, bitwise the step-by-step run. A FEM operator's program reads its encoded
        ``field`` ``(planes, B, components, entries)`` int8 and the field's exponent per tensor ``fexp``."""
        from . import fused  # noqa: PLC0415

        return fused.run_chain(program, x, decode, field=field, fexp=fexp)

    # ----- decode -------------------------------------------------------------------------

    def mrc_digits(self, planes: np.ndarray, active: Sequence[int]) -> tuple[np.ndarray, tuple[int, ...]]:
        """:func:`rnstensor.arith.mrc_digits_ref` (the centered mixed-radix digits, int64, and their order) in one
        threaded pass: the decodes' digit loop. The same digits (they are unique)."""
        active = tuple(int(p) for p in active)
        X, shape = _planes_2d(planes, len(active))
        if len(active) < 2 or X.shape[1] == 0 or not warm(_digits_kernel, X.size * 4):
            return arith.mrc_digits_ref(planes, active)
        (perm, C, qf, qip, qh, _), _ = _decode_plan(active)
        out = np.empty((len(active), X.shape[1]), np.int64)
        _launch(_digits_kernel, -(-X.shape[1] // _BLOCK), X.size * 4, X, perm, C, qf, qip, qh, out)
        return out.reshape((len(active),) + tuple(shape)), mrc_order(active)

    def decode(
        self, planes: np.ndarray, active: Sequence[int], exponent: np.ndarray, factor: int, mode: str
    ) -> np.ndarray:
        active = tuple(int(p) for p in active)
        X, shape = _planes_2d(planes, len(active))
        ev, inner = _exponent_runs(exponent, shape)
        if not active or X.shape[1] == 0:
            if mode == "fp64":
                return arith.decode_fp64_ref(planes, active, exponent, factor)
            return arith.decode_exact_ref(planes, active, exponent, factor)
        if not warm(_decode_fp64_kernel if mode == "fp64" else _decode_exact_kernel, X.size * 4):
            return _REFERENCE.decode(planes, active, exponent, factor, mode)
        tabs, nl = _decode_plan(active)
        perm, C, qf, qip, qh, qd = tabs
        out = np.empty(X.shape[1], np.float64)
        if mode == "fp64":
            f, g, k = arith.float_factor(factor)
            args = (X, perm, C, qf, qip, qh, qd, float(f), float(g), ev, inner, int(k), _P2, out)
            _launch(_decode_fp64_kernel, -(-X.shape[1] // _BLOCK), X.size * 4, *args)
        else:
            factor = int(factor)
            if factor == 0:
                return np.zeros(shape, np.float64)
            flimbs, t2, fsign = _factor_limbs(factor)
            args = (X, perm, C, qf, qip, qh, qd, ev, inner, int(t2), flimbs, nl, fsign, _P2, out)
            _launch(_decode_exact_kernel, -(-X.shape[1] // _BLOCK), X.size * 16, *args)
        return out.reshape(shape)


class ExactProduct:
    """A real product the wide engine has taken (:meth:`CpuBackend.exact_product`), computed once asked for: its
    integers as residues on the INT8 moduli (:meth:`residues`: the INT8 product's planes, for the steps and decode
    that follow), or their values correctly rounded (:meth:`decoded`: the bits of those planes decoded exactly,
    made without them: a program whose last step it is and whose decode is exact)."""

    __slots__ = ("a", "b", "ea", "eb", "bound", "moduli", "wide")

    def __init__(self, a: np.ndarray, b: np.ndarray, ea: np.ndarray, eb: np.ndarray, bound: int, moduli: tuple,
                 wide: tuple):
        self.a, self.b, self.ea, self.eb, self.bound, self.moduli, self.wide = a, b, ea, eb, bound, moduli, wide

    def residues(self) -> np.ndarray:
        """``(len(moduli), m, n)`` int8: the product's residues on the INT8 moduli."""
        from . import gemm  # noqa: PLC0415 - the engine's kernels compile on first use

        # (on wide moduli grouped from the INT8 ones, where they fit as few and the workspace: each residue one
        # reduction of its group's, where the primes' would take every entry's mixed-radix digits)
        (m, k), n = self.a.shape, self.b.shape[1]
        wide = self.wide
        try:
            grouped = gemm.onto_plan(k, self.bound, self.moduli)
        except ValueError:
            grouped = None
        if (grouped is not None and len(grouped[0]) <= len(wide[0]) + 1
                and gemm.wide_bytes(m, n, k, len(grouped[0])) <= default_workspace_bytes()):
            wide = grouped
        return gemm.exact_gemm(self.a, self.b, self.ea, self.eb, self.bound, 1.0, *wide, onto=self.moduli)

    def decoded(self) -> np.ndarray:
        """``(m, n)`` float64: ``2**(-ea_i - eb_j)`` times the product's integers, correctly rounded."""
        from . import gemm  # noqa: PLC0415

        return gemm.exact_gemm(self.a, self.b, self.ea, self.eb, self.bound, 1.0, *self.wide)
