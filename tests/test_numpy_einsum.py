"""numpy's own einsum tests (``numpy/_core/tests/test_einsum.py`` of the installed numpy) run against rt.einsum.

The test module is executed with ``np`` bound to numpy except ``np.einsum``,
which routes every call to :func:`rnstensor.einsum` (``np.einsum_path`` stays
numpy's: it is not what rt implements). Each routed result goes back to
numpy's test, whose own assertions then apply, and is first checked against
independent oracles, because numpy's tests often compare one ``np.einsum``
call with another (both rt here):

* shape, dtype (float64 / complex128) and scalar-ness against numpy's einsum
  of the same operands converted to float64 / complex128 (exactly);
* the exact value (numpy's object einsum over Python ints, compared in
  Python ints) where the contraction is small: rt must be within float64
  einsum's own error bound
  ``gamma_(k + 2n) (|A| |B| ...)`` (``k`` terms per entry, ``n`` operands);
* larger ones: within twice that of numpy's float64 result.

A call rt refuses must be refused by numpy too. Every case must route at
least one call to rt. What does not apply is listed below with its reason:
whole test functions (``SKIPS``) and single calls inside applicable tests
that numpy's einsum keeps (``FORWARDED``, counted per case).
"""

from __future__ import annotations

import builtins
import itertools
import numbers
import os
import re
import types
from collections import Counter

import numpy as np
import pytest

import rnstensor as rt

_np_einsum = np.einsum


def _numpy_test_file() -> str:
    root = os.path.dirname(np.__file__)
    for sub in ("_core", "core"):
        path = os.path.join(root, sub, "tests", "test_einsum.py")
        if os.path.exists(path):
            return path
    pytest.skip(f"numpy {np.__version__} installed without its tests (no test_einsum.py under {root})",
                allow_module_level=True)


NUMPY_TESTS = _numpy_test_file()

#: Test functions (``Class.test[params]``, fnmatch patterns) that do not apply, and why.
SKIPS = {
    "TestEinsum.test_einsum_errors[*einsum_fn=einsum_path*]":
        "np.einsum_path's argument errors: numpy's path function, not rt.einsum (its einsum_fn=einsum twin runs)",
    "TestEinsum.test_einsum_sorting_behavior": "calls only np.einsum_path (numpy's path report)",
    "TestEinsumPath.test_memory_contraints": "calls only np.einsum_path (numpy's path optimizer)",
    "TestEinsumPath.test_long_paths": "calls only np.einsum_path (numpy's path optimizer)",
    "TestEinsumPath.test_edge_paths": "calls only np.einsum_path (numpy's path optimizer)",
    "TestEinsum.test_einsum_views":
        "numpy returns views (b.base is a.base) for transposes and diagonals; rt.einsum returns a new array",
    "TestEinsum.test_einsum_object_errors": "object arrays (Python arithmetic); rt takes float64/complex128 values",
    "TestEinsum.test_object_loop": "object arrays (Python arithmetic); rt takes float64/complex128 values",
    "TestEinsum.test_einsum_sums_object": "object arrays (Python arithmetic); rt takes float64/complex128 values",
    "TestEinsum.test_einsum_sums_longdouble": "longdouble: float64 would round it (rt raises TypeError)",
    "TestEinsum.test_einsum_sums_clongdouble": "clongdouble: complex128 would round it (rt raises TypeError)",
    "TestEinsum.test_einsum_sums_int8": "numpy sums in int8 and wraps around (e.g. 135 -> -121); rt returns the exact "
                                        "value in float64",
    "TestEinsum.test_einsum_sums_uint8": "numpy sums in uint8 and wraps around; rt returns the exact value in float64",
    "TestEinsum.test_einsum_sums_int16": "numpy's targets (np.dot in int16) wrap around (34440 -> -31096); rt returns "
                                         "the exact value in float64",
    "TestEinsum.test_einsum_sums_float16": "numpy's targets (np.multiply in float16) round (2077 -> 2076); rt returns "
                                           "the exact value in float64",
    "TestEinsum.test_einsum_0d_out": "an int64 out for a float64 result: numpy's optimized path skips its own "
                                     "casting='safe' check here (optimize=False raises TypeError); rt refuses it",
    "TestEinsum.test_out_is_res": "int64 operands into an int64 out (numpy's integer arithmetic); rt's results are "
                                  "float64, which casting='safe' does not write into ints",
    "test_overlap": "int64 operands into an int64 out (numpy's integer arithmetic); rt's results are float64 (out "
                    "overlapping an operand is tested on float64 in test_contract.py)",
    "TestEinsum.test_small_boolean_arrays": "bool operands into a bool out (numpy's logical and/or arithmetic); rt's "
                                            "results are float64",
    "TestEinsum.test_different_paths[dtype=g]": "longdouble: float64 would round it (rt raises TypeError)",
    "TestEinsum.test_different_paths[dtype=G]": "clongdouble: complex128 would round it (rt raises TypeError)",
    **{f"TestEinsum.test_different_paths[dtype={c}]":
       "out= of the operands' narrower dtype (int, float16/32, complex64): rt's float64/complex128 result is not "
       "rounded or wrapped into it (numpy's casting='safe' refuses float64 -> float32 too)"
       for c in np.typecodes["AllFloat"] + np.typecodes["AllInteger"] if c not in "dDgG"},
}

