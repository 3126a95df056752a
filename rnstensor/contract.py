"""einsum and contract_expression: any einsum expression, contracted in the residue domain."""

from __future__ import annotations

import dataclasses
import itertools
import math
import string
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import opt_einsum

from .arrays import CASTINGS, array_module, exact_float, is_device_array, to_module
from .backends import dispatch
from .basis import Basis, int8_pool, log2_int, moduli_count
from .encode import as_basis, check_nonfinite, encode, encode_integers, exact_bits_needed, finite_part, group_exponents
from .errors import EinsumPathError, PlanError, RNSRangeError
from .planner.methods import MIN_BITS, check_kept_bits
from .planner.program import Failure, Given, drop_bound, fits, plan_drops
from .primitives import decode as decode_tensor
from .program import ir
from .program.classical import certify, classical_terms, gamma
from .program.errors import EntrywiseErrors, decoded, inflate
from .program.execute import Value, execute, moved, permuted, tensor_of, value_of
from .run.exact import exact_value, least_moduli, round_exact_sum, split_exact
from .run.policy import accuracy_policy, check_rtol
from .tensor import RNSTensor, Scale

__all__ = ["einsum", "contract_expression", "ContractExpression", "tensordot", "transpose", "EINSUM_METHODS"]

#: ``'rescale_be'``: residues from one encode per operand to one decode (drops and base
#: extensions keep every intermediate in range). ``'composed'``: every intermediate is
#: decoded to float64 and re-encoded before its next use (the baseline of [2610.05059]).
EINSUM_METHODS = ("rescale_be", "composed")
_DECODES = ("fp64", "exact", None)

# the real/imaginary axis of complex nodes; opt_einsum only hands out letters, so these never clash
_C, _C2 = "\x00", "\x01"


def _show(labels: str) -> str:
    return labels.replace(_C, "(re,im)").replace(_C2, "(re,im)")


def _unique(term: str) -> str:
    return "".join(dict.fromkeys(term))


# ----- input checks -------------------------------------------------------------------------


#: numpy's labels: letters only; in the interleaved form the integers 0..25 are A..Z and 26..51 are a..z
_LETTERS = string.ascii_uppercase + string.ascii_lowercase


def _term(t: str, what: str) -> tuple[str, Optional[str]]:
    """A term's labels before and after its ``...`` (``after`` None: no ellipsis)."""
    before, after = t, None
    if "." in t:
        if t.count(".") != 3 or t.count("...") != 1:
            raise ValueError(f"einsum: {what} {t!r} has an invalid ellipsis; write exactly one '...' per term")
        before, after = t.split("...")
    bad = [c for c in before + (after or "") if c not in _LETTERS]
    if bad:
        raise ValueError(f"einsum: invalid subscript character(s) {bad!r} in {what} {t!r}; use letters a-z, A-Z")
    return before, after


def _parse_subscripts(subscripts: str, shapes: Sequence[tuple[int, ...]]) -> tuple[list[str], str]:
    """numpy's parse of ``subscripts`` on operands of ``shapes``: ``...`` expanded into free letters (numpy's
    broadcasting: right-aligned), the implicit output (``...`` first, then the labels seen once, sorted) made
    explicit; spaces ignored."""
    s = subscripts.replace(" ", "")
    if "-" in s or ">" in s:
        if s.count("->") != 1 or s.count("-") != 1 or s.count(">") != 1:
            raise ValueError(f"einsum: subscripts {subscripts!r} must contain '->' at most once (and no lone '-' or '>')")
        ins, out = s.split("->")
    else:
        ins, out = s, None
    raw = ins.split(",")
    if len(raw) != len(shapes):
        raise ValueError(
            f"einsum: Number of einsum subscripts ({len(raw)} in {subscripts!r}) must equal the number of operands "
            f"({len(shapes)} given); write one comma-separated term per operand"
        )
    parts = [_term(t, f"the term of operand {i}") for i, t in enumerate(raw)]
    broadcast = []  # how many dimensions each operand's '...' stands for
    for i, ((before, after), shape) in enumerate(zip(parts, shapes)):
        named, nd = len(before) + len(after or ""), len(shape)
        if (after is None and named != nd) or named > nd:
            raise ValueError(
                f"einsum: subscripts {raw[i]!r} of operand {i} name {named} indices but the operand has {nd} "
                f"dimensions (shape {tuple(shape)})" + ("; add '...' to broadcast the others" if named < nd else "")
            )
        broadcast.append(0 if after is None else nd - named)
    used = set(s)
    free = [c for c in _LETTERS[26:] + _LETTERS[:26] if c not in used]
    nb = max(broadcast, default=0)
    if nb > len(free):
        raise ValueError(f"einsum: {subscripts!r} needs {nb} letters for the dimensions '...' stands for, but only "
                         f"{len(free)} of the 52 are unused; name fewer indices")
    ell = "".join(free[:nb])
    terms = [b + (ell[nb - k:] if a is not None else "") + (a or "") for (b, a), k in zip(parts, broadcast)]
    ell_shapes = [tuple(shape)[len(b):len(b) + k] for (b, _), k, shape in zip(parts, broadcast, shapes)]
    try:  # checked here, where the letters '...' stands for are still known as '...'
        np.broadcast_shapes(*ell_shapes)
    except ValueError:
        raise ValueError(
            f"einsum: the dimensions '...' stands for do not broadcast: {', '.join(f'operand {i} {s}' for i, s in enumerate(ell_shapes) if s)}"
        ) from None
    if out is None:
        letters = "".join(b + (a or "") for b, a in parts)
        output = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    else:
        before, after = _term(out, "output")
        if after is None and nb:
            raise ValueError(
                f"einsum: the operands' '...' stands for {nb} dimension(s) but the output {out!r} has no '...'; "
                f"add '...' to the output (or sum them explicitly)"
            )
        output = before + (ell + after if after is not None else "")
        for c in output:
            if output.count(c) > 1:
                raise ValueError(f"einsum: output subscripts {out!r} repeat the index {c!r}")
            if not any(c in t for t in terms):
                raise ValueError(f"einsum: output index {c!r} does not appear in the inputs {ins!r}")
    return terms, output


def _sublist(sub, what: str) -> str:
    """One sublist of the interleaved form as letters (numpy's: 0..25 -> A..Z, 26..51 -> a..z, ``...``)."""
    if isinstance(sub, str) or not hasattr(sub, "__iter__"):
        raise TypeError(f"einsum: {what} must be a list of integers 0..51 and Ellipsis (the interleaved form "
                        f"einsum(a, [0, 1], b, [1, 2], [0, 2])); got {sub!r}")
    out = []
    for v in sub:
        if v is Ellipsis:
            out.append("...")
        elif isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
            if not 0 <= v < len(_LETTERS):
                raise ValueError(f"einsum: subscript {v} in {what} is outside 0..51 (numpy's 52 labels)")
            out.append(_LETTERS[int(v)])
        else:
            raise TypeError(f"einsum: each subscript in {what} must be an integer 0..51 or Ellipsis; got {v!r}")
    return "".join(out)


def _parse(operands: Sequence[Any]) -> tuple[list[str], str, list]:
    """``(terms, output, arrays)`` from ``subscripts, a, b, ...`` or the interleaved ``a, [0, 1], b, [1, 2], [out]``."""
    if not operands:
        raise ValueError("einsum: no subscripts given; call einsum('ij,jk->ik', a, b)")
    if isinstance(operands[0], str):
        subscripts, arrays = operands[0], list(operands[1:])
        if not arrays:
            raise ValueError(f"einsum: subscripts {subscripts!r} but no operands; pass the arrays after them")
    else:
        pairs = len(operands) // 2
        arrays = list(operands[0:2 * pairs:2])
        subscripts = ",".join(_sublist(sub, f"the sublist of operand {i}") for i, sub in enumerate(operands[1:2 * pairs:2]))
        if len(operands) % 2:
            subscripts += "->" + _sublist(operands[-1], "the output sublist")
    terms, output = _parse_subscripts(subscripts, [_shape_of(x) for x in arrays])
    return terms, output, arrays


def _path_option(optimize, n: int) -> tuple[Any, Optional[int]]:
    """numpy's ``optimize`` (and opt_einsum's) as opt_einsum's ``(optimize, memory_limit)``, hashable.

    ``False``: one contraction of every operand (numpy's unoptimized order); ``True``: ``'greedy'``;
    ``(algorithm, memory_limit)``; a path, with or without numpy's leading ``'einsum_path'``, checked here;
    opt_einsum's strategy names and ``PathOptimizer`` objects as they are.
    """
    if optimize is False or optimize is None:  # numpy reads None as False
        return (tuple(range(n)),), None
    if optimize is True:
        return "greedy", None
    if isinstance(optimize, (str, opt_einsum.paths.PathOptimizer)):
        return optimize, None
    if (isinstance(optimize, tuple) and len(optimize) == 2 and isinstance(optimize[0], str)
            and isinstance(optimize[1], (int, float, np.integer, np.floating)) and not isinstance(optimize[1], bool)):
        algorithm, limit = optimize
        if limit < 1:  # no intermediate may be formed: numpy's single contraction
            return (tuple(range(n)),), None
        return algorithm, int(limit)
    if isinstance(optimize, (list, tuple)):
        steps = list(optimize)
        if steps and isinstance(steps[0], str) and steps[0] == "einsum_path":
            steps = steps[1:]
        left, path = n, []
        for st in steps:
            if not isinstance(st, (list, tuple)) or not st or \
                    any(not isinstance(i, (int, np.integer)) or isinstance(i, bool) for i in st):
                raise EinsumPathError(f"einsum: optimize path step {st!r} must be a tuple of operand positions")
            st = tuple(int(i) for i in st)
            if len(set(st)) != len(st) or not all(0 <= i < left for i in st):
                raise EinsumPathError(f"einsum: optimize path step {st} names positions outside 0..{left - 1} "
                                      f"(or one twice); each step contracts distinct operands of the current list")
            left -= len(st) - 1
            path.append(st)
        if left != 1:
            raise EinsumPathError(f"einsum: invalid optimize path {optimize!r}: {left - 1} more operand(s) have to "
                                  f"be contracted; the steps must leave one result")
        return tuple(path), None
    raise TypeError(f"einsum: optimize={optimize!r} is not understood; pass False, True, 'greedy', 'optimal', "
                    f"another opt_einsum strategy, (strategy, memory_limit) or a path ['einsum_path', (0, 1), ...]")


