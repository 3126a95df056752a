"""The residue program: typed steps between one encode per operand and one decode, each with its exact bound.

A program is a sequence of steps over numbered *slots*. A slot holds a
residue value: int8 planes on the basis moduli, an integer bound, and an
exact scale (an integer factor times a power of two per entry, the
exponents constant along every index that is ever summed). Each index of a
value is named by one character (its *label*); a step names the labels of
its operands and its result, so layouts (which axes are contracted, which are
batch, where a new axis goes) are part of the program, decided once when it
is built. Every step carries the bound its result obeys, computed by the
planner exactly as the integers can grow: the executed program never leaves
the centered range.

Builders (einsum, chain plans, FEM operators, GEMM) write programs; the
interpreters in this package read them: :mod:`.execute` runs one on a
backend (NumPy arrays on the CPU, CuPy arrays on the GPU), and its observer
hook carries the running error analysis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from ..basis import Basis

__all__ = ["Encode", "Operand", "Drop", "Reencode", "Fold", "Sum", "Contract", "Contract3M", "Combine", "Add", "Decode",
           "Step", "Program", "CONTRACT_KINDS"]

#: How a :class:`Contract` runs: a mode product of ``x`` along its one contracted index with the 2-D ``y``
#: (``'mode'``; ``'mode_rev'`` the roles swapped), a batched GEMM (``'matmul'``), or an elementwise / outer
#: product when nothing is contracted (``'outer'``).
CONTRACT_KINDS = ("mode", "mode_rev", "matmul", "outer")


@dataclass(frozen=True)
class Encode:
    """Float operand ``source`` (a call argument, or constant ``source`` when ``constant``) encoded at ``bits``.

    The operand is first brought to ``labels`` (``prepare`` of the builder:
    diagonals taken, broadcast, complex parts stacked); entries share one
    exponent along the axes ``shared``. ``bound`` is ``2**bits`` for an
    argument, the exact largest integer for a constant.
    """

    out: int
    source: int
    bits: int
    shared: tuple
    labels: str
    bound: int
    constant: bool = False
    complex: bool = False


@dataclass(frozen=True)
class Operand:
    """An :class:`~rnstensor.RNSTensor` argument ``source`` on the full basis, its exponents made constant along
    ``shared`` (exact power-of-two shifts), with bound ``bound``."""

    out: int
    source: int
    shared: tuple
    labels: str
    bound: int


@dataclass(frozen=True)
class Drop:
    """RnsDrop by ``moduli`` (in that order) of slot ``x``, then base extension when ``extend``; bound ``bound``.

    In a program still to be planned, ``moduli`` is ``None``: a *drop point*
    where the planner (:mod:`rnstensor.planner.program`) chooses them, the
    same for every drop point of one ``group`` (the inputs of one stage).
    """

    out: int
    x: int
    moduli: Optional[tuple]
    extend: bool
    bound: int
    group: int = -1


@dataclass(frozen=True)
class Reencode:
    """Slot ``x`` decoded to float64 and encoded again at ``bits`` (the composed method of [2610.05059])."""

    out: int
    x: int
    bits: int
    shared: tuple
    labels: str
    bound: int


@dataclass(frozen=True)
class Fold:
    """The exponents of slot ``x`` along ``label`` become their largest: the integers stay, and the planner has
    folded the differences into the next operator's columns (the effective operator of [2610.05059] Sec. 5.2)."""

    out: int
    x: int
    label: str


@dataclass(frozen=True)
class Sum:
    """Slot ``x`` (labels ``x_labels``) summed over the labels ``over``: a product with a row of ones."""

    out: int
    x: int
    x_labels: str
    over: str
    bound: int