#: Calls inside applicable tests that numpy's einsum keeps (counted per case), and why.
FORWARDED = {
    "dtype": "dtype= other than float64/complex128 (numpy computes in that type, e.g. '?' in logical and/or); "
             "rt.einsum raises TypeError",
    "object": "object operands holding Python numbers (numpy's object arithmetic, e.g. summed with dtype=, "
              "casting='unsafe'); rt.einsum raises TypeError",
}


# ----- the np seen by numpy's tests: numpy, with einsum routed to rt.einsum ------------------------------------


class _Calls:
    """What the wrapper did during the current case."""

    def __init__(self):
        self.routed = 0  # rt computed it, checked against the oracles
        self.refused = 0  # rt raised, and numpy raises on it too
        self.forwarded: Counter = Counter()


CALLS = _Calls()


def _array_positions(operands) -> list[int]:
    if operands and isinstance(operands[0], str):
        return list(range(1, len(operands)))
    return list(range(0, len(operands) - len(operands) % 2, 2))


def _forward_reason(operands, kwargs):
    for i in _array_positions(operands):
        x = np.asarray(operands[i])
        if x.dtype == object and x.size and all(isinstance(v, numbers.Number) for v in x.flat):
            return "object"
    if kwargs.get("dtype") is not None:
        try:
            d = np.dtype(kwargs["dtype"])
        except TypeError:
            return None  # not a dtype: rt.einsum's own TypeError is what numpy's test expects
        if d not in (np.float64, np.complex128):
            return "dtype"
    return None


def _with(operands, arrays):
    out = list(operands)
    for i, x in zip(_array_positions(operands), arrays):
        out[i] = x
    return out