def _label_sizes(terms: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> dict[str, int]:
    """Each index's size under numpy's rules: equal everywhere, or 1 (broadcast)."""
    if len(terms) != len(shapes):
        raise ValueError(f"einsum: {len(terms)} subscript terms for {len(shapes)} operands")
    sizes: dict[str, int] = {}
    for i, (term, shape) in enumerate(zip(terms, shapes)):
        if len(term) != len(shape):
            raise ValueError(
                f"einsum: subscripts {term!r} of operand {i} name {len(term)} indices but the operand has "
                f"{len(shape)} dimensions (shape {tuple(shape)})"
            )
        seen: dict[str, int] = {}
        for lab, n in zip(term, shape):
            n = int(n)
            if lab in seen and seen[lab] != n:
                raise ValueError(f"einsum: repeated index {lab!r} of operand {i} has sizes {seen[lab]} and {n}; a diagonal needs equal sizes")
            seen[lab] = n
            old = sizes.get(lab)
            if old is None or old == 1:
                sizes[lab] = n
            elif n not in (old, 1):
                raise ValueError(
                    f"einsum: index {lab!r} has size {n} in operand {i} but {old} elsewhere; sizes must agree (or be 1)"
                )
    return sizes




def _as_float(x, i: int, what: str = "operand"):
    """``x`` as float64 (or complex128) where that holds it exactly (:func:`rnstensor.arrays.exact_float`);
    RNSTensor operands as they are."""
    return x if isinstance(x, RNSTensor) else exact_float(x, f"{what} {i}", "einsum")


def _operand_kind(x, i: int) -> tuple[str, bool]:
    """``('tensor', False)`` for an RNSTensor, else ``('input', is_complex)``; other dtypes rejected."""
    if isinstance(x, RNSTensor):
        return "tensor", False
    dt = getattr(x, "dtype", None)
    if dt is None:
        x = np.asarray(x)
        dt = x.dtype
    if dt == np.float64:
        return "input", False
    if dt == np.complex128:
        return "input", True
    raise TypeError(
        f"einsum: operand {i} has dtype {dt}; rnstensor.einsum takes what float64 or complex128 holds exactly "
        f"(bool, integers up to 2^53, float16/32/64, complex64/128); convert it with .astype(np.float64)"
    )


def _check_finite(x, i: int, what: str = "operand") -> None:
    if not bool(array_module(x).isfinite(x).all()):
        raise ValueError(f"einsum: {what} {i} holds inf or NaN; residues hold finite values only"
                         + (" (nonfinite='propagate' follows numpy for operands, not constants)" if what == "constant" else ""))


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
                        f"2^{basis.log2_product:.1f}; encode it sharing exponents along the summed axes, or drop moduli first"
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
                fix = ("moduli='auto' (it chooses the moduli, and splits operands exactly where 49 do not hold them)"
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


# ----- execution ----------------------------------------------------------------------------


def _encode_leaf(x, basis: Basis, bits: int, shared: tuple[int, ...]) -> RNSTensor:
    """One operand's encoding: module level so that tests can count how often constants are encoded."""
    return encode(x, basis, bits=bits, shared_axes=shared)


# ----- the expression -----------------------------------------------------------------------


class ContractExpression:
    """An einsum expression planned once and applied to new operands in the residue domain.

    Build it with :func:`contract_expression`. Call it with the non-constant
    operands in order; ``explain()`` shows the path and every residue step.

    Attributes
    ----------
    subscripts : str
        The explicit form ``'ij,jk->ik'`` (``...`` expanded).
    basis : Basis
    method : str
    decode : str or None
    path : list of tuple
        opt_einsum's contraction path.
    """

    def __init__(self, terms, output, shapes, constants, basis, method, optimize, decode, bits, backend=None, min_bits=MIN_BITS,
                 nonfinite="propagate", policy="basis", rtol=None):
        self.terms, self.output = list(terms), output
        self.subscripts = ",".join(terms) + "->" + output
        self.shapes = [tuple(int(n) for n in s) for s in shapes]
        self.constants = dict(constants)
        self.basis, self.method, self.decode, self.backend = basis, method, decode, backend
        self.bits, self.min_bits = bits, min_bits
        self.nonfinite = check_nonfinite(nonfinite)
        if isinstance(policy, bool):  # (the former flag: the classical default or an explicit basis)
            policy = "classical" if policy else "basis"
        #: the accuracy policy of moduli= (:mod:`rnstensor.run.policy`): 'classical', 'fast', 'auto' or 'basis'
        self.policy = policy
        self.classical = policy == "classical"
        #: the target of the default in place of the classical bound (``rtol (|A||B|...)`` entry by entry), or None
        self.rtol = rtol
        self.sizes = _label_sizes(terms, self.shapes)
        opt, limit = _path_option(optimize, len(self.terms))
        self.path, self._info = opt_einsum.contract_path(
            self.subscripts, *self.shapes, shapes=True, optimize=list(opt) if isinstance(opt, tuple) else opt,
            memory_limit=limit,
        )
        self._plans: dict = {}
        self._const_cache: dict = {}
        self._rungs: dict = {}
        #: How the last default (classical) call was evaluated: ``'15 moduli, 53 bits'`` (certified residues) or
        #: ``'composed classical GEMMs'``; None before one.
        self.last_evaluation: Optional[str] = None

    def with_shapes(self, *shapes) -> "ContractExpression":
        """The same expression for other operand shapes (one per non-constant), sharing the encoded constants.

        Used to apply one expression to batches of different sizes (e.g. the
        chunks of a Dask array): the constants' residues are encoded once and
        shared as long as the constants' own index sizes are unchanged.
        """
        it = iter(shapes)
        full = [self.shapes[i] if i in self.constants else tuple(int(d) for d in next(it)) for i in range(len(self.terms))]
        other = ContractExpression(
            # the same path: the same plan, so each batch entry gets the same integers however it is split
            self.terms, self.output, full, self.constants, self.basis, self.method, [tuple(p) for p in self.path],
            self.decode, self.bits, self.backend, self.min_bits, self.nonfinite, self.policy, self.rtol,
        )
        const_labels = {c for i in self.constants for c in self.terms[i]}
        if all(other.sizes[c] == self.sizes[c] for c in const_labels):
            other._const_cache = self._const_cache
        return other

    @property
    def num_args(self) -> int:
        """How many operands a call takes (the non-constants)."""
        return len(self.terms) - len(self.constants)

    def _cap(self) -> int:
        if self.bits is not None:
            return self.bits
        return self.basis.product.bit_length() if self.decode == "exact" else 53

    def _plan(self, kinds: tuple, cplx: tuple, tensors: dict, widths: Optional[tuple] = None) -> ir.Program:
        """The program for these operand kinds; ``widths``: the widths at which the operands encode exactly (an
        operand is encoded no wider)."""
        key = (kinds, cplx, widths)
        if tensors or key not in self._plans:
            consts = {i: self._const_array(i, cplx[i]) for i in self.constants}

            def planned(cap: int) -> ir.Program:
                return _Planner(self.terms, self.output, self.sizes, kinds, cplx, consts, tensors, self.basis,
                                self.method, cap, exact=self.decode == "exact", widths=widths
                                ).run(self._info.contraction_list)

            try:
                plan = planned(self._cap())
            except PlanError:
                if self.decode != "exact" or self.bits is not None:
                    raise
                # without drops the first contractions must leave range for the later ones: the widest common
                # input width at which no operand has to give up bits (planning is bounds only)
                def balanced(cap: int) -> bool:
                    try:
                        p = planned(cap)
                    except PlanError:
                        return False
                    return all(st.bits >= cap for st in p.steps if isinstance(st, ir.Encode))

                lo, hi = 0, self._cap()
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if balanced(mid) else (lo, mid)
                plan = planned(max(lo, 1))  # raises the planner's own error when even width 1 does not fit
            checked = plan_drops(plan, {}, Given([]))  # every range of the program, by the one planner
            if isinstance(checked, Failure):  # pragma: no cover - the expression's planner and the check disagree
                raise PlanError(f"einsum: the plan for {self.subscripts!r} fails its range check: {checked}")
            check_kept_bits(f"einsum: on {self.basis!r} the plan for {self.subscripts!r}", plan.kept_bits,
                            self.min_bits, self._cap(), "use more moduli")
            if tensors:
                return plan
            if widths is not None and len(self._plans) > 64:  # plans for the data's widths: a bounded cache
                self._plans.clear()
            self._plans[key] = plan
        return self._plans[key]

    def _const_array(self, i: int, cplx: bool, xp=np):
        """Constant ``i`` as encoded (diagonal, broadcast, parts stacked), in the array module ``xp`` (cached)."""
        key = ("array", i)
        if key not in self._const_cache:
            self._const_cache[key] = _leaf_array(self.terms[i], self.sizes, self.constants[i], cplx)
        host_or_dev = self._const_cache[key]
        if array_module(host_or_dev) is xp:
            return host_or_dev
        dkey = ("array", i, xp.__name__)
        if dkey not in self._const_cache:
            self._const_cache[dkey] = to_module(host_or_dev, xp)
        return self._const_cache[dkey]

    def _operands(self, arrays) -> tuple[list, tuple, tuple, dict, bool]:
        if len(arrays) != self.num_args:
            raise ValueError(
                f"this expression takes {self.num_args} operand(s) (the non-constants of {self.subscripts!r}); got {len(arrays)}"
            )
        it = iter(arrays)
        ops, kinds, cplx, tensors, nonfinite = [], [], [], {}, False
        for i in range(len(self.terms)):
            if i in self.constants:
                x = self.constants[i]
                k, c = _operand_kind(x, i)
                ops.append(x)
                kinds.append("const")
                cplx.append(c)
                continue
            x = _as_float(next(it), i)
            k, c = _operand_kind(x, i)
            shape = x.shape if isinstance(x, RNSTensor) else np.shape(x)
            if tuple(shape) != self.shapes[i]:
                raise ValueError(f"operand {i} has shape {tuple(shape)}; this expression was built for {self.shapes[i]}")
            if k == "tensor":
                if _unique(self.terms[i]) != self.terms[i]:
                    x = _tensor_diagonal(x, self.terms[i])  # repeated indices: take the diagonal first
                x = _tensor_broadcast(x, _unique(self.terms[i]), self.sizes)
                tensors[i] = x
            else:
                x = x if is_device_array(x) else np.asarray(x)
                x, bad = finite_part(x)
                if bad and self.nonfinite == "raise":
                    raise ValueError(f"einsum: operand {i} holds inf or NaN (nonfinite='raise'); residues hold finite "
                                     f"values only")
                nonfinite = nonfinite or bad
            ops.append(x)
            kinds.append(k)
            cplx.append(c)
        return ops, tuple(kinds), tuple(cplx), tensors, nonfinite

    def _backend(self, ops, kinds, backend):
        """The backend and array module of a call: its non-constant operands' (CuPy runs on 'cuda'; no mixing)."""
        arrays = [x.residues if isinstance(x, RNSTensor) else x for x, k in zip(ops, kinds) if k != "const"]
        names = tuple(f"operand {i}" for i, k in enumerate(kinds) if k != "const")
        be_name = backend or self.backend
        be, xp = dispatch(*arrays, backend=be_name, names=names, fn="einsum")
        return be, xp, (be.name if xp is not np else be_name)

    def __call__(self, *arrays, backend: Optional[str] = None):
        """Contract new operands (the non-constants, in order); returns what ``decode`` says.

        NumPy operands give NumPy results on the CPU backend, CuPy operands
        CuPy results on the CUDA backend (constants may be either: they are
        encoded once per device).
        """
        if self.policy == "auto":
            return self._auto(arrays, backend)
        if self._certifies(arrays):
            return self._classical(arrays, backend, bound=False)
        parsed = self._operands(arrays)
        if self.decode in ("fp64", "exact"):
            y = self._fused(parsed, backend, None, self.decode)
            if y is not None:
                return y
        out = self._run(arrays, backend, track=False, parsed=parsed)
        if not isinstance(out, tuple):
            return out
        T, plan, _, be_name, nonfinite = out
        if self.decode is None:
            if nonfinite:
                raise ValueError("einsum: decode=None cannot carry inf or NaN operands (residues are finite)")
            return T
        return self._finish(T, plan, be_name, nonfinite, arrays, self.decode)

    def _finish(self, T, plan, be_name, nonfinite, arrays, mode: str):
        y = decode_tensor(T, mode, backend=be_name)
        if plan.complex:
            y = y[0] + 1j * y[1]
        if nonfinite:
            y = self._numpy_where_nonfinite(y, arrays)
        return y[()] if y.ndim == 0 and not is_device_array(y) else y

    # ----- moduli='auto': correctly rounded ---------------------------------------------------------

    def _auto(self, arrays, backend):
        """The correctly rounded result: the plan on the fewest moduli that encodes every operand exactly and drops
        nothing (:func:`rnstensor.run.exact.least_moduli`), decoded exactly; numpy's inf / NaN where they enter."""
        parsed = self._operands(arrays)
        ops, kinds, cplx, tensors, nonfinite = parsed
        if tensors:
            raise TypeError("einsum: moduli='auto' takes float operands (an RNSTensor carries its own basis: pass "
                            "moduli=None or its basis)")
        _, xp, _ = self._backend(ops, kinds, backend)
        if any(n == 0 for n in self.sizes.values()):
            return self._run(arrays, backend, track=False, parsed=parsed)
        leaf = self._leaves(ops, kinds, cplx, xp)
        widths = tuple(max(1, exact_bits_needed(leaf(i), _shared_axes((_C if cplx[i] else "") + _unique(t),
                                                                          self.output)))
                       for i, t in enumerate(self.terms))
        expr = self._exact_rung(kinds, cplx, widths)
        if expr is None:
            return self._auto_split(parsed, arrays, backend, widths)
        self.last_evaluation = f"{len(expr.basis)} moduli, exact"
        y = expr._fused(parsed, backend, widths, "exact")
        if y is not None:
            return y
        T, plan, _, be_name, nonfinite = expr._run(arrays, backend, False, parsed, widths)
        return expr._finish(T, plan, be_name, nonfinite, arrays, "exact")

    #: the most exact part products ``moduli='auto'`` evaluates for one call before it gives up
    _MAX_SPLIT_PRODUCTS = 512

    def _auto_split(self, parsed: tuple, arrays, backend, widths: tuple):
        """``moduli='auto'`` beyond 49 moduli: the widest operands split exactly (:func:`rnstensor.run.exact.split_exact`)
        until one exact plan holds every part, each product of parts evaluated exactly, their integers summed exactly
        (Python integers, on the host) and rounded once."""
        ops, kinds, cplx, _, nonfinite = parsed
        counts = [1] * len(widths)
        inputs = tuple("input" for _ in kinds)  # constants are split like the rest: every operand is passed
        while True:
            i = max(range(len(widths)), key=lambda j: -(-widths[j] // counts[j]))
            counts[i] += 1
            parts_w = tuple(-(-w // c) for w, c in zip(widths, counts))
            if math.prod(counts) > self._MAX_SPLIT_PRODUCTS or min(parts_w) < 1:
                raise RNSRangeError(
                    f"einsum: moduli='auto' needs the exact value of {self.subscripts!r}: its operands encode exactly "
                    f"at {list(widths)} bits (one exponent per slice along the output indices), and even split into "
                    f"{math.prod(counts)} exact part products they need more than 49 INT8 moduli hold without "
                    f"rounding; pass moduli=None (the classical float64 bound)"
                )
            rung = ContractExpression(self.terms, self.output, self.shapes, {}, self.basis, "rescale_be",
                                      [tuple(p) for p in self.path], "exact", None, self.backend, 0, self.nonfinite)
            expr = rung._exact_rung(inputs, cplx, parts_w)
            if expr is not None:
                break
        xp = array_module(*[x for x in ops])
        split = [split_exact(x, _shared_axes(t, self.output), c) for x, t, c in zip(ops, self.terms, counts)]
        terms = []
        for combo in itertools.product(*split):
            T, plan, _, _, _ = expr._run(list(combo), backend, False, None, parts_w)
            terms.append(exact_value(T))
        y = round_exact_sum(terms)
        if plan.complex:
            y = y[0] + 1j * y[1]
        y = to_module(y, xp)
        self.last_evaluation = f"{len(expr.basis)} moduli, exact, {len(terms)} part products"
        if nonfinite:
            y = self._numpy_where_nonfinite(y, arrays)
        return y[()] if y.ndim == 0 and not is_device_array(y) else y

    def _exact_rung(self, kinds: tuple, cplx: tuple, widths: tuple) -> Optional["ContractExpression"]:
        """This expression on the fewest INT8 moduli whose plan for operands of exact ``widths`` rounds nowhere
        (cached per widths: the data decides them)."""
        key = ("exact", kinds, cplx, widths)
        if key in self._rungs:
            return self._rungs[key]
        found: dict = {}

        def fits(s: int) -> bool:
            expr = ContractExpression(self.terms, self.output, self.shapes, self.constants,
                                      as_basis(moduli_count(s), "moduli"), "rescale_be", [tuple(p) for p in self.path],
                                      "exact", None, self.backend, 0, self.nonfinite)
            expr._const_cache = self._const_cache  # the constants' arrays (their encodings are per width)
            try:
                plan = expr._plan(kinds, cplx, {}, widths)
            except PlanError:
                return False
            if plan.kept_bits != math.inf:
                return False
            found[s] = expr
            return True

        # the product of the operands' widths and the sums' terms, at least: the range cannot be smaller
        start = max(2, (sum(widths) + 1) // 8 - 1)
        s = least_moduli(fits, start)
        if len(self._rungs) > 64:
            self._rungs.clear()
        self._rungs[key] = found.get(s) if s is not None else None
        return self._rungs[key]

    # ----- the classical default ------------------------------------------------------------------

    #: The widest input encoding the escalation tries before the composed evaluation.
    _WIDEST = 160

    def _certifies(self, arrays) -> bool:
        """Whether this call is held to the classical bound (the default: ``moduli=None``, float operands)."""
        if not (self.classical and self.decode == "fp64" and self.bits is None and self.method == "rescale_be"):
            return False
        it = iter(arrays)
        for i in range(len(self.terms)):
            x = self.constants[i] if i in self.constants else next(it, None)
            if isinstance(x, RNSTensor):
                return False
        return True

    def _rung(self, cap: int, kinds: tuple, cplx: tuple) -> Optional["ContractExpression"]:
        """This expression with operands encoded at ``cap`` bits, on the fewest INT8 moduli its plan fits (cached)."""
        if cap == 53 and self.rtol is None:
            return self
        key = (cap, kinds, cplx)
        # a target may take fewer moduli than the default's 15, and any width (its certificate decides)
        fewest = len(self.basis) if self.rtol is None else 2
        if key not in self._rungs:
            self._rungs[key] = None
            for s in range(max(fewest, (2 * cap + 15) // 8), len(int8_pool()) + 1):
                expr = ContractExpression(self.terms, self.output, self.shapes, self.constants, as_basis(moduli_count(s), "moduli"),
                                          self.method, [tuple(p) for p in self.path], "fp64", cap, self.backend,
                                          self.min_bits if self.rtol is None else 0, self.nonfinite)
                try:
                    expr._plan(kinds, cplx, {})
                except PlanError:
                    continue
                self._rungs[key] = expr
                break
        return self._rungs[key]

    def _classical(self, arrays, backend, bound: bool):
        """The default evaluation: the residue program at the narrowest width whose result is certified to meet the
        classical float64 bound (:mod:`rnstensor.program.classical`, before it runs), else the composed classical
        evaluation."""
        if any(n == 0 for n in self.sizes.values()):  # nothing to certify: the zeros of an empty contraction
            return self._bound(arrays, backend, "fp64") if bound else self._run(arrays, backend, track=False)
        parsed = self._operands(arrays)
        ops, kinds, cplx, _, _ = parsed
        _, xp, _ = self._backend(ops, kinds, backend)  # where the non-constant operands live
        leaf = self._leaves(ops, kinds, cplx, xp)

        def exponents(st):  # what the encode gives each slice (encode: e = bits - E, the value 2**-e times the integer)
            return -group_exponents(leaf(st), st.bits, st.shared)

        widths = None
        # a target starts at the width it asks for (a loose one, narrower and on fewer moduli), the default at 53
        cap = 53 if self.rtol is None else min(53, max(8, math.ceil(-math.log2(self.rtol)) + 8))
        while cap <= self._WIDEST:
            expr = self._rung(cap, kinds, cplx)
            if expr is None:
                break
            plan, used = expr._plan(kinds, cplx, {}), None
            if _rounds_inside(plan, cap):
                # operands float64 holds in fewer bits (integers, short mantissas) encoded no wider: exactly, with
                # their data's bound; where that makes the whole plan exact, the result is the exact integer, as
                # numpy's float64 is on such data. Otherwise the plan as planned (the explicit basis's, bit for bit).
                if widths is None:
                    widths = tuple(_exact_width(leaf(i), _shared_axes((_C if cplx[i] else "") + _unique(t), self.output))
                                   for i, t in enumerate(self.terms))
                if min(widths, default=math.inf) < cap:
                    exact = expr._plan(kinds, cplx, {}, widths)
                    if exact.kept_bits == math.inf:
                        plan, used = exact, widths
            m = classical_terms(plan, self.sizes)
            obs = certify(plan, leaf, exponents, m, self.rtol)
            if obs.certified(m, self.rtol):
                mode = "exact" if obs.exact and m <= 1 else "fp64"
                self.last_evaluation = f"{len(expr.basis)} moduli, {cap} bits"
                if bound:
                    return expr._bound(arrays, backend, mode, parsed, used)
                y = expr._fused(parsed, backend, used, mode)
                if y is not None:
                    return y
                T, plan, _, be_name, nonfinite = expr._run(arrays, backend, False, parsed, used)
                return expr._finish(T, plan, be_name, nonfinite, arrays, mode)
            if obs.excess is None:  # refused: wider encodings do not help
                break
            cap += max(8, math.ceil(math.log2(obs.excess)) + 2)
        if self.rtol is not None:
            m = classical_terms(self._plan(kinds, cplx, {}), self.sizes)
            if self.rtol < (2 * gamma(m + 2 * len(self._info.contraction_list)) if any(cplx) else gamma(m)):
                raise RNSRangeError(
                    f"einsum: rtol={self.rtol:g} cannot be certified for {self.subscripts!r} on these operands within "
                    f"49 INT8 moduli and {self._WIDEST}-bit encodings, and the classical GEMMs meet only gamma_{m} = "
                    f"{gamma(m):.2g}; moduli='auto' is correctly rounded (within any rtol >= 2**-52), or pass a "
                    f"larger rtol")
        self.last_evaluation = "composed classical GEMMs"
        return self._composed_classical(arrays, bound, parsed)

    def _composed_classical(self, arrays, bound: bool, parsed: tuple):
        """Each pairwise step by the classical GEMM (:func:`rnstensor.matmul`), decoded in between.

        Steps meeting ``γ_k |X||Y|`` compose to ``γ_(k1 + k2 + ...)`` of the
        magnitudes: the fallback for operands the residue certification
        refuses (slices spanning hundreds of binades) or that would need more
        than 49 moduli.
        """
        ops, kinds, cplx, _, nonfinite = parsed
        _, xp, _ = self._backend(ops, kinds, None)
        vals = [(_prepared(t, self.sizes, self.constants[i] if kinds[i] == "const" else x, xp), _unique(t))
                for i, (t, x) in enumerate(zip(self.terms, ops))]
        if bound:
            m = classical_terms(self._plan(kinds, cplx, {}), self.sizes)
            terms = math.prod(self.sizes.values())  # every product of the whole contraction, for the underflows
            # complex: each step's ZGEMM meets sqrt(2) γ_(k+2) |X||Y|, and |Re err| + |Im err| <= sqrt(2) |err|
            factor = 2 * gamma(m + 2 * len(self._info.contraction_list)) if any(cplx) else gamma(m)
            with np.errstate(over="ignore", under="ignore"):
                mag = opt_einsum.contract(",".join(lab for _, lab in vals) + "->" + self.output,
                                          *[xp.abs(v) for v, _ in vals],
                                          optimize=[tuple(p) for p in self.path])
                D = inflate(inflate(mag, m + len(self.terms)) * (factor * (1 + 2.0**-40) + 2.0**-70)
                            + terms * 2.0**-1072, 4)
            if nonfinite:
                ref = self._float64_reference(arrays)
                D = xp.where(xp.isfinite(ref), D, np.inf)
            return D
        for inds, _, einsum_str, _, _ in self._info.contraction_list:
            out = einsum_str.split("->")[1]
            group = [vals.pop(i) for i in inds]
            while len(group) > 1:
                keep = out + "".join(lab for _, lab in group[2:])
                group = [_classical_pair(*group[0], *group[1], keep)] + group[2:]
            vals.append(_classical_single(*group[0], out))
        (y, lab), = vals
        y = _arranged(y, lab, self.output)
        if nonfinite:
            y = self._numpy_where_nonfinite(y, arrays)
        return y[()] if y.ndim == 0 and not is_device_array(y) else y

    def _float64_reference(self, arrays):
        """numpy's float64 einsum of the call's operands (where they live): what it gives where an inf or NaN enters."""
        it = iter(arrays)
        ops = [self.constants[i] if i in self.constants else next(it) for i in range(len(self.terms))]
        xp = array_module(*[x for x in ops if not isinstance(x, RNSTensor)])
        ops = [decode_tensor(x, "exact") if isinstance(x, RNSTensor) else x for x in ops]
        with np.errstate(invalid="ignore", over="ignore"):
            return xp.einsum(self.subscripts, *ops)

    def _numpy_where_nonfinite(self, y, arrays):
        # an output that meets an inf or NaN in float64 is inf or NaN there (inf * 0 is NaN, inf + -inf too), so
        # every other output never reads one: computed with those entries zeroed, it is the exact result
        ref = self._float64_reference(arrays)
        xp = array_module(ref)
        return xp.where(xp.isfinite(ref), y, ref.astype(y.dtype, copy=False))

    def error_bound(self, *arrays, backend: Optional[str] = None) -> np.ndarray:
        """A rigorous bound on the absolute error of every entry of ``self(*arrays)``.

        The plan is replayed with a running error analysis
        (:class:`rnstensor.program.errors.EntrywiseErrors`): each operand's
        encoding error (half a unit of its slice), each drop (under one unit
        of the quotient), every product and sum of those (``|x̂ŷ - xy| <=
        D_x M_y + M_x D_y`` with magnitude bounds ``M``), and the final decode
        (``'fp64'``: its faithful rounding; ``'exact'``: half an ulp). For complex
        results it bounds ``|Re err| + |Im err|``. Operands given as
        RNSTensors count as exact. The bound's own float64 arithmetic is
        inflated to stay an upper bound. Computed where the operands live
        (a CuPy array for CuPy operands).

        Examples
        --------
        >>> import numpy as np, rnstensor as rt
        >>> a = np.random.default_rng(0).uniform(-1, 1, (4, 8))
        >>> expr = rt.contract_expression("ij,kj->ik", a.shape, a.shape)
        >>> err = np.abs(expr(a, a) - a @ a.T)
        >>> bool((expr.error_bound(a, a) >= 0).all())
        True
        """
        if self.decode is None:
            raise ValueError("error_bound: this expression returns RNSTensors (decode=None); nothing is rounded")
        if self.policy == "auto":  # correctly rounded: within half the spacing at the result (per part)
            y = self._auto(arrays, backend)
            xp = array_module(y)
            with np.errstate(over="ignore", invalid="ignore"):
                half = (lambda v: xp.where(xp.isfinite(v), xp.spacing(xp.abs(v)) / 2, np.inf))
                return half(y.real) + half(y.imag) if xp.iscomplexobj(y) else half(y)
        if self._certifies(arrays):
            return self._classical(arrays, backend, bound=True)
        return self._bound(arrays, backend, self.decode)

    def _bound(self, arrays, backend, mode: str, parsed: Optional[tuple] = None, widths: Optional[tuple] = None):
        out = self._run(arrays, backend, True, parsed, widths)
        if not isinstance(out, tuple):
            return array_module(out).zeros(np.shape(out))
        T, plan, (M, D), _, nonfinite = out
        D = decoded(M, D, T, mode)
        if plan.complex:
            D = D[0] + D[1]
        if nonfinite:  # an inf or NaN result is reported with an infinite bound
            ref = self._float64_reference(arrays)
            D = array_module(D).where(array_module(ref).isfinite(ref), D, np.inf)
        return D

    def _leaves(self, ops, kinds, cplx, xp) -> Callable:
        """``leaf(step)``: an :class:`~.ir.Encode` step's operand (or operand ``i``'s) as encoded (constants from the
        cache), made once."""
        leaves: dict = {}

        def leaf(st):
            i = st if isinstance(st, int) else st.source
            if i not in leaves:
                leaves[i] = (self._const_array(i, cplx[i], xp) if kinds[i] == "const"
                             else _leaf_array(self.terms[i], self.sizes, ops[i], cplx[i]))
            return leaves[i]

        return leaf

    def _run(self, arrays, backend, track: bool, parsed: Optional[tuple] = None, widths: Optional[tuple] = None):
        """Execute on ``arrays`` (``parsed``: their :meth:`_operands`, where the caller has them; ``widths``: see
        :meth:`_plan`)."""
        ops, kinds, cplx, tensors, nonfinite = parsed or self._operands(arrays)
        out_cplx = any(cplx)
        if tensors and out_cplx:
            raise TypeError("einsum: complex operands cannot be mixed with RNSTensor operands (those are real)")
        be, xp, be_name = self._backend(ops, kinds, backend)
        out_shape = tuple(self.sizes[c] for c in self.output)
        if any(n == 0 for n in self.sizes.values()):
            if self.decode is None:
                raise ValueError("einsum: decode=None needs non-empty operands")
            z = xp.zeros(out_shape, np.complex128 if out_cplx else np.float64)
            return z[()] if z.ndim == 0 and xp is np else z  # a 0-d result is a scalar, as numpy's
        plan = self._plan(kinds, cplx, tensors, widths)
        leaf = self._leaves(ops, kinds, cplx, xp)

        def encoded(st):
            i = st.source
            if kinds[i] != "const":
                self._check_exact(i, leaf(st), st)
                T = _encode_leaf(leaf(st), self.basis, st.bits, st.shared)
                return value_of(T, (_C if cplx[i] else "") + _unique(self.terms[i]), st.bound)
            return self._const_value(st, cplx[i], xp)

        observer = EntrywiseErrors(self.basis, leaf) if track else None
        vals = execute(plan, be, be_name, encoded=encoded, operand=lambda st: ops[st.source],
                       tables=getattr(be, "constants", None), observer=observer)
        Z = vals[plan.out]
        planes, exp = permuted(Z, plan.out_labels)
        W = Value(xp.ascontiguousarray(planes), exp.total().astype(np.int64, order="C", copy=False), Z.factor, Z.bound,
                  plan.out_labels)
        MD = None
        if track:
            perm = [Z.labels.index(c) for c in plan.out_labels]
            MD = tuple(xp.broadcast_to(z, Z.planes.shape[1:]).transpose(perm) for z in observer.err[plan.out])
        return tensor_of(W, self.basis), plan, MD, be_name, nonfinite

    def _const_value(self, st, cplx: bool, xp):
        """The constant of the :class:`~.ir.Encode` step ``st`` encoded (once per width, copied once per device)."""
        i = st.source
        labels = (_C if cplx else "") + _unique(self.terms[i])
        key = ("enc", i, st.bits, cplx)
        if key not in self._const_cache:
            self._check_exact(i, self._const_array(i, cplx), st)
            T = _encode_leaf(self._const_array(i, cplx), self.basis, st.bits, st.shared)
            self._const_cache[key] = value_of(T, labels, st.bound)
        v = self._const_cache[key]
        if array_module(v.planes) is not xp:  # a constant encoded on the other side: copied once
            dkey = key + (xp.__name__,)
            if dkey not in self._const_cache:
                self._const_cache[dkey] = moved(v, xp)
            v = self._const_cache[dkey]
        return Value(v.planes, v.exp, v.factor, v.bound, labels)

    def _fused(self, parsed: tuple, backend, widths: Optional[tuple], mode: str):
        """This call decoded by ``mode``, its program run block by block in cache by the CPU backend's fused
        interpreter (:mod:`rnstensor.backends.cpu_fused`): the bits of :meth:`_run` and its decode, or ``None`` where
        that interpreter does not run it (other backends; complex, RNSTensor or non-finite operands; steps other
        than mode products of one tensor by matrices (constants, or 2-D operands encoded for this call), drops and
        extensions; batch axes other than one leading label)."""
        ops, kinds, cplx, tensors, nonfinite = parsed
        if (tensors or nonfinite or any(cplx) or "input" not in kinds or mode not in ("fp64", "exact")
                or any(n == 0 for n in self.sizes.values())):
            return None
        be, xp, _ = self._backend(ops, kinds, backend)
        if xp is not np or be.name != "cpu":
            return None
        plan = self._plan(kinds, cplx, tensors, widths)
        inputs = [st for st in plan.steps if isinstance(st, ir.Encode) and not st.constant]
        enc = max(inputs, key=lambda st: len(st.labels))  # the tensor; any other input must be a matrix
        matrices = [st for st in inputs if st is not enc]
        if any(len(st.labels) != 2 for st in matrices):
            return None
        nbatch = len(enc.labels) - len(enc.shared)
        in_shape = tuple(self.sizes[c] for c in enc.labels[nbatch:])
        leaf = self._leaves(ops, kinds, cplx, xp)
        from .backends import cpu_fused  # noqa: PLC0415 - numba, loaded on first use

        def pack():
            """The plan packed, its constants (and the matrices, encoded for this call) as operators."""
            consts = [None] * len(self.terms)
            for st in plan.steps:
                if isinstance(st, ir.Encode) and st.constant:
                    consts[st.source] = self._const_value(st, False, np)
                elif st in matrices:
                    self._check_exact(st.source, leaf(st), st)
                    T = _encode_leaf(leaf(st), self.basis, st.bits, st.shared)
                    consts[st.source] = value_of(T, _unique(self.terms[st.source]), st.bound)
            steps = tuple(dataclasses.replace(st, constant=True) if st in matrices else st for st in plan.steps)
            try:
                return cpu_fused.cpu_program(dataclasses.replace(plan, steps=steps), in_shape, consts, nbatch)
            except ValueError:
                return None

        if matrices:  # their residues are this call's: packed per call
            prog = pack()
        else:
            key = ("fused", id(plan))
            if key not in self._const_cache or self._const_cache[key][0] is not plan:
                self._const_cache[key] = (plan, pack())
            prog = self._const_cache[key][1]
        if prog is None:
            return None
        x = leaf(enc)
        self._check_exact(enc.source, x, enc)
        lead = x.shape[:nbatch]
        y = be.chain(prog, x.reshape((math.prod(lead),) + x.shape[nbatch:]), mode).reshape(lead + prog.out_shape)
        last = [st for st in plan.steps if isinstance(st, ir.Contract) and st.out == plan.out][-1]
        y = y.transpose([last.labels.index(c) for c in plan.out_labels])
        return y[()] if y.ndim == 0 else np.ascontiguousarray(y)

    def _check_exact(self, i: int, x, st) -> None:
        """``decode='exact'``: operand ``i`` must be encoded exactly at the plan's width, or the result is not correctly rounded."""
        if self.decode != "exact":
            return
        need = exact_bits_needed(x, st.shared)  # one scalar back from the device
        if need > st.bits:
            raise RNSRangeError(
                f"einsum: decode='exact' promises the correctly rounded result, but operand {i} needs {need} bits to "
                f"be encoded exactly (one exponent per slice along the output indices) and the plan on "
                f"{self.basis!r} encodes it at {st.bits}; use moduli='auto' (the correctly rounded result: it "
                f"chooses the moduli, and splits operands exactly where 49 do not hold them) or decode='fp64'"
            )

    def explain(self) -> str:
        """The contraction path and the residue-domain step of each contraction, with bounds and drops.

        Shown for real non-constant operands (complex ones add a (re, im) axis and a factor 2 to some bounds).
        """
        kinds = tuple("const" if i in self.constants else "input" for i in range(len(self.terms)))
        cplx = tuple(
            bool(np.iscomplexobj(self.constants[i])) if i in self.constants else False for i in range(len(self.terms))
        )
        plan = self._plan(kinds, cplx, {})
        head = [
            f"rnstensor contract_expression {self.subscripts!r}: method {self.method!r}, {self.basis!r} "
            f"(range 2^{self.basis.log2_product - 1:.1f}), decode {self.decode!r}",
            f"opt_einsum path {self.path}",
        ]
        body, k = [], 0
        for line in plan.notes:  # steps numbered; their drops (indented) follow them
            if not line.startswith("  "):
                k += 1
                line = f"{k}. {line}"
            body.append(line)
        tail = [f"fewest bits kept by any operand or intermediate: {plan.kept_bits:.1f}"]
        if self.classical and self.decode == "fp64" and self.method == "rescale_be":
            tail.append(f"moduli=None: every call is certified to meet gamma_{classical_terms(plan, self.sizes)} "
                        f"|A||B|... before it runs (wider plans, else classical GEMMs, where not); last call: "
                        f"{self.last_evaluation or 'none yet'}")
        return "\n".join(head + body + tail)

    def __repr__(self) -> str:
        return f"ContractExpression({self.subscripts!r}, method={self.method!r}, s={len(self.basis)})"


def _arranged(x, labels: str, order: str, sizes: Optional[dict] = None):
    """``x`` (axes ``labels``) with its axes in ``order``; labels it lacks are broadcast to ``sizes``."""
    xp = array_module(x)
    present = [c for c in order if c in labels]
    x = x.transpose([labels.index(c) for c in present]) if present != list(labels) else x
    if len(present) == len(order):
        return x
    dims = iter(x.shape)
    x = x.reshape([next(dims) if c in labels else 1 for c in order])
    return xp.broadcast_to(x, [sizes[c] for c in order])


def _classical_pair(x, xl: str, y, yl: str, keep: str):
    """``x`` and ``y`` (float64 or complex128) summed over their labels absent from ``keep``, as batched classical GEMMs."""
    from .gemm import matmul  # noqa: PLC0415 - the fallback of the classical default only

    sizes = dict(zip(xl, x.shape)) | dict(zip(yl, y.shape))
    batch = "".join(c for c in xl if c in yl and c in keep)
    xk = "".join(c for c in xl if c not in yl and c in keep)
    yk = "".join(c for c in yl if c not in xl and c in keep)
    summed = "".join(c for c in dict.fromkeys(xl + yl) if c not in keep)
    n = lambda labels: math.prod(sizes[c] for c in labels)  # noqa: E731
    X = _arranged(x, xl, batch + xk + summed, sizes).reshape(n(batch), n(xk), n(summed))
    Y = _arranged(y, yl, batch + summed + yk, sizes).reshape(n(batch), n(summed), n(yk))
    Z = matmul(X, Y)
    return Z.reshape([sizes[c] for c in batch + xk + yk]), batch + xk + yk


def _classical_single(x, xl: str, out: str):
    """``x`` summed over its labels absent from ``out`` (a classical GEMM with a column of ones), axes as ``out``."""
    from .gemm import matmul  # noqa: PLC0415

    summed = "".join(c for c in xl if c not in out)
    kept = "".join(c for c in xl if c in out)
    if summed:
        sizes = dict(zip(xl, x.shape))
        X = _arranged(x, xl, kept + summed).reshape(-1, math.prod(sizes[c] for c in summed))
        ones = array_module(x).ones(X.shape[1])
        x = matmul(X, ones).reshape([sizes[c] for c in kept])
    return _arranged(x, kept, out), out


def _prepared(term: str, sizes: dict, x, xp):
    """An operand with its diagonals taken and broadcast to the full sizes, float64 or complex128, on ``xp``."""
    x = to_module(x, xp) if array_module(x) is not xp else xp.asarray(x)
    labels = _unique(term)
    if labels != term:
        x = xp.einsum(f"{term}->{labels}", x)  # a diagonal is a selection: exact
    x = xp.broadcast_to(x, tuple(sizes[c] for c in labels))
    return x.astype(np.complex128 if xp.iscomplexobj(x) else np.float64, copy=False)


def _leaf_array(term: str, sizes: dict, x, cplx: bool):
    """An operand as encoded: diagonals taken, broadcast to the full sizes, complex parts stacked first (where it lives)."""
    xp = array_module(x)
    x = xp.asarray(x)
    labels = _unique(term)
    if labels != term:
        x = xp.einsum(f"{term}->{labels}", x)  # a diagonal is a selection: exact
    x = xp.broadcast_to(x, tuple(sizes[c] for c in labels))
    if cplx:
        x = xp.stack([x.real, x.imag])
    return x.astype(np.float64, order="C", copy=False)  # (ascontiguousarray would make a 0-d operand 1-d)


# ----- public functions ---------------------------------------------------------------------


def _check_auto(policy: str, decode, bits, fn: str) -> None:
    """``moduli='auto'`` returns the correctly rounded result: it chooses the widths and decodes exactly itself."""
    if policy != "auto":
        return
    if decode is None:
        raise ValueError(f"{fn}: moduli='auto' returns the correctly rounded float result; decode=None (an RNSTensor) "
                         f"needs an explicit basis")
    if bits is not None:
        raise ValueError(f"{fn}: moduli='auto' chooses the widths that encode every operand exactly; leave bits=None "
                         f"(got bits={bits!r})")


def _check_rtol(rtol, policy: str, decode, bits, fn: str) -> Optional[float]:
    """``rtol=``: a target for the default (``moduli=None``, the fp64 decode, no ``bits``), at least ``2**-52``."""
    rtol = check_rtol(rtol, fn)
    if rtol is not None and (policy != "classical" or decode != "fp64" or bits is not None):
        raise ValueError(f"{fn}: rtol chooses the moduli and widths itself; pass it with moduli=None, decode='fp64' "
                         f"and bits=None")
    return rtol


def _check_options(method: str, decode, moduli, bits) -> Basis:
    if method not in EINSUM_METHODS:
        raise ValueError(f"method must be one of {EINSUM_METHODS}; got {method!r}")
    if decode not in _DECODES:
        raise ValueError(f"decode must be one of {_DECODES}; got {decode!r}")
    if bits is not None and (isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or bits < 1):
        raise ValueError(f"bits must be a positive integer or None; got {bits!r}")
    if isinstance(moduli, (int, np.integer)) and not isinstance(moduli, bool):
        moduli = moduli_count(moduli)
    return as_basis(moduli, "moduli")


def contract_expression(
    subscripts: str,
    *shapes_or_arrays,
    constants: Sequence[int] = (),
    moduli: Union[None, int, Basis, Sequence[int]] = None,
    method: str = "rescale_be",
    optimize: Any = "auto",
    decode: Optional[str] = "fp64",
    bits: Optional[int] = None,
    backend: Optional[str] = None,
    min_bits: int = MIN_BITS,
    nonfinite: str = "propagate",
    rtol: Optional[float] = None,
) -> ContractExpression:
    """Plan an einsum expression once; apply it to many operands in the residue domain.

    Shaped like :func:`opt_einsum.contract_expression`: pass a shape for each
    operand, or the array itself at the positions listed in ``constants``.
    Constants (e.g. the 1-D operators of sum factorization) are encoded once
    and their residues cached; the path (opt_einsum) and the plan (widths,
    drops, base extensions) are built once.

    Parameters
    ----------
    subscripts : str
        An einsum expression; ``...``, implicit output and diagonals allowed.
    *shapes_or_arrays
        One shape per operand; arrays at the ``constants`` positions.
    constants : sequence of int
        Operand positions whose arrays are fixed.
    moduli : None, 'fast', 'auto', int, Basis or sequence of int
        The residue basis (an int ``s``: the first ``s`` INT8 moduli).
        ``'auto'``: the correctly rounded value of the whole expression on
        every finite input (the library chooses the moduli and widths that
        encode every operand exactly with no rounding drop, and splits
        operands exactly where 49 moduli cannot hold them; exact sums in
        Python integers there, slower). ``'fast'``: the 15-moduli plan,
        uncertified. ``None`` (default): every call on float operands meets the
        classical float64 bound of the same contractions along the same path,
        ``|ŷ - y| <= γ_m (|A| |B| ...)`` entrywise with ``γ_m = m u / (1 - m u)``
        and ``m`` the terms the path's steps sum (``k`` per contraction of
        ``k`` terms, 1 per elementwise product): the 15-moduli plan runs with
        a certification beside it (:mod:`rnstensor.program.classical`), then
        wider encodings on more moduli where that fails, then each pairwise
        step as a classical :func:`rnstensor.matmul` (operands whose slices
        span hundreds of binades). An elementwise product (``m = 1``, one
        rounding) decodes correctly rounded. Where the result or an intermediate of that last
        path is subnormal, float64's absolute rounding there adds to the
        bound, as it does for numpy. Complex results meet ``sqrt(2) γ_m`` of
        the complex magnitudes (``sqrt(2) γ_(m + 2)`` per step on the
        composed path, ZGEMM's bound). RNSTensor operands run the 15-moduli
        plan uncertified. An explicit basis is the fast opt-out: that plan,
        as planned.
    method : {'rescale_be', 'composed'}
    optimize : str, bool, tuple or path
        The contraction order, as :func:`numpy.einsum` takes it: ``False``
        (one contraction of every operand, numpy's default), ``True``
        (``'greedy'``), an :func:`opt_einsum.contract_path` strategy
        (``'auto'``, ``'greedy'``, ``'optimal'``, ...), ``(strategy,
        memory_limit)``, or a path (``['einsum_path', (0, 1), ...]`` or
        ``[(0, 1), ...]``; one that leaves operands uncontracted raises
        :class:`EinsumPathError`). Results meet the same bound on any path.
    decode : {'fp64', 'exact', None}
        ``'fp64'``: faithfully rounded from the result's integer (exact where
        that is a float64). ``'exact'``: the correctly rounded value of the
        true result. The plan then drops no moduli (a drop rounds), encodes
        the operands as wide as the basis allows when ``bits`` is None, and
        every call checks that each operand is encoded exactly, raising
        :class:`RNSRangeError` (how many bits it lacks) where not; where the
        basis cannot hold the whole contraction without a drop,
        :class:`PlanError`. RNSTensor operands count as exact. ``None``:
        return the :class:`RNSTensor`.
    bits : int, optional
        The widest encoding of an operand (default 53; with ``decode='exact'``
        as wide as fits).
    backend : str, optional
    min_bits : int
        The fewest bits an operand or intermediate may keep after the
        planner's narrowing and drops (or ``bits``, when that is smaller); a
        plan below it raises :class:`PlanError` instead of returning a poor
        result.
    nonfinite : {'propagate', 'raise'}
        Operands holding inf or NaN: ``'propagate'`` (default) follows numpy,
        every output whose float64 computation meets one is numpy's (inf or
        NaN) and the rest stays exact and bounded (their residues never read
        those entries); ``'raise'``: a ``ValueError``. Constants must be finite.
    rtol : float, optional
        A target in place of the classical bound (with ``moduli=None``): every
        entry within ``rtol (|A| |B| ...)``, certified before the run on the
        fewest moduli and narrowest widths that meet it (a loose target takes
        fewer than 15 moduli). At least ``2**-52``; a target that no plan
        certifies and the classical GEMMs do not meet raises
        :class:`RNSRangeError` pointing to ``moduli='auto'``.

    Returns
    -------
    ContractExpression

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> A = np.array([[1.0, 2.0], [0.5, -1.0]])
    >>> expr = rt.contract_expression("ij,ai,bj->ab", (2, 2), A, A, constants=[1, 2])
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> expr(X)
    array([[ 5.  , -1.5 ],
           [-1.5 ,  1.25]])
    """
    acc = accuracy_policy(moduli, "contract_expression")
    _check_auto(acc.policy, decode, bits, "contract_expression")
    rtol = _check_rtol(rtol, acc.policy, decode, bits, "contract_expression")
    basis = _check_options(method, decode, acc.moduli or 15, bits)
    constants = tuple(sorted({int(c) for c in constants}))
    n = len(shapes_or_arrays)
    bad = [c for c in constants if not 0 <= c < n]
    if bad:
        raise ValueError(f"constants {bad} are not operand positions (0 to {n - 1})")
    shapes, consts = [], {}
    for i, x in enumerate(shapes_or_arrays):
        if i in constants:
            if isinstance(x, RNSTensor):
                raise TypeError(f"constant {i} must be a float64 or complex128 array, not an RNSTensor")
            x = _as_float(x, i, "constant")  # a CuPy constant stays on the device
            _operand_kind(x, i)
            _check_finite(x, i, "constant")
            consts[i] = x
            shapes.append(x.shape)
        else:
            try:
                shapes.append(tuple(int(d) for d in x))
            except TypeError:
                raise TypeError(
                    f"operand {i} of contract_expression must be a shape (tuple of ints), or list {i} in constants"
                ) from None
    if not isinstance(subscripts, str):
        raise TypeError(f"contract_expression: subscripts must be a string like 'ij,jk->ik'; got {subscripts!r}")
    terms, output = _parse_subscripts(subscripts, shapes)
    return ContractExpression(terms, output, shapes, consts, basis, method, optimize, decode, bits, backend, min_bits,
                              nonfinite, acc.policy, rtol)


def einsum(
    *operands,
    moduli: Union[None, int, Basis, Sequence[int]] = None,
    method: str = "rescale_be",
    optimize: Any = "auto",
    decode: Optional[str] = "auto",
    bits: Optional[int] = None,
    backend: Optional[str] = None,
    min_bits: int = MIN_BITS,
    out: Optional[np.ndarray] = None,
    nonfinite: str = "propagate",
    dtype: Any = None,
    casting: str = "safe",
    order: str = "K",
    rtol: Optional[float] = None,
):
    """Evaluate an einsum expression exactly in residues: one encode per operand, one decode.

    Accepts what :func:`numpy.einsum` accepts — explicit or implicit output,
    ``...`` broadcasting, repeated indices (diagonals, traces), sums over an
    index, outer products, 0-d operands, the interleaved ``(a, [0, 1], b, [1,
    2])`` form — on float64 and complex128 arrays (and what they hold
    exactly: bool, integers up to ``2**53``, float16/32, complex64, converted
    first), and returns what numpy returns for float64 / complex128 (shape,
    index order, dtype). The contraction order comes from
    opt_einsum; each pairwise step runs as a residue operation (a mode
    product, a batched GEMM, a Hadamard/outer product, or a sum), with drops
    and base extensions wherever a bound would leave the range. Unlike numpy:
    no ``order=``; the result is always a new array (numpy
    returns views of pure transposes and diagonals); integer, bool and
    float16/32 operands give float64 results (numpy computes in their type,
    wrapping or rounding).

    Parameters
    ----------
    *operands
        ``subscripts, a, b, ...`` or the interleaved form. RNSTensor operands
        (real, on the same basis) are contracted without re-encoding.
    moduli : None, 'fast', 'auto', int, Basis or sequence of int, optional
        The residue basis; an int ``s`` means the first ``s`` INT8 moduli.
        Default: the classical float64 bound on float operands (see
        :func:`contract_expression`), or the basis of the RNSTensor operands.
        ``'auto'``: correctly rounded; ``'fast'``: the 15-moduli plan,
        uncertified (see :func:`contract_expression`).
    method : {'rescale_be', 'composed'}
    optimize : str, bool, tuple or path
        The contraction order (default ``'auto'``); numpy's values too, see
        :func:`contract_expression`.
    decode : {'auto', 'fp64', 'exact', None}
        How the result leaves the residues; ``None`` returns an
        :class:`RNSTensor` (real operands only). ``'auto'`` (default) is
        ``'fp64'``, or ``None`` when every operand is an RNSTensor (so
        opt_einsum's ``backend='rnstensor'`` keeps intermediates in residues).
        ``'exact'``: correctly rounded with respect to the true result, or an
        error saying why not (see :func:`contract_expression`).
    bits : int, optional
        The widest encoding of an operand (default 53; with ``decode='exact'``
        as wide as the basis allows).
    backend : str, optional
    min_bits, nonfinite, rtol
        See :func:`contract_expression`.
    out : ndarray, optional
        Where to write the result (numpy's ``out``): the result's shape, and
        float64 or complex128 as the result (complex128 also takes a real result);
        a CuPy array for CuPy operands. The result is complete before ``out``
        is written, so ``out`` may be one of the operands. Returned.
    dtype : {None, float64, complex128}
        numpy's ``dtype``: ``complex128`` returns a complex result for real
        operands (exactly); ``float64`` takes complex operands only with
        ``casting='unsafe'`` (their real parts, as numpy).
    casting : {'no', 'equiv', 'safe', 'same_kind', 'unsafe'}
        numpy's rule for casting the operands to ``dtype`` and the float64 /
        complex128 result into ``out`` (``'unsafe'`` writes it into an int
        or float32 ``out`` as numpy's assignment does: truncated, rounded).
    order : {'C', 'F', 'A', 'K'}
        The result's memory layout: ``'C'`` or ``'F'``; ``'A'`` and ``'K'``
        (the default) keep the result's own (C) layout, where numpy's
        ``'K'`` follows the operands'. The result is always a new array.

    Returns
    -------
    ndarray (or numpy scalar for a 0-d result), or RNSTensor

    Raises
    ------
    ValueError
        Subscripts that do not fit the operands (numpy's rules), sizes that
        disagree, integers beyond ``2**53``, ``out`` of the wrong shape or
        a dtype ``casting`` does not allow, an unknown ``casting``; :class:`EinsumPathError` (also a ``RuntimeError``, as in numpy)
        for an incomplete ``optimize`` path.
    TypeError
        Operands of other dtypes (object, longdouble), ``dtype`` other than
        float64 / complex128, ``out`` not an array, interleaved sublists that
        are not integers 0..51 and ``Ellipsis``.

    Notes
    -----
    Error: by default, the classical float64 bound (see
    :func:`contract_expression`). On an explicit basis each operand is
    encoded with one exponent per slice along the output indices (shared
    along every summed index), so encoding and every drop perturb a value by
    at most ``2**-k`` of its slice's largest magnitude, where ``k`` is the
    kept width shown by :meth:`ContractExpression.explain`; the result error
    is then at most about ``(number of operands + drops) * 2**-k`` times the
    same expression evaluated on those slice maxima, plus the final rounding.

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> a = np.arange(6.0).reshape(2, 3)
    >>> rt.einsum("ij,kj->ik", a, a)
    array([[ 5., 14.],
           [14., 50.]])
    >>> float(rt.einsum("ii", np.eye(3)))
    3.0
    """
    want = _result_dtype(dtype)
    if order not in ("C", "F", "A", "K"):
        raise ValueError(f"einsum: order must be 'C', 'F', 'A' or 'K'; got {order!r}")
    if out is not None and not (isinstance(out, np.ndarray) or is_device_array(out)):
        raise TypeError(f"einsum: out must be an array (numpy.ndarray, or a CuPy array for CuPy operands); "
                        f"got {type(out).__name__}")
    terms, output, arrays = _parse(operands)
    if casting not in CASTINGS:
        raise ValueError(f"einsum: casting must be one of {CASTINGS}; got {casting!r}")
    tensors = [x for x in arrays if isinstance(x, RNSTensor)]
    if want is not None:  # numpy casts each operand to dtype under the casting rule
        for i, x in enumerate(arrays):
            dt = None if isinstance(x, RNSTensor) else x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
            if dt is not None and not np.can_cast(dt, want, casting):
                hint = " or casting='unsafe' (numpy's: the real parts)" if want == np.float64 and dt.kind == "c" else ""
                raise TypeError(f"einsum: operand {i} ({dt}) cannot be cast to dtype={np.dtype(want)} under "
                                f"casting={casting!r}; pass dtype=complex128 or None{hint}")
            if dt is not None and want == np.float64 and dt.kind == "c":
                arrays[i] = np.real(x)  # casting='unsafe' asked for it: numpy's complex -> float cast
    acc = accuracy_policy(moduli, "einsum")
    policy = acc.policy
    if moduli is None and tensors:  # RNSTensor operands carry their basis: it runs as planned, uncertified
        policy, moduli = "basis", tensors[0].basis
    if decode == "auto":
        decode = None if tensors and len(tensors) == len(arrays) else "fp64"
    _check_auto(policy, decode, bits, "einsum")
    rtol = _check_rtol(rtol, policy, decode, bits, "einsum")
    if policy == "auto" and tensors:
        raise TypeError("einsum: moduli='auto' takes float operands (an RNSTensor carries its own basis: pass "
                        "moduli=None or its basis)")
    basis = _check_options(method, decode, moduli if policy == "basis" else (acc.moduli or 15), bits)
    expr = _cached_expression(
        tuple(terms), output, tuple(_shape_of(x) for x in arrays), basis, method, optimize, decode, bits, backend,
        min_bits, check_nonfinite(nonfinite), policy, rtol,
    )
    res = expr(*arrays)
    if isinstance(res, RNSTensor):
        if out is not None or want is not None:
            raise ValueError("einsum: out= and dtype= need a decoded result (decode='fp64' or 'exact')")
        return res
    if want == np.complex128 and res.dtype != np.complex128:
        res = res.astype(np.complex128)  # exact: a real float64 is a complex128
    if out is None:
        if order in "CF" and getattr(res, "ndim", 0) > 1:  # 'K' / 'A': the result's own layout (C), a new array
            res = array_module(res).asarray(res, order=order)
        return res
    device = is_device_array(res)
    res = res if device else np.asarray(res)
    kind = "CuPy array" if device else "ndarray"
    if is_device_array(out) != device or out.shape != res.shape:
        raise ValueError(
            f"einsum: out must be a {kind} of shape {res.shape} (where the operands live); got "
            f"{type(out).__name__} {getattr(out, 'shape', '')}"
        )
    if not np.can_cast(res.dtype, out.dtype, casting):
        raise TypeError(f"einsum: Cannot cast the {res.dtype} result into out's {out.dtype} under casting={casting!r} "
                        "(rt.einsum's results are float64 or complex128); pass out of that dtype, or another casting=")
    out[...] = res  # the whole result exists before out is written: out may alias an operand
    return out


def _result_dtype(dtype) -> Optional[type]:
    """``dtype=`` of :func:`einsum`: None, float64 or complex128; others raise TypeError."""
    if dtype is None:
        return None
    try:
        d = np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"einsum: dtype={dtype!r} is not a data type ({e}); pass None, np.float64 or np.complex128") from None
    if d not in (np.float64, np.complex128):
        raise TypeError(
            f"einsum: dtype={d} is not supported; rnstensor.einsum computes float64 or complex128 results "
            f"(float64-accurate); pass dtype=None, np.float64 or np.complex128 and convert the result with .astype"
        )
    return d.type


def _tensor_diagonal(T: RNSTensor, term: str) -> RNSTensor:
    """The diagonal an RNSTensor operand's repeated indices select (residues and exponents: a pure selection)."""
    labels = _unique(term)
    letters = {c: chr(ord("a") + k) for k, c in enumerate(labels)}
    src, dst = "".join(letters[c] for c in term), "".join(letters[c] for c in labels)
    xp = array_module(T.residues)
    planes = xp.ascontiguousarray(xp.einsum(f"z{src}->z{dst}", T.residues))
    exp = xp.einsum(f"{src}->{dst}", xp.broadcast_to(T.exponent().astype(np.int64, copy=False), T.shape))
    return RNSTensor(planes, T.basis, T.active, T.bound, Scale(0, T.scale.factor, (None,) * len(labels), exp))


def _tensor_broadcast(T: RNSTensor, labels: str, sizes: dict) -> RNSTensor:
    """An RNSTensor operand with its size-1 axes repeated to the index sizes (numpy's broadcasting; exact)."""
    full = tuple(sizes[c] for c in labels)
    if tuple(T.shape) == full:
        return T
    xp = array_module(T.residues)
    planes = xp.ascontiguousarray(xp.broadcast_to(T.residues, (T.residues.shape[0],) + full))
    exp = xp.broadcast_to(T.exponent().astype(np.int64, copy=False), full)
    return RNSTensor(planes, T.basis, T.active, T.bound, Scale(0, T.scale.factor, (None,) * len(full), exp))


def _shape_of(x) -> tuple:
    if isinstance(x, RNSTensor):
        return tuple(x.shape)
    return tuple(np.shape(x))


_EXPR_CACHE: dict = {}


def _cached_expression(terms, output, shapes, basis, method, optimize, decode, bits, backend, min_bits,
                       nonfinite, policy="basis", rtol=None) -> ContractExpression:
    key = (terms, output, shapes, basis, method, _path_option(optimize, len(terms)), decode, bits, backend, min_bits,
           nonfinite, policy, rtol)
    expr = _EXPR_CACHE.get(key)
    if expr is None:
        expr = ContractExpression(terms, output, shapes, {}, basis, method, optimize, decode, bits, backend, min_bits,
                                  nonfinite, policy, rtol)
        if len(_EXPR_CACHE) > 256:
            _EXPR_CACHE.clear()
        _EXPR_CACHE[key] = expr
    return expr


# ----- opt_einsum backend ('rnstensor') -------------------------------------------------------


def tensordot(a, b, axes=2, *, moduli: Union[None, int, Basis, Sequence[int]] = None):
    """:func:`numpy.tensordot` in residues; RNSTensor operands give an RNSTensor (opt_einsum's backend hook).

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> rt.tensordot(np.eye(2), np.array([[1.0, 2.0], [3.0, 4.0]]), axes=1)
    array([[1., 2.],
           [3., 4.]])
    """
    na, nb = len(a.shape), len(b.shape)
    if isinstance(axes, (int, np.integer)):
        ax_a, ax_b = list(range(na - axes, na)), list(range(axes))
    else:
        ax_a, ax_b = axes
        ax_a = [ax_a] if isinstance(ax_a, (int, np.integer)) else list(ax_a)
        ax_b = [ax_b] if isinstance(ax_b, (int, np.integer)) else list(ax_b)
    if len(ax_a) != len(ax_b):
        raise ValueError(f"tensordot: axes lists of different lengths {ax_a} and {ax_b}")
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    la = letters[:na]
    lb = letters[na : na + nb]
    for i, j in zip(ax_a, ax_b):
        lb[j % nb] = la[i % na]
    out = [c for i, c in enumerate(la) if i not in [x % na for x in ax_a]]
    out += [c for j, c in enumerate(lb) if j not in [x % nb for x in ax_b]]
    return einsum(f"{''.join(la)},{''.join(lb)}->{''.join(out)}", a, b, moduli=moduli)


def transpose(a, axes=None):
    """:func:`numpy.transpose` of an array or an RNSTensor (residues and exact scale permuted)."""
    if not isinstance(a, RNSTensor):
        return np.transpose(a, axes)
    nd = a.ndim
    axes = tuple(range(nd))[::-1] if axes is None else tuple(int(x) % nd for x in axes)
    if sorted(axes) != list(range(nd)):
        raise ValueError(f"transpose: axes {axes} are not a permutation of {nd} axes")
    s = a.scale
    field = None if s.field is None else s.field.transpose(axes)
    scale = Scale(s.exp2, s.factor, tuple(s.axes[i] for i in axes), field)
    negz = None if a.negative_zeros is None else a.negative_zeros.transpose(axes)
    return RNSTensor(a.residues.transpose((0,) + tuple(i + 1 for i in axes)), a.basis, a.active, a.bound, scale, negz)
