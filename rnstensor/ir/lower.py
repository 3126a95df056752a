"""A residue program lowered for the fused interpreters: stages, tensors and the output scale, read from its steps.

Both fused interpreters (the CPU's block interpreter and the CUDA kernel
``chain.cu``) read this form, never a chain plan or a FEM operator: the
drops of every input, then sums of mode products along one axis or of
Hadamard products (a *stage*), the active moduli and shape of every tensor,
and the exponent of every output entry for an input and fields encoded with
exponent 0 (:func:`program_stages`); which stage reads a tensor last
(:func:`last_uses`) and the buffers the live tensors take (:class:`SlotPool`).
A front end hands a backend a :class:`FusionRequest` (the program, the input's
shape, the constants' values), the one door into either interpreter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional

import numpy as np

from . import steps as ir

__all__ = ["FusionRequest", "Term", "Stage", "Program", "Tensor", "Partial", "check_one_input", "program_stages",
           "last_uses", "SlotPool"]


@dataclass(frozen=True)
class Term:
    """One term of a stage output: a mode product of input ``input`` with ``op`` (residues on the stage's
    planes, ``(L, n_out, n_in)``), or a Hadamard product with field component ``field``."""

    input: int
    op: Optional[np.ndarray] = None
    field: int = -1


@dataclass(frozen=True)
class Stage:
    """Every input divided by ``dropped`` (RnsDrop, then base extension), then each output a sum of terms:
    all mode products along ``axis`` (``kind='product'``) or all Hadamard products (``'hadamard'``)."""

    inputs: tuple  # tensor ids
    dropped: tuple
    drop_active: tuple  # planes entering the drops
    active: tuple  # planes of the stage
    kind: str
    axis: Optional[int]
    outputs: tuple  # tuple of tuples of Term
    out_ids: tuple


@dataclass(frozen=True)
class Program:
    """A residue program between one encode and one decode, as the fused kernel runs it.

    Tensor id 0 is the encoded input; ``final`` the id of the result.
    ``dexp``: the exponent of every output entry when the input (and every
    field) is encoded with exponent 0; ``factor``: the output's integer factor.
    """

    ndim: int
    in_shape: tuple
    bits: int
    basis: tuple
    extend: bool
    first: tuple  # the input's planes
    stages: tuple
    final: int
    final_active: tuple
    dexp: np.ndarray
    factor: int

    @property
    def axes(self) -> tuple:
        return tuple(st.axis for st in self.stages if st.kind == "product")


@dataclass
class Tensor:
    """What the packer knows of a tensor slot: its kernel tensor id, planes, shape (one tensor), exponents, factor."""

    tid: int
    active: tuple
    shape: tuple
    exp: np.ndarray
    factor: int


@dataclass
class Partial:
    """A stage output being summed: its terms (input slot, operand, axis or None) and its exponents."""

    terms: list
    exp: np.ndarray
    factor: int
    active: tuple
    shape: tuple


@dataclass(frozen=True, eq=False)
class FusionRequest:
    """What every front end (a chain plan, an einsum's mode chains, a FEM operator) hands a backend's
    ``compile_program`` to run fused: a residue program of one input tensor, nothing of the front end itself.

    ``program``: the residue program (:class:`rnstensor.ir.Program`);
    ``in_shape``: one input tensor's shape, behind ``nbatch`` (0 or 1) batch
    axes; ``constants[source]``: every constant's value (host residues,
    exponents, factor), by ``Encode.source``; ``fields[source]``: the field
    component a constant stands for (a FEM operator's Hadamard factor, read
    per element from its encoded field of ``ncomp`` components of ``nq``
    entries each).

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> plan = rt.plan_chain([np.eye(4)] * 2, [0, 1])
    >>> req = plan.fusion_request((4, 4))
    >>> req.in_shape, len(req.stages(max_terms=8).stages)
    ((4, 4), 2)
    """

    program: "ir.Program"
    in_shape: tuple
    constants: list
    nbatch: int = 1
    fields: Mapping = field(default_factory=dict)
    ncomp: int = 0
    nq: int = 0

    def stages(self, max_terms: Optional[int] = None) -> "Program":
        """The program as the fused interpreters run it (:func:`program_stages`).

        Raises
        ------
        ValueError
            Why the program cannot be fused (the same sentence for every front end and backend).
        """
        check_one_input(self.program, tuple(self.in_shape), self.nbatch)
        return program_stages(self.program, tuple(self.in_shape), self.constants, self.fields,
                              nbatch=self.nbatch, max_terms=max_terms)


def check_one_input(program: "ir.Program", in_shape: tuple, nbatch: int) -> None:
    """That ``program`` reads one input tensor, encoded with one exponent per tensor behind ``nbatch`` (0 or 1)
    leading batch axes, as the fused interpreters take it (every other operand a constant).

    Raises
    ------
    ValueError
        Why it does not (a reason it cannot be fused).
    """
    if any(isinstance(st, (ir.Reencode, ir.Decode)) for st in program.steps):
        raise ValueError("a program that decodes between its products (the composed method decodes after every "
                         "product)")
    inputs = [st for st in program.steps if isinstance(st, ir.Encode) and not st.constant]
    if nbatch not in (0, 1):
        raise ValueError(f"{nbatch} batch axes (the fused interpreters take the tensors behind one, or none)")
    if len(inputs) != 1:
        raise ValueError("a program of more than one input tensor")
    if tuple(inputs[0].shared) != tuple(range(nbatch, nbatch + len(in_shape))):
        raise ValueError("the input is encoded with more than one exponent per tensor")


def program_stages(program: "ir.Program", in_shape: tuple, constants: list, fields: dict, nbatch: int = 1,
                   max_terms: Optional[int] = None) -> Program:
    """The fused kernel's view of ``program``: its stages, tensors and output scale, read from its steps.

    ``constants[source]`` is every constant's value (host residues, exponents
    and factor: the program's 1-D operators); ``fields[source]`` the field
    component a constant stands for (a Hadamard factor, read per element by
    the kernel, whose exponent it adds itself). A stage is the drops of its
    inputs (all by the same moduli) followed by sums of mode products along
    one axis, or of Hadamard products; a new stage starts at a drop, at
    another kind or axis, or where a product reads what this stage writes.
    The first ``nbatch`` labels of every tensor are its batch axes (a chain
    plan's and a FEM operator's one; an einsum operand's leading labels that
    no step contracts), and every mode product must write its new axis where
    the contracted one was; ``max_terms``: the most terms one sum may have
    (the interpreter's limit).

    Raises
    ------
    ValueError
        A step the kernel does not run (a reason it cannot be fused).
    """
    basis = program.basis.moduli
    ndim = len(in_shape)
    slots: dict = {}
    consts: dict = {}
    stages: list = []
    cur: dict = {}
    next_tid = [1]
    extend = True
    first = bits = None

    def new_tid() -> int:
        next_tid[0] += 1
        return next_tid[0] - 1

    def close():
        if not cur:
            return
        parts = cur["parts"]
        outs = [k for k, p in parts.items() if k not in cur["consumed"]]
        recorded, out_ids = [], []
        for k in outs:
            p = parts[k]
            if max_terms is not None and len(p.terms) > max_terms:
                raise ValueError(f"a sum of {len(p.terms)} terms (the fused kernel adds at most {max_terms})")
            rec = []
            for x, operand, axis in p.terms:
                i = cur["inputs"].index(x)
                if axis is None:
                    rec.append(Term(i, field=fields[operand]))
                else:
                    c = constants[operand]
                    have = tuple(c.active or basis)
                    planes = np.asarray(c.planes)[[have.index(q) for q in cur["active"]]]
                    rec.append(Term(i, op=planes))
            recorded.append(tuple(rec))
            t = Tensor(new_tid(), p.active, p.shape, p.exp, p.factor)
            slots[k] = t
            out_ids.append(t.tid)
        stages.append(Stage(tuple(cur["tids"]), cur["dropped"], cur["drop_active"], cur["active"], cur["kind"],
                             cur["axis"], tuple(recorded), tuple(out_ids)))
        for k in outs:
            dropped_from.pop(k, None)  # the slot holds this stage's output now
        cur.clear()

    dropped_from: dict = {}  # a dropped slot -> (the slot of the tensor before its drops, the moduli)
    for st in program.steps:
        if isinstance(st, ir.Encode):
            if st.constant:
                consts[st.out] = st.source
                continue
            if slots:
                raise ValueError("a program that encodes twice: the composed method decodes after every product")
            first, bits = basis, st.bits
            slots[st.out] = Tensor(0, basis, tuple(in_shape), np.zeros((1,) * ndim, np.int64), 1)
        elif isinstance(st, ir.Fold):
            t = slots[st.x]
            exp = t.exp.max(axis=program.out_labels.index(st.label) - nbatch, keepdims=True)
            slots[st.out] = Tensor(t.tid, t.active, t.shape, exp, t.factor)
        elif isinstance(st, ir.Drop):
            close()
            dropped_from[st.out] = (st.x, tuple(st.moduli))
            extend = st.extend
        elif isinstance(st, ir.Contract):
            x, x_labels, y, _ = st.operands()
            if y not in consts or x in consts:
                raise ValueError("a contraction of two tensors (the fused kernel multiplies by operators and fields)")
            operand = consts[y]
            src, moduli = dropped_from.get(x, (x, ()))
            # this product writes st.out: a drop recorded under that id (a program may reuse ids, Drop(out=0, x=0)
            # then Contract(out=0, x=0)) is not what a later step reads there
            dropped_from.pop(st.out, None)
            kind = "hadamard" if st.kind == "outer" else "product"
            if kind == "hadamard" and operand not in fields:
                raise ValueError("an elementwise product with a tensor that is not a field")
            if kind == "product" and st.kind not in ("mode", "mode_rev"):
                raise ValueError(f"a {st.kind!r} contraction (the fused kernel runs mode products)")
            axis = None if kind == "hadamard" else x_labels.index(st.contracted) - nbatch
            if kind == "product" and not st.in_place():
                raise ValueError(f"a mode product that moves axes or contracts its operator's first "
                                 f"({x_labels} -> {st.labels})")
            if cur and (cur["kind"] != kind or cur["axis"] != axis or src in cur["parts"] or
                        cur["dropped"] != moduli):
                close()
            t = slots[src]
            if not cur:
                act = t.active
                for q in moduli:
                    act = tuple(p for p in act if p != q)
                if moduli and extend:
                    act = basis
                cur.update(kind=kind, axis=axis, inputs=[], tids=[], dropped=moduli, drop_active=t.active,
                           active=act, parts={}, consumed=set())
            if src not in cur["inputs"]:
                cur["inputs"].append(src)
                cur["tids"].append(t.tid)
            factor = t.factor * math.prod(moduli)
            if kind == "hadamard":
                exp, shape = t.exp, t.shape
            else:
                c = constants[operand]
                n_out = c.planes.shape[1]
                shape = t.shape[:axis] + (n_out,) + t.shape[axis + 1:]
                if t.exp.shape[axis] != 1:
                    raise ValueError("a product along an axis whose exponents vary (no fold before it)")
                col = [1] * ndim
                col[axis] = n_out
                rows = np.asarray(c.exp.total())
                exp = t.exp + rows.reshape(-1)[:n_out].reshape(col) if rows.size > 1 else t.exp + int(rows.reshape(-1)[0])
                factor *= c.factor
            cur["parts"][st.out] = Partial([(src, operand, axis)], exp, factor, cur["active"], shape)
        elif isinstance(st, ir.Add):
            if not cur or st.x not in cur["parts"] or st.y not in cur["parts"] or st.subtract:
                raise ValueError("a sum the fused kernel does not form (the terms of one stage only)")
            a, b = cur["parts"][st.x], cur["parts"][st.y]
            dropped_from.pop(st.out, None)
            cur["parts"][st.out] = Partial(a.terms + b.terms, a.exp, a.factor, a.active, a.shape)
            cur["consumed"].update((st.x, st.y))
        else:
            raise ValueError(f"a {type(st).__name__} step (the fused kernel runs products, sums, drops)")
    close()
    if program.out not in slots or first is None:
        raise ValueError("a program without a result")
    out = slots[program.out]
    dexp = np.broadcast_to(out.exp, out.shape).astype(np.int64)
    return Program(ndim, tuple(in_shape), bits, basis, extend, first, tuple(stages), out.tid, out.active, dexp,
                    out.factor)



def last_uses(prog: Program) -> dict:
    """The last stage that reads each tensor of ``prog`` (:func:`program_stages`; the result: past the end)."""
    last = {prog.final: len(prog.stages)}
    for k, st in enumerate(prog.stages):
        for i in st.inputs:
            last[i] = max(last.get(i, k), k)
    return last


class SlotPool:
    """The buffers the live tensors of a fused program occupy: slot 0 holds the input, a released slot is the
    next one :meth:`alloc` hands out, and :attr:`count` is how many the program needs."""

    def __init__(self):
        self.count = 1
        self._free: list[int] = []

    def alloc(self) -> int:
        if self._free:
            return self._free.pop()
        self.count += 1
        return self.count - 1

    def release(self, slots) -> None:
        self._free.extend(slots)
