"""Subscripts to explicit terms: numpy's parse, the interleaved form, index sizes and the path options."""

from __future__ import annotations

import string
from typing import Any, Optional, Sequence

import numpy as np
import opt_einsum

from ..errors import EinsumPathError
from ..tensor import RNSTensor

__all__ = ["_C", "_C2", "_show", "_unique", "_LETTERS", "_term", "_parse_subscripts", "_sublist", "_parse",
           "_path_option", "_label_sizes", "_shape_of"]

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


def _shape_of(x) -> tuple:
    if isinstance(x, RNSTensor):
        return tuple(x.shape)
    return tuple(np.shape(x))
