"""einsum, contract_expression and their checks; tensordot and transpose for opt_einsum's backend='rnstensor'."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np

from ..arrays import CASTINGS, array_module, is_device_array
from ..basis import Basis, moduli_count
from ..encode import as_basis, check_nonfinite
from ..errors import renamed
from ..planner.methods import MIN_BITS
from ..run.policy import accuracy_policy, check_rtol
from ..tensor import RNSTensor, Scale
from .expression import ContractExpression
from .operands import _as_float, _check_finite, _operand_kind
from .parse import _parse, _parse_subscripts, _path_option, _shape_of

__all__ = ["einsum", "contract_expression", "tensordot", "transpose", "EINSUM_METHODS", "_DECODES", "_check_auto",
           "_check_rtol", "_check_options", "_result_dtype", "_EXPR_CACHE", "_cached_expression"]

#: ``'rescale_be'``: residues from one encode per operand to one decode (drops and base
#: extensions keep every intermediate in range). ``'composed'``: every intermediate is
#: decoded to float64 and re-encoded before its next use (the baseline of [2610.05059]).
EINSUM_METHODS = ("rescale_be", "composed")
_DECODES = ("fp64", "exact", None)


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
    """``rtol=``: a target for the default (``moduli=None``, the fp64 decode, no ``bits``), at least ``(1 + 2**-5) 2**-53``."""
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
        encode every operand exactly with no rounding drop; where no plan of
        49 moduli holds the value, it is computed pairwise in Python
        integers, each pair a residue GEMM of limbs: slower). ``'fast'``: the 15-moduli plan,
        uncertified. ``None`` (default): every call on float operands meets
        ``|ŷ - y| <= (1 + 2**-5) u (|A| |B| ...)`` entrywise (``u = 2**-53``,
        the final rounding included; ``γ_m = m u / (1 - m u)`` where smaller,
        ``m`` the terms the path's steps sum: ``k`` per contraction of ``k``
        terms, 1 per elementwise product), certified before the call runs
        (:mod:`rnstensor.program.classical`) on the narrowest plan that meets
        it (the 15-moduli plan, then wider encodings on more moduli), per
        element along the first operand's first index where only it carries
        it and the output keeps it (an expression that is one GEMM of
        its two real operands: each element on the moduli
        :func:`rnstensor.dgemm` gives it alone, with dgemm's bits); where no plan of 49
        moduli certifies, the correctly rounded result where one exact plan
        holds the operands, else each pairwise step as a classical
        :func:`rnstensor.matmul` (operands whose slices span hundreds of
        binades). ``expr.last_evaluation`` says which. An elementwise product (``m = 1``, one
        rounding) decodes correctly rounded. Where the result or an intermediate of that last
        path is subnormal, float64's absolute rounding there adds to the
        bound, as it does for numpy; that path meets the classical bound
        ``γ_m`` of the same contractions. Complex results meet ``sqrt(2)``
        times the bound of the complex magnitudes (``sqrt(2) γ_(m + 2)`` per
        step on the composed path, ZGEMM's bound). RNSTensor operands run the 15-moduli
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
        fewer than 15 moduli). At least ``(1 + 2**-5) 2**-53`` (``1.145e-16``:
        on wide data about numpy's accuracy entry by entry, BENCHMARKS.md);
        a target that no plan
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
    basis = _check_options(method, decode, acc.moduli if acc.policy == "basis" else (acc.moduli or 15), bits)
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
    the result is always a new array (numpy returns views of pure transposes
    and diagonals); integer, bool and float16/32 operands give float64
    results (numpy computes in their type, wrapping or rounding).

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
    order : {'C', 'F', 'A', 'K'}, any case
        The result's memory layout, as numpy's: ``'C'`` or ``'F'``; ``'A'``:
        ``'F'`` where every operand is Fortran-contiguous, else ``'C'``;
        ``'K'`` (the default): numpy's own layout for these operands (C where
        they all are; else the layout numpy's einsum gives, read off one
        numpy call on zeros of the same layout, on NumPy operands). The
        result is always a new array.

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
    if not isinstance(order, str) or order.upper() not in ("C", "F", "A", "K"):
        raise ValueError(f"einsum: order must be 'C', 'F', 'A' or 'K' (any case); got {order!r}")
    order = order.upper()
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
                # (each fix named holds for every operand)
                dts = [y.dtype if hasattr(y, "dtype") else np.asarray(y).dtype for y in arrays
                       if not isinstance(y, RNSTensor)]
                fixes = ["dtype=None"]
                if want != np.complex128 and all(np.can_cast(d, np.complex128, casting) for d in dts):
                    fixes.append("dtype=complex128")
                if casting in ("no", "equiv") and all(np.can_cast(d, want, "safe") for d in dts):
                    fixes.append("casting='safe'")
                if want == np.float64 and dt.kind == "c":
                    fixes.append("casting='unsafe' (numpy's: the real parts)")
                raise TypeError(f"einsum: operand {i} ({dt}) cannot be cast to dtype={np.dtype(want)} under "
                                f"casting={casting!r}; pass {', or '.join(fixes)}")
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
        return _laid_out(res, order, operands, arrays, optimize)
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


def _laid_out(res, order: str, operands, arrays, optimize):
    """``res`` in the memory layout ``order`` asks for (numpy's rules; see :func:`einsum`), a new array either way."""
    if getattr(res, "ndim", 0) <= 1:
        return res
    xp = array_module(res)
    if order == "A":
        order = "F" if all(getattr(x, "flags", None) is not None and x.flags.f_contiguous for x in arrays) else "C"
    if order in "CF":
        return xp.asarray(res, order=order)
    # 'K': C where every operand is; else the layout numpy's einsum itself gives these operands (NumPy only)
    if xp is not np or all(not hasattr(x, "flags") or x.flags.c_contiguous for x in arrays):
        return res
    dummies = [np.zeros_like(x, dtype=np.float64) if isinstance(x, np.ndarray) else x for x in operands]
    try:
        with np.errstate(all="ignore"):
            template = np.einsum(*dummies, optimize=optimize if isinstance(optimize, bool) else False)
    except (TypeError, ValueError):  # numpy does not take these operands as given: the result's own layout
        return res
    if getattr(template, "shape", None) != res.shape:
        return res
    laid = np.empty_like(template, dtype=res.dtype)
    laid[...] = res
    return laid


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


def tensordot(a, b, axes=2, *, moduli: Union[None, int, Basis, Sequence[int]] = None, rtol: Optional[float] = None,
              backend: Optional[str] = None, min_bits: int = MIN_BITS, nonfinite: str = "propagate"):
    """:func:`numpy.tensordot` in residues; RNSTensor operands give an RNSTensor (opt_einsum's backend hook).

    The einsum of the same contraction (:func:`einsum`), with its accuracy
    policy: ``moduli`` (``None``: the certified default, ``'auto'``: correctly
    rounded, ``'fast'``, a count or a basis), ``rtol``, ``backend``,
    ``min_bits`` and ``nonfinite`` as there.

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> rt.tensordot(np.eye(2), np.array([[1.0, 2.0], [3.0, 4.0]]), axes=1)
    array([[1., 2.],
           [3., 4.]])
    """
    na, nb = len(a.shape), len(b.shape)
    if isinstance(axes, (int, np.integer)):
        if not 0 <= axes <= min(na, nb):
            raise ValueError(f"tensordot: axes={int(axes)} must be between 0 and the operands' dimensions ({na} and "
                             f"{nb}); pass a pair of axis lists to contract other axes")
        ax_a, ax_b = list(range(na - axes, na)), list(range(axes))
    else:
        ax_a, ax_b = axes
        ax_a = [ax_a] if isinstance(ax_a, (int, np.integer)) else list(ax_a)
        ax_b = [ax_b] if isinstance(ax_b, (int, np.integer)) else list(ax_b)
    if len(ax_a) != len(ax_b):
        raise ValueError(f"tensordot: axes lists of different lengths {ax_a} and {ax_b}")
    for name, ax, nd in (("a", ax_a, na), ("b", ax_b, nb)):
        if any(not -nd <= int(x) < nd for x in ax) or len({int(x) % nd for x in ax}) != len(ax):
            raise ValueError(f"tensordot: the axes of {name} {ax} must be distinct and within its {nd} dimensions")
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    la = letters[:na]
    lb = letters[na : na + nb]
    for i, j in zip(ax_a, ax_b):
        lb[j % nb] = la[i % na]
    out = [c for i, c in enumerate(la) if i not in [x % na for x in ax_a]]
    out += [c for j, c in enumerate(lb) if j not in [x % nb for x in ax_b]]
    try:
        return einsum(f"{''.join(la)},{''.join(lb)}->{''.join(out)}", a, b, moduli=moduli, rtol=rtol,
                      backend=backend, min_bits=min_bits, nonfinite=nonfinite)
    except (ValueError, TypeError) as exc:  # (einsum's errors, their fixes tensordot's arguments too)
        raise renamed(exc, "tensordot", ("einsum",)) from None


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
