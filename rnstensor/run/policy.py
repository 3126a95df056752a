"""The one accuracy policy: what ``moduli=`` and ``rtol=`` mean, the same in every entry point.

``None`` (default)
    Certified before the run on the narrowest plan that meets the default's
    bound (wider encodings on more moduli where the 15-moduli plan does
    not), else correctly rounded (as ``'auto'``) where one exact plan of 49
    moduli holds the operands, else classical products (the classical
    float64 bound ``gamma_m`` of the same computation). The bound, in every
    entry point (einsum, contract expressions, chain plans, ``dgemm``,
    ``zgemm``, ``matmul`` and their Dask forms): every entry within
    :data:`DEFAULT_RTOL` ``= (1 + 2**-5) u`` of its exact magnitude
    contraction ``|A||B|...`` (``gamma_m`` where smaller,
    :func:`default_target`). Verdicts are per element (each tensor of a
    chain's batch, each slice along an expression's first index), so a
    batch's bits do not depend on how it is chunked. A GEMM's width is chosen
    from its whole operands, in memory and in Dask alike.
``'fast'``
    The 53-bit plan on the default basis, uncertified: float64-level
    accuracy on well-scaled data, the least work.
``'auto'``
    The correctly rounded value of the whole expression on every finite
    input: the library chooses the moduli and widths (exact encodings, no
    rounding drop); where 49 moduli cannot hold the value, the exact value in
    integers (a GEMM's rows split exactly, an einsum pairwise).
an int ``s``, a :class:`~rnstensor.Basis` or a sequence of moduli
    That basis, as planned (the explicit opt-out).

``rtol=`` (with ``moduli=None``) replaces the classical bound by a target:
every entry within ``rtol`` times the exact magnitude contraction
``(|A||B|...)``, from the fewest moduli whose rigorous bound (or
certificate) meets it; an unreachable target raises with ``moduli='auto'``
(correctly rounded, so within any ``rtol`` accepted) as the fix. The tightest accepted is
:data:`DEFAULT_RTOL`, ``(1 + 2**-5) u``.

Every bound here is relative above float64's normal range. Where a result is
subnormal, its one rounding adds an absolute error of up to ``2**-1075`` (half
the least subnormal), as it does to any float64 result, numpy's included: no
float64 can be within ``rtol`` of a value there, the correctly rounded one is
the closest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..basis import Basis

__all__ = ["Accuracy", "accuracy_policy", "check_rtol", "default_target", "POLICIES", "DEFAULT_MODULI", "DEFAULT_RTOL",
           "FALLBACK_PAIRWISE"]

#: what each ``moduli=`` selects; ``'basis'`` is an explicit one
POLICIES = ("classical", "fast", "auto", "basis")

#: the basis of ``None`` and ``'fast'`` plans (15 INT8 moduli, log2 P = 117.8)
DEFAULT_MODULI = 15

#: The default target (``moduli=None``, every entry point): every entry within ``(1 + 2**-5) u`` of its exact magnitude
#: contraction ``(|A||B|...)``, the final rounding (``u |y|``) included, so the residue result errs by at most ``u / 32``
#: of it before its one rounding. Measured (BENCHMARKS.md, "The default against numpy"): no entry of phi = 4 GEMMs
#: less accurate than numpy's own float64 result, where the classical bound gamma_k left 0.07-0.14 %; on 4-index
#: transforms of wide integrals (n = 8..32) at most 0.07 % of entries (1.5 u: still 9 % at n = 32, where the
#: magnitudes exceed the result ~100-fold), where gamma_m left up to 95 %.
DEFAULT_RTOL = (1 + 2.0**-5) * 2.0**-53


#: Whether the correctly rounded fallback, where no residue plan certifies, goes beyond one exact plan of at most 49
#: moduli (the exact value pairwise in Python integers, as moduli='auto' does). No: past that plan the fallback takes
#: the classical GEMMs, so it stays where the data is and as fast; a target they do not meet takes the exact value.
#: Read by einsum / contract expressions and by chain plans alike.
FALLBACK_PAIRWISE = False


def default_target(m: int, rtol: Optional[float] = None) -> float:
    """The relative error a default call must keep, against the exact magnitude contraction (``m``: the terms its
    classical bound counts, a GEMM's ``k``).

    ``rtol`` where the caller gave one; else :data:`DEFAULT_RTOL`, or
    ``gamma_m`` where that is smaller (``m <= 1``: one product, exact where it
    can be and correctly rounded).
    """
    if rtol is not None:
        return rtol
    from ..program.classical import gamma  # noqa: PLC0415 - the classical bound's own rounding

    return min(gamma(m), DEFAULT_RTOL)


@dataclass(frozen=True)
class Accuracy:
    """A call's accuracy policy (one of :data:`POLICIES`) and the basis it plans on first (``None``: it chooses)."""

    policy: str
    moduli: object = None

    @property
    def certified(self) -> bool:
        return self.policy == "classical"

    @property
    def correctly_rounded(self) -> bool:
        return self.policy == "auto"


def accuracy_policy(moduli, fn: str) -> Accuracy:
    """``moduli=`` of ``fn`` as an :class:`Accuracy`; a ``ValueError`` naming the choices for anything else.

    Examples
    --------
    >>> accuracy_policy(None, "einsum").policy, accuracy_policy("auto", "einsum").policy
    ('classical', 'auto')
    >>> accuracy_policy(20, "einsum")
    Accuracy(policy='basis', moduli=20)
    """
    if moduli is None:
        return Accuracy("classical", DEFAULT_MODULI)
    if isinstance(moduli, str):
        if moduli == "fast":
            return Accuracy("fast", DEFAULT_MODULI)
        if moduli == "auto":
            return Accuracy("auto", None)
        raise ValueError(f"{fn}: moduli must be None, 'fast', 'auto', an int 1..49, a Basis or a sequence of moduli; "
                         f"got {moduli!r}")
    if isinstance(moduli, (bool, np.bool_)):
        raise ValueError(f"{fn}: moduli must be None, 'fast', 'auto', an int 1..49, a Basis or a sequence of moduli; "
                         f"got {moduli!r}")
    if isinstance(moduli, (Basis, int, np.integer)) or hasattr(moduli, "__len__"):
        return Accuracy("basis", moduli)
    raise ValueError(f"{fn}: moduli must be None, 'fast', 'auto', an int 1..49, a Basis or a sequence of moduli; "
                     f"got {moduli!r}")


def check_rtol(rtol, fn: str) -> Optional[float]:
    """``rtol=`` of ``fn``: ``None`` or a float at least :data:`DEFAULT_RTOL` (the final rounding alone may take
    ``u = 2**-53`` of it; a float64 result is never closer)."""
    if rtol is None:
        return None
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float, np.floating, np.integer)):
        raise TypeError(f"{fn}: rtol must be a float (the largest error relative to |A||B|..., entry by entry); "
                        f"got {type(rtol).__name__}")
    rtol = float(rtol)
    if not np.isfinite(rtol) or rtol <= 0:
        raise ValueError(f"{fn}: rtol must be a positive finite number (the largest error relative to |A||B|..., "
                         f"entry by entry); got {rtol!r}. For no target leave rtol=None (the default's classical "
                         f"bound), for the closest float64 drop rtol and pass moduli='auto'")
    if rtol < DEFAULT_RTOL:
        raise ValueError(
            f"{fn}: rtol={rtol!r} is below what a certified float64 result can meet ((1 + 2**-5) 2**-53 = "
            f"{DEFAULT_RTOL:.4g} relative to |A||B|..., where the final rounding alone may take 2**-53); for the "
            f"closest float64 drop rtol and pass moduli='auto' (correctly rounded)")
    return rtol
