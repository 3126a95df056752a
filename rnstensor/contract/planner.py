"""The bounds-only planner: opt_einsum's contraction list walked into a residue program, widths and drops chosen."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..arrays import array_module
from ..basis import Basis, log2_int
from ..encode import encode_integers, exact_bits_needed
from ..errors import PlanError, RNSRangeError
from ..planner.program import drop_bound, fits
from .. import ir
from ..tensor import RNSTensor
from .parse import _C, _C2, _show, _unique

__all__ = ["_Node", "_abs_sum_max", "_shared_axes", "_SCANNED", "_exact_width", "_rounds_inside", "_alignment_shift",
           "_Planner"]

# ----- the plan -----------------------------------------------------------------------------


@dataclass
class _Node:
    """What the planner knows of an operand or intermediate: its indices and a rigorous bound."""

    labels: str  # complex nodes carry _C first
    bound: int
    kind: str  # 'input' (encoded at a width we choose), 'const', 'tensor' (an RNSTensor), 'inter'
    cplx: bool = False
    leaf: int = -1
    bits: int = 0
    ints: Optional[np.ndarray] = None  # 'const': the exact integers at ``bits``
    slot: int = -1
    drops: tuple = ()
    reencode: bool = False
    need: float = math.inf  # 'input' / 'const': the width at which the encoding is exact (where known)


def _abs_sum_max(ints: np.ndarray, labels: str, keep: str) -> int:
    """``max`` over the ``keep`` indices of the ``sum`` over the others of ``|v|``, exactly."""
    axes = tuple(i for i, lab in enumerate(labels) if lab not in keep)
    a = np.abs(ints)
    if a.dtype != object and a.size:
        n = math.prod(ints.shape[i] for i in axes)
        if int(a.max()) * max(n, 1) >= 1 << 62:
            a = a.astype(object)
    s = a.sum(axis=axes) if axes else a
    return int(np.max(s)) if np.size(s) else 0


def _shared_axes(labels: str, output: str) -> tuple[int, ...]:
    """An operand's axes that share one exponent: exponents vary only along output indices, so nothing ever
    summed needs aligning."""
    return tuple(a for a, lab in enumerate(labels) if lab not in output)


#: Operands up to this size that are not integers are scanned for short mantissas (about 100 ns an entry).
_SCANNED = 1 << 16


def _exact_width(x, shared: tuple[int, ...]) -> float:
    """A width at which :func:`rnstensor.encode` holds the operand ``x`` exactly (``inf``: none found below 53 bits).

    Cheap where it cannot help: measured data shows full 53-bit significands in its first entries. Integers
    (numpy's test data, counts) encode exactly at the bit length of the largest (two passes); other operands are
    scanned (:func:`~rnstensor.encode.exact_bits_needed`) where they are small.
    """
    xp = array_module(x)
    flat = x.reshape(-1)
    head = flat[:64]
    m, _ = xp.frexp(head)
    if bool(xp.any(xp.abs(m * 2.0**53) % 2 == 1)):  # an odd 53-bit significand: 53 bits or more are needed
        return math.inf
    if flat.size > _SCANNED and not bool(xp.all(head == xp.rint(head))):  # neither integers nor scanned
        return math.inf
    big = float(xp.abs(flat).max()) if flat.size else 0.0
    if big < 2.0**53 and bool(xp.all(flat == xp.rint(flat))):
        return max(1, math.frexp(big)[1])  # 2**(E-1) <= big < 2**E: every slice's integers fit E bits
    return exact_bits_needed(x, shared) if flat.size <= _SCANNED else math.inf


def _rounds_inside(plan: ir.Program, cap: int) -> bool:
    """Whether ``plan`` rounds anywhere but in encodings at the full width ``cap`` (a drop, a narrower encoding)."""
    return any(isinstance(st, (ir.Drop, ir.Reencode)) or (isinstance(st, ir.Encode) and st.bits < cap)
               for st in plan.steps)


def _alignment_shift(T: RNSTensor, shared: tuple[int, ...]) -> int:
    """How many bits aligning an RNSTensor operand's exponents along ``shared`` axes costs."""
    e = T.exponent().astype(np.int64, copy=False)
    if not shared or e.size <= 1:
        return 0
    return int((e - e.min(axis=shared, keepdims=True)).max())


class _Planner:
    """Walks opt_einsum's contraction list with bounds only, choosing widths and drops."""

    def __init__(self, terms, output, sizes, kinds, cplx, consts, tensors, basis: Basis, method: str, cap: int,
                 exact: bool = False, widths: Optional[tuple] = None):
        self.terms, self.output, self.sizes = terms, output, sizes
        self.basis, self.method, self.P = basis, method, basis.product
        self.exact = exact  # decode='exact': correctly rounded, so nothing may round on the way (no drops)
        if exact and method == "composed":
            raise PlanError(
                "einsum: decode='exact' promises the correctly rounded result, but method='composed' rounds every "
                "intermediate to float64 and re-encodes it; use method='rescale_be' (with enough moduli) or "
                "decode='fp64'"
            )
        self.consts = consts
        self.steps: list = []
        self.lines: list[str] = []
        self.nslots = 0
        self.kept = math.inf
        budget = basis.product.bit_length() - 3  # the widest encode() accepts
        self.width = max(1, min(cap, budget))
        self.nodes: list[_Node] = []
        for i, term in enumerate(terms):
            labels = (_C if cplx[i] else "") + _unique(term)
            if kinds[i] == "tensor":
                T = tensors[i]
                if T.basis != basis:
                    raise ValueError(f"einsum: RNSTensor operand {i} is on {T.basis!r}, not {basis!r}; encode all on one basis")
                shift = _alignment_shift(T, self.shared_axes(labels))
                bound = T.bound << shift
                if not fits(bound, self.P):
                    raise RNSRangeError(
                        f"einsum: RNSTensor operand {i} has exponents varying by {shift} bits along summed indices; "
                        f"aligning them needs 2^{log2_int(2 * bound):.1f} of range but {basis!r} gives "
                        f"2^{basis.log2_product:.1f}; encode it sharing exponents along the summed axes"
                    )
                n = _Node(labels, bound, "tensor", leaf=i)
            else:
                need = widths[i] if widths else math.inf
                bits = int(min(self.width, need))  # no wider than the operand needs: its bound is then the data's
                n = _Node(labels, 1 << bits, kinds[i], cplx=bool(cplx[i]), leaf=i, bits=bits, need=need)
                if n.kind == "const":
                    self._const_ints(n)
            self.nodes.append(n)

    def shared_axes(self, labels: str) -> tuple[int, ...]:
        return _shared_axes(labels, self.output)

    def _const_ints(self, n: _Node) -> None:
        v, _ = encode_integers(self.consts[n.leaf], n.bits, self.shared_axes(n.labels))
        n.ints = v
        n.bound = int(np.max(np.abs(v))) if v.size else 0

    def _slot(self) -> int:
        self.nslots += 1
        return self.nslots - 1

    def _emit(self, step) -> None:
        self.steps.append(step)

    # -- widths, drops, re-encodings --

    def _shrink(self, n: _Node, short: float) -> bool:
        """Lower ``n``'s bound by about ``short`` bits; False when it cannot go lower."""
        if n.kind in ("input", "const") or n.reencode:
            if n.bits <= 1:
                return False
            n.bits = max(1, n.bits - max(1, math.ceil(short)))
            if n.kind == "const":
                self._const_ints(n)
            else:
                n.bound = 1 << n.bits
            return True
        left = [p for p in sorted(self.basis.moduli) if p not in n.drops]
        if len(left) <= 1 or self.exact:  # a drop rounds: decode='exact' plans none
            return False
        n.drops += (left[0],)
        n.bound = drop_bound(n.bound, left[0])
        return True

    def _fit(self, nodes: Sequence[_Node], bound_of, what: str) -> int:
        """Shrink ``nodes`` (the widest first) until ``bound_of()`` fits the range; returns it."""
        if self.method == "composed":
            for n in nodes:
                if n.kind == "inter" and not n.reencode:
                    n.reencode, n.bits, n.bound = True, 53, 1 << 53
        while True:
            B = bound_of()
            if fits(B, self.P):
                return B
            short = log2_int(2 * B) - log2_int(self.P) + 1e-9
            # the widest operand gives up bits first, down to the next one; then they share the rest
            order = sorted(nodes, key=lambda n: -n.bound)
            if len(order) > 1 and order[1].bound > 0:
                gap = log2_int(max(order[0].bound, 1)) - log2_int(order[1].bound)
                short = min(short, gap) if gap >= 1 else short / len(order)
            if not any(self._shrink(n, short) for n in order):
                why = (" (decode='exact' drops no moduli: a drop rounds, and the result would not be the correctly "
                       "rounded one)") if self.exact else ""
                fix = ("moduli='auto' (it chooses the moduli, and goes to exact integers where 49 do not hold the value)"
                       if self.exact else "more moduli, or moduli=None (it chooses them)")
                raise PlanError(
                    f"einsum: {what} needs 2^{log2_int(2 * B):.1f} of range even with every operand at the smallest "
                    f"width{why}, but {self.basis!r} gives 2^{self.basis.log2_product:.1f}; use {fix}"
                )

    def _ready(self, n: _Node) -> None:
        """Emit what makes ``n``'s residues exist at its final width / after its drops."""
        if n.slot < 0:
            n.slot = self._slot()
            if n.kind in ("input", "const"):
                self._emit(ir.Encode(n.slot, n.leaf, n.bits, self.shared_axes(n.labels), n.labels, n.bound,
                                     constant=n.kind == "const", complex=n.cplx))
                if n.bits < n.need:  # an exact encoding keeps every bit, however narrow
                    self.kept = min(self.kept, n.bits)
            elif n.kind == "tensor":
                self._emit(ir.Operand(n.slot, n.leaf, self.shared_axes(n.labels), n.labels, n.bound))
        if n.reencode:
            self._emit(ir.Reencode(n.slot, n.slot, n.bits, self.shared_axes(n.labels), n.labels, 1 << n.bits))
            self.lines.append(f"  decode {_show(n.labels)} to float64, re-encode at {n.bits} bits (composed)")
            self.kept = min(self.kept, n.bits)
            n.reencode = False
        if n.drops:
            self._emit(ir.Drop(n.slot, n.slot, n.drops, True, n.bound))
            self.lines.append(
                f"  drop {len(n.drops)} moduli {n.drops} from {_show(n.labels)} + base extension -> bound "
                f"2^{log2_int(max(n.bound, 1)):.1f}"
            )
            self.kept = min(self.kept, log2_int(max(n.bound, 2)))
            n.drops = ()

    def _leaf_note(self, n: _Node) -> str:
        if n.kind == "input":
            return f"operand {n.leaf} encoded at {n.bits} bits"
        if n.kind == "const":
            return f"constant {n.leaf} encoded once at {n.bits} bits"
        if n.kind == "tensor":
            return f"RNSTensor operand {n.leaf}"
        return ""

    # -- steps --

    def _swap_wanted(self, X: _Node, Y: _Node, keep: str) -> bool:
        """Whether ``Y, X`` yields the output index order directly (a batched GEMM's result is ``batch, X-kept, Y-kept``)."""
        inx, iny, kp = set(X.labels), set(Y.labels), set(keep)
        C = [c for c in X.labels if c in iny and c not in kp]
        Bt = [c for c in X.labels if c in iny and c in kp]
        Kx = [c for c in X.labels if c in kp and c not in iny and c.isalpha()]
        Ky = [c for c in Y.labels if c in kp and c not in inx and c.isalpha()]
        if not C or not Kx or not Ky or (not Bt and len(C) == 1 and (len(X.labels) == 2 or len(Y.labels) == 2)):
            return False
        want = [c for c in self.output if c in set(Bt + Kx + Ky)]
        return want == Bt + Ky + Kx

    def pair(self, X: _Node, Y: _Node, keep: str) -> _Node:
        if self._swap_wanted(X, Y, keep):
            X, Y = Y, X
        if Y.cplx:
            Y.labels = Y.labels.replace(_C, _C2)
        inx, iny = set(X.labels), set(Y.labels)
        keep = set(keep) | {_C, _C2}
        Sx = "".join(c for c in X.labels if c not in iny and c not in keep)
        Sy = "".join(c for c in Y.labels if c not in inx and c not in keep)
        C = "".join(c for c in X.labels if c in iny and c not in keep)
        Bt = "".join(c for c in X.labels if c in iny and c in keep)
        Kx = "".join(c for c in X.labels if c in keep and c not in iny)
        Ky = "".join(c for c in Y.labels if c in keep and c not in inx)
        size = lambda labs: math.prod(self.sizes[c] for c in labs)  # noqa: E731
        twice = 2 if (X.cplx and Y.cplx) else 1

        def bound() -> int:
            # |sum_k x y| <= (rows of |x| summed) * max|y|: exact for constants, k * max * max otherwise
            bx = _abs_sum_max(X.ints, X.labels, Bt + Kx + C + _C) if X.kind == "const" else X.bound * size(Sx)
            by = _abs_sum_max(Y.ints, Y.labels, Bt + Ky + C + _C2) if Y.kind == "const" else Y.bound * size(Sy)
            cand = [size(C) * bx * by]
            if X.kind == "const":
                cand.append(_abs_sum_max(X.ints, X.labels, Bt + Kx + _C) * by)
            if Y.kind == "const":
                cand.append(_abs_sum_max(Y.ints, Y.labels, Bt + Ky + _C2) * bx)
            return twice * min(cand)

        B = self._fit((X, Y), bound, f"the contraction {_show(X.labels)},{_show(Y.labels)}")
        notes = [s for s in (self._leaf_note(X), self._leaf_note(Y)) if s]
        for n in (X, Y):
            self._ready(n)
        kind = "matmul"
        if not C:
            kind = "outer"
        elif not Bt and not Sx and not Sy and len(C) == 1:
            if len(Y.labels) == 2 and Ky:
                kind = "mode"
            elif len(X.labels) == 2 and Kx:
                kind = "mode_rev"
        if kind == "mode":
            labels = X.labels.replace(C, Ky)
        elif kind == "mode_rev":
            labels = Y.labels.replace(C, Kx)
        else:
            labels = Bt + Kx + Ky
        if Y.cplx and not X.cplx:
            labels = labels.replace(_C2, _C)  # one complex operand: its (re, im) axis passes through
        out = _Node(labels, B, "inter", cplx=X.cplx or Y.cplx, slot=self._slot())
        self._emit(ir.Contract(out.slot, X.slot, Y.slot, X.labels, Y.labels, Sx, Sy, C, Bt, Kx, Ky, kind, labels, B))
        if X.cplx and Y.cplx:
            out.labels = _C + labels.replace(_C, "").replace(_C2, "")
            self._emit(ir.Combine(out.slot, out.slot, _C, _C2, out.labels))
        what = {"mode": "mode product", "mode_rev": "mode product", "matmul": "batched GEMM", "outer": "Hadamard/outer product"}
        extra = f", summing {Sx + Sy!r} first" if Sx or Sy else ""
        self.lines.append(
            f"{_show(X.labels)},{_show(Y.labels)}->{_show(out.labels)}: {what[kind]} over {C!r}"
            + (f", batch {Bt!r}" if Bt else "") + extra
            + (f" ({'; '.join(notes)})" if notes else "")
            + f"; bound 2^{log2_int(max(B, 1)):.1f} < 2^{log2_int(self.P) - 1:.1f}"
        )
        return out

    def single(self, X: _Node, out: str) -> _Node:
        """Sums of one operand over its indices not in ``out``."""
        S = "".join(c for c in X.labels if c not in out and c not in (_C, _C2))
        if not S:
            return X
        rest = "".join(c for c in X.labels if c not in S)
        n = math.prod(self.sizes[c] for c in S)

        def bound() -> int:
            return _abs_sum_max(X.ints, X.labels, rest) if X.kind == "const" else X.bound * n

        B = self._fit((X,), bound, f"the sum of {_show(X.labels)} over {S!r}")
        note = self._leaf_note(X)
        self._ready(X)
        node = _Node(rest, B, "inter", cplx=X.cplx, slot=self._slot())
        self._emit(ir.Sum(node.slot, X.slot, X.labels, S, B))
        self.lines.append(
            f"{_show(X.labels)}->{_show(rest)}: sum over {S!r}" + (f" ({note})" if note else "")
            + f"; bound 2^{log2_int(max(B, 1)):.1f}"
        )
        return node

    def run(self, contraction_list) -> ir.Program:
        nodes = list(self.nodes)
        for inds, _, einsum_str, _, _ in contraction_list:
            group = [nodes.pop(i) for i in inds]
            out = einsum_str.split("->")[1]
            while len(group) > 1:
                keep = out + "".join(n.labels for n in group[2:])
                group = [self.pair(group[0], group[1], keep)] + group[2:]
            nodes.append(self.single(group[0], out))
        (Z,) = nodes
        if Z.kind != "inter":
            if Z.kind == "const":
                self._fit((Z,), lambda: Z.bound, "the constant result")
            self.lines.append(f"{_show(Z.labels)}: {self._leaf_note(Z)}, no contraction")
            self._ready(Z)
        out_labels = (_C if Z.cplx else "") + self.output
        return ir.Program(self.basis, tuple(self.steps), Z.slot, out_labels, Z.cplx, tuple(self.lines), self.kept,
                          self.nslots)