def _as_ints(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Object arrays of Python ints ``(re, im)`` and ``e`` with ``x == (re + i im) * 2**e`` exactly."""
    parts = [x.real, x.imag] if np.iscomplexobj(x) else [x]
    m, q = np.frexp(np.stack(parts))
    mant = (m * 2.0**53).astype(np.int64)  # exact: 53-bit mantissas
    q = q.astype(np.int64) - 53
    lo = int(q[mant != 0].min()) if (mant != 0).any() else 0
    ints = np.empty(mant.shape, dtype=object)
    for idx in np.ndindex(mant.shape):
        ints[idx] = int(mant[idx]) << int(q[idx] - lo) if mant[idx] else 0
    return ints, lo


def _exact(operands, arrays) -> tuple[np.ndarray, np.ndarray, int]:
    """The exact einsum ``(re + i im) * 2**e``: object arrays of Python ints from numpy's object einsum."""
    enc = [_as_ints(x) for x in arrays]
    re = im = 0
    # (a + ib)(c + id)...: one object einsum per choice of part of each complex operand
    for choice in itertools.product(*[range(len(ints)) for ints, _ in enc]):
        term = np.asarray(_np_einsum(*_with(operands, [ints[c, ...] for (ints, _), c in zip(enc, choice)])),
                          dtype=object)  # [c, ...]: a 0-d operand stays an object array (ints, no int64 overflow)
        k = sum(choice)
        term = -term if k % 4 in (2, 3) else term
        re, im = (re, im + term) if k % 2 else (re + term, im)
    re = np.asarray(re, dtype=object)
    return re, np.broadcast_to(np.asarray(im, dtype=object), re.shape), sum(e for _, e in enc)


def _within(got: float, ints: int, e: int, bound: float) -> bool:
    """``|got - ints * 2**e| <= bound``, decided exactly in Python ints."""
    num, den = float(got).as_integer_ratio()
    k = den.bit_length() - 1
    s = max(k, -e, 0)  # everything in units of 2**-s
    err = abs((num << (s - k)) - (int(ints) << (s + e)))
    bnum, bden = float(bound).as_integer_ratio()
    return err << (bden.bit_length() - 1) <= bnum << s


#: The exact oracle runs where the products to sum are at most this many.
EXACT_TERMS = 20000


def _check(operands, kwargs, got) -> None:
    """``got`` (rt.einsum's result) against numpy's shape/dtype and the exact value within float64's bound."""
    dtype = None if kwargs.get("dtype") is None else np.dtype(kwargs["dtype"])
    arrays = [np.asarray(operands[i]) for i in _array_positions(operands)]
    if dtype == np.float64:  # numpy's cast of complex operands (casting='unsafe'): their real parts
        arrays = [x.real if np.iscomplexobj(x) else x for x in arrays]
    arrays = [x.astype(np.complex128 if np.iscomplexobj(x) else np.float64) for x in arrays]  # exact for accepted input
    cplx = any(np.iscomplexobj(x) for x in arrays) or dtype == np.complex128
    ref = _np_einsum(*_with(operands, arrays))
    out = kwargs.get("out")
    if out is not None:
        assert got is out, "einsum(out=...) must return out"
        if out.dtype not in (np.float64, np.complex128):  # casting='unsafe' into a narrower out: numpy's cast of
            kw = {k: v for k, v in kwargs.items() if k != "out"}  # the result, which is checked itself below
            got = rt.einsum(*operands, **{"optimize": False, **kw})
            assert np.array_equal(out, np.asarray(got).astype(out.dtype))
    else:
        assert isinstance(got, np.ndarray) == isinstance(ref, np.ndarray), (type(got), type(ref))
    got = np.asarray(got)
    assert got.shape == np.shape(ref), (got.shape, np.shape(ref))
    assert got.dtype in ((np.complex128,) if cplx else (np.float64, out.dtype if out is not None else np.float64))
    terms = np.asarray(_np_einsum(*_with(operands, [np.ones(x.shape) for x in arrays])))  # products per entry
    mag = np.asarray(_np_einsum(*_with(operands, [np.abs(x.real) + np.abs(x.imag) for x in arrays])))
    m = terms + 2 * len(arrays)
    u = 2.0**-53
    # float64's own bound gamma_m |A||B|..., per part, plus underflow; mag's own rounding inflated away
    bound = (m * u / (1 - m * u)) * mag * (1 + 2.0**-40) + m * 2.0**-1074
    if float(terms.sum()) * len(arrays) <= EXACT_TERMS:
        re, im, e = _exact(operands, arrays)
        for part, want in ((got.real, re), (got.imag, im)):
            for idx in np.ndindex(got.shape):
                assert _within(part[idx], want[idx], e, bound[idx]), (
                    operands[0] if isinstance(operands[0], str) else "interleaved", idx, float(part[idx]),
                    float(want[idx]) * 2.0**e)
    else:
        with np.errstate(invalid="ignore"):
            assert (np.abs(got - ref) <= 2 * bound * (1 + 2.0**-40)).all()


def _einsum(*operands, **kwargs):
    """numpy's einsum signature; routed to rt.einsum (numpy's default optimize=False) and checked."""
    reason = _forward_reason(operands, kwargs)
    if reason is not None:
        CALLS.forwarded[reason] += 1
        return _np_einsum(*operands, **kwargs)
    kw = dict(kwargs)
    kw.setdefault("optimize", False)
    try:
        got = rt.einsum(*operands, **kw)
    except Exception as exc:
        try:
            _np_einsum(*operands, **kwargs)
        except Exception:
            CALLS.refused += 1
            raise exc from None
        raise AssertionError(f"rt.einsum raised {exc!r} where numpy.einsum computes a result") from exc
    CALLS.routed += 1
    _check(operands, kwargs, got)
    return got


class _NumpyWithRtEinsum(types.ModuleType):
    """numpy, except ``einsum``."""

    einsum = staticmethod(_einsum)

    def __getattr__(self, name):
        return getattr(np, name)


def _load_numpy_tests() -> types.ModuleType:
    proxy = _NumpyWithRtEinsum("numpy")
    real_import = builtins.__import__

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "numpy" and not fromlist and level == 0:
            return proxy  # `import numpy as np` in numpy's test module
        return real_import(name, globals, locals, fromlist, level)

    mod = types.ModuleType("numpy_test_einsum_on_rt")
    mod.__file__ = NUMPY_TESTS
    mod.__dict__["__builtins__"] = dict(vars(builtins), __import__=_import)
    with open(NUMPY_TESTS) as f:
        exec(compile(f.read(), NUMPY_TESTS, "exec"), mod.__dict__)
    return mod


NP_TESTS = _load_numpy_tests()


def _value_id(v) -> str:
    return getattr(v, "__name__", None) or str(v)


def _cases():
    """``(id, owner, name, params)`` for every test of numpy's module, its parametrizations expanded."""
    for owner_name, owner in sorted(vars(NP_TESTS).items()):
        if isinstance(owner, type) and owner_name.startswith("Test"):
            funcs = [(f"{owner_name}.{n}", owner, n) for n in sorted(vars(owner)) if n.startswith("test")]
        elif callable(owner) and owner_name.startswith("test"):
            funcs = [(owner_name, None, owner_name)]
        else:
            continue
        for base, cls, name in funcs:
            fn = getattr(cls, name) if cls else getattr(NP_TESTS, name)
            grids = [[]]
            for mark in reversed(getattr(fn, "pytestmark", [])):
                if mark.name != "parametrize":
                    continue
                argnames = [a.strip() for a in mark.args[0].split(",")] if isinstance(mark.args[0], str) else list(mark.args[0])
                values = [v if len(argnames) > 1 else (v,) for v in mark.args[1]]
                grids = [g + list(zip(argnames, v)) for g in grids for v in values]
            for g in grids:
                cid = base + (f"[{'-'.join(f'{k}={_value_id(v)}' for k, v in g)}]" if g else "")
                yield cid, cls, name, dict(g)


CASES = list(_cases())


def _matches(pattern: str, cid: str) -> bool:
    """``*`` is the only wildcard (the ids hold brackets)."""
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), cid) is not None


