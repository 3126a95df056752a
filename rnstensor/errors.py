"""Domain exceptions: a range the basis cannot hold, a plan that cannot run."""

from __future__ import annotations

__all__ = ["RNSRangeError", "PlanError", "EinsumPathError", "range_error", "renamed"]


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


def range_error(what: str, bound: int, active_product: int, advice: str = "", active=None) -> RNSRangeError:
    """An :class:`RNSRangeError` stating the bits needed (``2*bound``) and available (``P_active``); ``active``: the
    tensor's active moduli, from which the drop it suggests is counted (``rt.drop`` takes the smallest)."""
    from .basis import log2_int

    need = log2_int(2 * bound)
    have = log2_int(active_product)
    if not advice:
        # a drop divides the bound by the moduli dropped and the extension brings the range back: the fewest of the
        # smallest active moduli whose product covers the shortfall (and a bit for the quotients' rounding)
        short, gain, count = need - have + 1, 0.0, 0
        for q in sorted(active or ()):
            if gain >= short or count + 1 >= len(active):
                break
            gain, count = gain + log2_int(q), count + 1
        drop = (f"drop moduli with the extension first (rt.drop(T, {count}, extend=True) gains {gain:.1f} bits), "
                if active and gain >= short else "")
        advice = f"encode with fewer bits, {drop}or use more moduli"
    return RNSRangeError(
        f"{what}: the result needs 2*bound < P_active, i.e. 2^{need:.2f} of range, but the active "
        f"moduli give 2^{have:.2f} (short by {max(need - have, 0.0):.2f} bits); {advice}"
    )


def renamed(exc: Exception, fn: str, inner: tuple) -> Exception:
    """``exc`` with its message's prefix ``'<one of inner>: '`` (the function ``fn`` called) replaced by ``fn``'s own,
    so that an error names what the user called; ``exc`` itself where it has no such prefix or its type takes no
    message.

    Examples
    --------
    >>> renamed(ValueError("dgemm: c is required"), "matmul", ("dgemm", "zgemm"))
    ValueError('matmul: c is required')
    """
    msg = str(exc)
    for name in inner:
        if msg.startswith(f"{name}: "):
            try:
                out = type(exc)(f"{fn}: " + msg[len(name) + 2:])
            except TypeError:
                return exc
            out.__cause__, out.__suppress_context__ = exc.__cause__, exc.__suppress_context__
            return out.with_traceback(exc.__traceback__)
    return exc