@dataclass(frozen=True)
class Contract:
    """The pairwise contraction of slots ``x`` and ``y`` (labels ``x_labels``, ``y_labels``).

    ``x_sum`` / ``y_sum`` are summed away first (indices of one operand
    only); ``contracted`` are summed over the product, ``batch`` shared and
    kept, ``x_keep`` / ``y_keep`` each operand's own kept indices. ``kind``
    (:data:`CONTRACT_KINDS`) picks the residue operation; the result has
    ``labels``.
    """

    out: int
    x: int
    y: int
    x_labels: str
    y_labels: str
    x_sum: str
    y_sum: str
    contracted: str
    batch: str
    x_keep: str
    y_keep: str
    kind: str
    labels: str
    bound: int

    def operands(self) -> tuple:
        """``(tensor, its labels, operator, its labels)``: a ``'mode_rev'`` product names its operator first."""
        if self.kind == "mode_rev":
            return self.y, self.y_labels, self.x, self.x_labels
        return self.x, self.x_labels, self.y, self.y_labels

    def gemm_sides(self) -> Optional[str]:
        """``'xy'`` where this step is one plain GEMM of its operands with rows ``x_keep`` and columns ``y_keep``
        (the result's axes in that order), ``'yx'`` where the rows are ``y_keep``, else ``None``: a matmul or a mode
        product with no batch index and nothing summed first, its new axis the result's last or first."""
        if self.kind not in ("matmul", "mode", "mode_rev") or self.batch or self.x_sum or self.y_sum:
            return None
        if self.labels == self.x_keep + self.y_keep:
            return "xy"
        return "yx" if self.labels == self.y_keep + self.x_keep else None

    def in_place(self) -> bool:
        """Whether this mode product's operator is ``(new, contracted)`` and the new axis takes the contracted
        one's place (under its own label or the same), every other axis staying where it was."""
        _, tl, _, ol = self.operands()
        if len(ol) != 2 or ol[1] != self.contracted or len(self.labels) != len(tl):
            return False
        at = tl.index(self.contracted)
        return self.labels[:at] + self.labels[at + 1:] == tl[:at] + tl[at + 1:]


@dataclass(frozen=True)
class Contract3M:
    """The exact 3M complex mode product of slot ``x`` with the complex 2-D operator ``y``.

    Both carry their (re, im) axis as the first label. ``contracted`` is the
    one index of ``x`` summed with ``y``'s last; ``y``'s row index takes its
    place in ``labels``. In residues: ``P0 = y_re x_re``, ``P1 = y_im x_im``,
    ``P2 = (y_re + y_im)(x_re + x_im)``, ``Re = P0 - P1``, ``Im = P2 - P0 - P1``
    (3 products instead of 4; all exact). ``bound`` bounds both parts.
    """

    out: int
    x: int
    y: int
    x_labels: str
    y_labels: str
    contracted: str
    labels: str
    bound: int


@dataclass(frozen=True)
class Combine:
    """The exact 4M complex combination of a product of two complex values.

    Slot ``x`` holds both operands' (re, im) axes, ``re_x`` and ``re_y``
    (labels of ``x``); the result ``(Re, Im) = (P00 - P11, P01 + P10)``
    carries one (re, im) axis first, labels ``labels``.
    """

    out: int
    x: int
    re_x: str
    re_y: str
    labels: str


@dataclass(frozen=True)
class Add:
    """``x + y`` (or ``x - y``) of two values with equal labels, moduli and scale; bound ``bound``."""

    out: int
    x: int
    y: int
    subtract: bool
    bound: int


@dataclass(frozen=True)
class Decode:
    """Slot ``x`` to float64 (``'fp64'`` or ``'exact'``), times ``alpha``.

    A real ``alpha``'s significand and exponent join the exact scale, so
    ``'exact'`` gives the correctly rounded ``alpha * value``. ``complex``:
    the first axis of ``x`` holds (re, im), the result is complex128, and a
    complex ``alpha = ar + i ai`` gives ``(ar Re - ai Im) + i (ar Im + ai Re)``,
    each product correctly rounded and one float64 sum per part.
    """

    out: int
    x: int
    mode: str
    alpha: complex = 1.0
    complex: bool = False


Step = Union[Encode, Operand, Drop, Reencode, Fold, Sum, Contract, Contract3M, Combine, Add, Decode]


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a cache key of the kernels built for it
class Program:
    """A residue program on ``basis``: its steps, the slot and labels of its result, and what its planner said.

    ``notes`` are the planner's lines (``explain()``), ``kept_bits`` the
    fewest bits any operand or intermediate keeps.
    """

    basis: Basis
    steps: tuple
    out: int
    out_labels: str
    complex: bool = False
    notes: tuple = ()
    kept_bits: float = float("inf")
    nslots: Optional[int] = None
