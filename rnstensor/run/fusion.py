"""The front ends' side of the fusion door: a backend's compiled program made once per key, run where it pays."""

from __future__ import annotations

from typing import Callable, Hashable

__all__ = ["compiled_program", "takes_fused", "fused_program"]


def compiled_program(cache: dict, key: Hashable, be, request: Callable, decode: str,
                     what: str = "the fused interpreter") -> tuple:
    """``(program, None)``: the backend's ``compile_program(request(), decode)``, made once per ``key`` of ``cache``;
    ``(None, reason)`` where the backend has no fused interpreter (the reason names ``what`` runs where), declines
    the program, or the request cannot be built (a ``ValueError`` naming why).

    Examples
    --------
    >>> class NoFusion:
    ...     name = "numpy"
    >>> compiled_program({}, "k", NoFusion(), lambda: None, "fp64")
    (None, "the fused interpreter runs on the 'cpu' and 'cuda' backends, not 'numpy'")
    """
    if key not in cache:
        compile_program = getattr(be, "compile_program", None)
        if not callable(compile_program):
            cache[key] = (None, f"{what} runs on the 'cpu' and 'cuda' backends, not {be.name!r}")
        else:
            try:
                cache[key] = compile_program(request(), decode)
            except ValueError as exc:
                cache[key] = (None, str(exc))
    return cache[key]


def takes_fused(be, found: tuple, tensors: int, required: bool, refusal: str = "") -> bool:
    """Whether to run ``found`` (a :func:`compiled_program`) fused on ``tensors`` tensors: not where it did not
    compile (a ``ValueError`` saying ``refusal`` and why, where ``required``: ``fused=True``), nor where the
    backend's own measurement says step by step is faster, unless ``required``."""
    prog, why = found
    if prog is None:
        if required:
            raise ValueError(f"fused=True: {refusal}{why}")
        return False
    return required or be.fuses(prog, tensors) is None


def fused_program(cache: dict, key: Hashable, be, request: Callable, decode: str, tensors: int, required: bool,
                  what: str = "the fused interpreter", refusal: str = ""):
    """The backend's compiled program to run fused on ``tensors`` tensors, or ``None`` to run step by step: one
    :func:`compiled_program` (made once per ``key``) checked by :func:`takes_fused` (``required``: ``fused=True``,
    a ``ValueError`` saying ``refusal`` and why where it did not compile).

    Examples
    --------
    >>> class NoFusion:
    ...     name = "numpy"
    >>> fused_program({}, "k", NoFusion(), lambda: None, "fp64", tensors=8, required=False) is None
    True
    """
    found = compiled_program(cache, key, be, request, decode, what)
    return found[0] if takes_fused(be, found, tensors, required, refusal) else None