def _skip_reason(cid: str):
    for pattern, reason in SKIPS.items():
        if _matches(pattern, cid):
            return reason
    return None


def test_the_skip_list_is_current_and_keeps_the_float64_cases():
    ids = [c[0] for c in CASES]
    stale = [p for p in SKIPS if not any(_matches(p, i) for i in ids)]
    assert not stale, f"SKIPS patterns matching no numpy test: {stale}"
    # the float64 / complex128 cases of numpy's dtype-parametrized tests are never skipped
    for cid in ("TestEinsum.test_einsum_sums_float64", "TestEinsum.test_einsum_sums_cfloat128",
                "TestEinsum.test_different_paths[dtype=d]", "TestEinsum.test_different_paths[dtype=D]"):
        assert cid in ids and _skip_reason(cid) is None, cid


@pytest.mark.parametrize("cid,cls,name,params", CASES, ids=[c[0] for c in CASES])
def test_numpy_einsum_case(cid, cls, name, params):
    reason = _skip_reason(cid)
    if reason is not None:
        pytest.skip(reason)
    global CALLS
    CALLS = _Calls()
    state = np.random.get_state()
    np.random.seed(sum(map(ord, cid)))  # numpy's tests draw from the global generator: reproducible here
    try:
        fn = getattr(cls(), name) if cls else getattr(NP_TESTS, name)
        fn(**params)
    finally:
        np.random.set_state(state)
    assert CALLS.routed + CALLS.refused > 0, f"{cid}: no einsum call reached rt.einsum"


def test_the_oracles_catch_a_wrong_result():
    """The wrapper's checks fail on a result off by more than float64's bound (against the exact value, and against
    numpy's on a large contraction), on a wrong shape and on a wrong dtype."""
    a, b = np.arange(12.0).reshape(3, 4), np.arange(8.0).reshape(4, 2)
    right = a @ b  # exact: small integers
    _check(("ij,jk", a, b), {}, right.copy())
    off = right.copy()
    off[1, 1] *= 1 + 2.0**-40  # the bound is gamma_8 |A||B|: about 10 units of 98 here
    for wrong in (off, right.T.copy(), right.astype(np.complex128), right[None]):
        with pytest.raises(AssertionError):
            _check(("ij,jk", a, b), {}, wrong)
    big = np.random.default_rng(0).uniform(-1, 1, (3, 3000))  # past EXACT_TERMS: against numpy within the bound
    ref = _np_einsum("ij,kj", big, big)
    _check(("ij,kj", big, big), {}, ref.copy())
    with pytest.raises(AssertionError):
        _check(("ij,kj", big, big), {}, ref * (1 + 2.0**-30))
