"""Residue bases: the INT8 moduli pool and the exact tables built once per basis."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

__all__ = [
    "Basis",
    "int8_pool",
    "moduli_count",
    "centered",
    "mrc_order",
    "log2_int",
    "MrcTables",
    "DropExtendSchedule",
    "mrc_digit_coeffs",
    "pow2_cycle",
    "drop_extend_schedule",
]


def centered(r: int, p: int) -> int:
    """Centered residue of the integer ``r`` modulo ``p``: in ``[-floor(p/2), ceil(p/2) - 1]``."""
    r %= p
    return r if r < (p + 1) // 2 else r - p


def log2_int(n: int) -> float:
    """``log2(n)`` of a (possibly huge) positive Python int, ``-inf`` for 0."""
    if n <= 0:
        return float("-inf")
    shift = max(n.bit_length() - 60, 0)
    return math.log2(n >> shift) + shift


@lru_cache(maxsize=None)
def int8_pool() -> tuple[int, ...]:
    """The INT8 moduli pool: greedy from 256 downward, each coprime to all kept.

    Every centered residue of these moduli fits a signed byte. The pool has 49
    moduli (256, 255, 253, 251, 247, ...) and product about 2^342.
    """
    kept: list[int] = []
    for m in range(256, 1, -1):
        if all(math.gcd(m, k) == 1 for k in kept):
            kept.append(m)
    return tuple(kept)


class MrcTables:
    """Exact tables for mixed-radix conversion on one ordered set of moduli.

    ``order`` is the conversion order (the even modulus first, if any).
    ``inv[i, j] = order[i]^{-1} mod order[j]`` for ``i < j`` (0 elsewhere).
    ``radix_mod[i, t] = [prod(order[:i])]_{targets[t]}`` for the positional
    weights of digit ``i`` reduced modulo every basis modulus ``targets[t]``.
    """

    __slots__ = ("order", "perm", "inv", "targets", "radix_mod")

    def __init__(self, order: tuple[int, ...], perm: tuple[int, ...], targets: tuple[int, ...]):
        m = len(order)
        self.order = order
        #: positions of ``order`` within the active tuple the tables were built for
        self.perm = perm
        inv = np.zeros((m, m), dtype=np.int64)
        for i in range(m):
            for j in range(i + 1, m):
                inv[i, j] = pow(order[i], -1, order[j])
        self.inv = inv
        self.targets = targets
        radix = np.zeros((m, len(targets)), dtype=np.int64)
        w = 1
        for i in range(m):
            for t, p in enumerate(targets):
                radix[i, t] = w % p
            w *= order[i]
        self.radix_mod = radix


def moduli_count(s, name: str = "moduli") -> int:
    """``s`` as a count of INT8 moduli: an integer in ``1..49`` (the pool), the one range every entry point accepts.

    Whether ``s`` moduli hold a computation is its plan's question (a
    :class:`~rnstensor.PlanError` or :class:`~rnstensor.RNSRangeError`
    with the bits needed), not this one's.
    """
    n = len(int8_pool())
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 1 <= s <= n:
        raise ValueError(f"{name} must be a number of INT8 moduli, an integer in 1..{n}; got {s!r}")
    return int(s)


class Basis:
    """An ordered set of pairwise coprime moduli, each in ``2..256``.

    Parameters
    ----------
    moduli : sequence of int
        The moduli, in the order the residue planes are stored.

    Raises
    ------
    ValueError
        If a modulus is not an integer in 2..256, repeats, or shares a factor
        with another one (the message names the offending values).

    Examples
    --------
    >>> B = Basis.int8(3)
    >>> B.moduli
    (256, 255, 253)
    >>> B.product == 256 * 255 * 253
    True
    >>> Basis((7, 5, 3)).product
    105
    """

    __slots__ = ("_moduli", "_product", "__weakref__")

    def __init__(self, moduli: Iterable[int]):
        mods = tuple(moduli)
        if not mods:
            raise ValueError("Basis(moduli): need at least one modulus; got an empty sequence")
        bad = [m for m in mods if isinstance(m, bool) or not isinstance(m, (int, np.integer))]
        if bad:
            raise ValueError(f"Basis(moduli): moduli must be Python/numpy integers; got {bad!r}")
        mods = tuple(int(m) for m in mods)
        out = [m for m in mods if not 2 <= m <= 256]
        if out:
            raise ValueError(
                f"Basis(moduli): every modulus must lie in 2..256 so that its centered "
                f"residues fit int8; out of range: {out}"
            )
        dups = sorted({m for m in mods if mods.count(m) > 1})
        if dups:
            raise ValueError(f"Basis(moduli): duplicate moduli {dups}; each modulus may appear once")
        pairs = [
            (a, b)
            for i, a in enumerate(mods)
            for b in mods[i + 1 :]
            if math.gcd(a, b) != 1
        ]
        if pairs:
            shown = ", ".join(f"{a} and {b} (gcd {math.gcd(a, b)})" for a, b in pairs[:5])
            more = f" and {len(pairs) - 5} more pairs" if len(pairs) > 5 else ""
            raise ValueError(f"Basis(moduli): moduli must be pairwise coprime; {shown}{more} are not")
        self._moduli = mods
        self._product = math.prod(mods)

    @classmethod
    def int8(cls, s: int) -> "Basis":
        """The first ``s`` moduli of the INT8 pool (``1 <= s <= 49``).

        Examples
        --------
        >>> round(Basis.int8(15).log2_product, 1)
        117.8
        """
        return _int8_basis(moduli_count(s, "Basis.int8(s): s"))

    @property
    def moduli(self) -> tuple[int, ...]:
        """The moduli, in plane order."""
        return self._moduli

    @property
    def product(self) -> int:
        """The exact product of all moduli (a Python int)."""
        return self._product

    @property
    def log2_product(self) -> float:
        """``log2`` of the product."""
        return log2_int(self._product)

    def __len__(self) -> int:
        return len(self._moduli)

    def __iter__(self):
        return iter(self._moduli)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Basis) and other._moduli == self._moduli

    def __hash__(self) -> int:
        return hash(("Basis", self._moduli))

    def __repr__(self) -> str:
        if len(self._moduli) > 6:
            head = ", ".join(map(str, self._moduli[:4]))
            body = f"({head}, ..., {self._moduli[-1]})"
        else:
            body = repr(self._moduli)
        return f"Basis(s={len(self)}, moduli={body}, log2 P={self.log2_product:.1f})"

    # ----- exact tables, cached per basis -------------------------------------------------

    def index(self, p: int) -> int:
        """Position of modulus ``p`` in this basis."""
        try:
            return self._moduli.index(p)
        except ValueError:
            raise ValueError(f"modulus {p} is not in {self!r}") from None

    def inverse_table(self) -> np.ndarray:
        """``inv[i, j] = moduli[i]^{-1} mod moduli[j]`` (0 on the diagonal), int64."""
        return _inverse_table(self._moduli)

    def mrc_tables(self, active: Sequence[int]) -> MrcTables:
        """Mixed-radix tables for the active moduli, the even one first, weights mod every modulus."""
        return _mrc_tables(self._moduli, tuple(active))

    def pow2_table(self, max_shift: int) -> np.ndarray:
        """``t[i, k] = [2^k]_{moduli[i]}`` (non-negative) for ``0 <= k <= max_shift``, int64."""
        return _pow2_table(self._moduli, int(max_shift))


@lru_cache(maxsize=None)
def _int8_basis(s: int) -> Basis:
    return Basis(int8_pool()[:s])


@lru_cache(maxsize=None)
def _inverse_table(moduli: tuple[int, ...]) -> np.ndarray:
    s = len(moduli)
    inv = np.zeros((s, s), dtype=np.int64)
    for i, q in enumerate(moduli):
        for j, p in enumerate(moduli):
            if i != j:
                inv[i, j] = pow(q, -1, p)
    inv.setflags(write=False)
    return inv


def mrc_order(active: Sequence[int]) -> tuple[int, ...]:
    """Conversion order of a set of moduli: the even modulus (at most one) first, the rest as given."""
    even = [p for p in active if p % 2 == 0]
    return tuple(even) + tuple(p for p in active if p % 2)


@lru_cache(maxsize=256)
def _mrc_tables(moduli: tuple[int, ...], active: tuple[int, ...]) -> MrcTables:
    missing = [p for p in active if p not in moduli]
    if missing:
        raise ValueError(f"active moduli {missing} are not in the basis {moduli}")
    order = mrc_order(active)
    perm = tuple(active.index(p) for p in order)
    return MrcTables(order, perm, moduli)


@lru_cache(maxsize=64)
def _pow2_table(moduli: tuple[int, ...], max_shift: int) -> np.ndarray:
    t = np.empty((len(moduli), max_shift + 1), dtype=np.int64)
    for i, p in enumerate(moduli):
        v = 1 % p
        for k in range(max_shift + 1):
            t[i, k] = v
            v = (v * 2) % p
    t.setflags(write=False)
    return t


class DropExtendSchedule:
    """The exact integers of one fused drop x g + base extension ([2610.05059] Alg. 1 then Alg. 4), per entry.

    Every backend builds its tables from this one schedule. Dropping the moduli
    ``order`` (in that order) from ``active``: ``dperm`` are their plane indices,
    ``alive`` the planes kept, ``rem`` their moduli; with ``Q`` the product of the
    dropped moduli and ``W_i`` the product of the first ``i`` of them, the quotient
    residue on ``p`` in ``rem`` is ``Bc[p] * r_p + sum_i E[p][i] * d_i`` where
    ``d_i`` are the mixed-radix digits of the dropped residues (all centered).
    Extension (``extend``) onto ``targets`` (the basis): ``tsrc[t]`` is the kept
    plane holding target ``t`` or -1; missing targets are ``sum_i Tw[t][i] * m_i``
    with the mixed-radix digits ``m_i`` of the quotient in ``morder``
    (planes ``mperm`` of ``rem``). ``out_active`` are the moduli after the call.
    """

    __slots__ = ("order", "dperm", "alive", "rem", "Bc", "E", "targets", "tsrc", "morder", "mperm", "Tw", "out_active")

    def __init__(self, **kw):
        for k, v in kw.items():
            object.__setattr__(self, k, v)

    def __setattr__(self, name, value):
        raise AttributeError("DropExtendSchedule is immutable")


@lru_cache(maxsize=512)
def drop_extend_schedule(
    active: tuple[int, ...], basis: tuple[int, ...], order: tuple[int, ...], extend: bool, what: str = "drop_extend"
) -> DropExtendSchedule:
    """The :class:`DropExtendSchedule` of dropping ``order`` from ``active`` then (``extend``) restoring ``basis``.

    Raises
    ------
    ValueError
        A modulus of ``order`` is not (or no longer) active.
    """
    alive = list(range(len(active)))
    dperm = []
    for q in order:
        vals = [active[i] for i in alive]
        if q not in vals:
            raise ValueError(f"{what}: cannot drop modulus {q}: it is not among the active moduli {tuple(vals)}")
        iq = alive[vals.index(q)]
        dperm.append(iq)
        alive.remove(iq)
    rem = tuple(active[i] for i in alive)
    Q = math.prod(order)
    Wd = [math.prod(order[:i]) for i in range(len(order))]
    Bc = tuple(centered(pow(Q % p, -1, p), p) for p in rem)
    E = tuple(tuple(centered(-w * pow(Q % p, -1, p), p) for w in Wd) for p in rem)
    if extend:
        targets = tuple(basis)
        tsrc = tuple(rem.index(p) if p in rem else -1 for p in targets)
        morder = mrc_order(rem) if tsrc and min(tsrc) < 0 else ()
    else:
        targets = rem
        tsrc = tuple(range(len(rem)))
        morder = ()
    Tw = tuple(
        tuple(centered(math.prod(morder[:i]), p) for i in range(len(morder))) if tsrc[t] < 0 else ()
        for t, p in enumerate(targets)
    )
    return DropExtendSchedule(
        order=tuple(order), dperm=tuple(dperm), alive=tuple(alive), rem=rem, Bc=Bc, E=E, targets=targets, tsrc=tsrc,
        morder=morder, mperm=tuple(rem.index(q) for q in morder), Tw=Tw, out_active=targets,
    )


@lru_cache(maxsize=512)
def mrc_digit_coeffs(order: tuple[int, ...]) -> np.ndarray:
    """Centered constants of the one-reduction mixed-radix digits in conversion ``order`` (float32, read-only).

    ``d_i = [C[i, i] x_i + sum_{k<i} C[i, k] d_k]_{q_i}`` with ``W_i = q_0 ... q_{i-1}``,
    ``C[i, i] = [W_i^{-1}]_{q_i}`` and ``C[i, k] = [-W_k W_i^{-1}]_{q_i}``; shape
    ``(m, max(m, 1))``. Every entry is an integer of magnitude at most 128, exact in float32.
    """
    m = len(order)
    C = np.zeros((m, max(m, 1)), np.float32)
    W = 1
    for i, q in enumerate(order):
        wi = pow(W % q, -1, q)
        C[i, i] = centered(wi, q)
        w = 1
        for k in range(i):
            C[i, k] = centered(-w * wi, q)
            w *= order[k]
        W *= q
    C.setflags(write=False)
    return C


@lru_cache(maxsize=None)
def pow2_cycle(p: int) -> tuple[int, int]:
    """``(a, t)``: ``2**a`` divides ``p`` exactly and ``t`` is the period of 2 modulo the odd part ``p >> a``.

    Then ``[2^k]_p = [2^(a + (k - a) % t)]_p`` for every ``k >= a``: the
    residues of huge powers of two come from a table of ``a + t`` entries.

    Examples
    --------
    >>> pow2_cycle(256), pow2_cycle(255), pow2_cycle(7)
    ((8, 1), (0, 8), (0, 3))
    """
    a = (p & -p).bit_length() - 1
    o = p >> a
    t = 1
    if o > 1:
        x = 2 % o
        while x != 1:
            x = (x * 2) % o
            t += 1
    return a, t
