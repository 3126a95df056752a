"""Domain exceptions: a range the basis cannot hold, a plan that cannot run."""

from __future__ import annotations

__all__ = ["RNSRangeError", "PlanError", "EinsumPathError", "range_error"]


class RNSRangeError(ValueError):
    """An integer would leave the centered range of the active moduli.

    Raised instead of wrapping: the residues could no longer determine the
    value. The message states the bits needed, the bits available and what to
    change (more moduli, fewer encoding bits, a drop first, another method).
    """


class PlanError(ValueError):
    """No execution plan satisfies the range checks on the given basis."""


class EinsumPathError(ValueError, RuntimeError):
    """An explicit ``optimize=`` path that does not contract every operand (a RuntimeError in numpy)."""


def range_error(what: str, bound: int, active_product: int, advice: str = "") -> RNSRangeError:
    """An :class:`RNSRangeError` stating the bits needed (``2*bound``) and available (``P_active``)."""
    from .basis import log2_int

    need = log2_int(2 * bound)
    have = log2_int(active_product)
    # (a drop alone divides the range with the bound; with the extension the range comes back: each INT8 modulus
    # dropped gains at least 7 bits)
    count = max(1, -int(-(need - have) // 7))
    advice = advice or (f"encode with fewer bits, drop moduli with the extension first (rt.drop(T, {count}, "
                        f"extend=True) gains at least {7 * count} bits), or use more moduli")
    return RNSRangeError(
        f"{what}: the result needs 2*bound < P_active, i.e. 2^{need:.2f} of range, but the active "
        f"moduli give 2^{have:.2f} (short by {max(need - have, 0.0):.2f} bits); {advice}"
    )
