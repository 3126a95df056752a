"""CpuBackend against the numpy reference (rnstensor.arith): every call equal bit for bit."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rnstensor import arith
from rnstensor.backends import NumpyBackend, get_backend
from rnstensor.backends.cpu import common as cpu_mod
from rnstensor.backends.cpu import CpuBackend
from rnstensor.basis import Basis, centered, int8_pool

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in ldexp:RuntimeWarning")

REF = NumpyBackend()
CPU = CpuBackend()

CUSTOM = [Basis((7, 5, 3)), Basis((255, 256, 7)), Basis((2,)), Basis((3, 2)), Basis((256,)), Basis((11, 13, 4))]


# ----- helpers ------------------------------------------------------------------------------


def same_int8(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype == np.int8 and a.shape == b.shape and np.array_equal(a, b)


def assert_same_float(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype == np.float64 and a.shape == b.shape
    ua, ub = a.view(np.uint64), b.view(np.uint64)
    both_nan = np.isnan(a) & np.isnan(b)
    bad = (ua != ub) & ~both_nan
    if bad.any():
        i = np.flatnonzero(bad)[0]
        raise AssertionError(f"{bad.sum()} entries differ; first at {i}: reference {a.flat[i]!r}, cpu {b.flat[i]!r}")


def random_planes(rng: np.random.Generator, moduli, shape) -> np.ndarray:
    """Valid centered residues, with the range ends over-represented."""
    rows = []
    for p in moduli:
        lo, hi = -(p // 2), (p + 1) // 2 - 1
        r = rng.integers(lo, hi + 1, size=shape)
        edge = rng.random(shape)
        r = np.where(edge < 0.1, lo, np.where(edge > 0.9, hi, r))
        rows.append(r.astype(np.int8))
    return np.stack(rows) if rows else np.zeros((0,) + tuple(shape), np.int8)


def planes_of(values, moduli) -> np.ndarray:
    """Centered residues of the given Python ints, shape ``(L, len(values))``."""
    return np.array([[centered(int(v), p) for v in values] for p in moduli], dtype=np.int8).reshape(
        (len(moduli), len(values))
    )


def bases():
    return st.one_of(st.integers(2, 49).map(Basis.int8), st.sampled_from(CUSTOM))


def shapes(min_dims=1, max_dims=4, max_side=6):
    return st.lists(st.integers(1, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


@pytest.fixture
def threaded(monkeypatch):
    """Force the multi-threaded split even for small inputs."""
    monkeypatch.setattr(cpu_mod, "_MIN_WORK", 16)
    monkeypatch.setattr(cpu_mod, "_nthreads", lambda: 3)


def test_registry_returns_cpu_backend():
    assert get_backend("cpu").name == "cpu"
    assert isinstance(get_backend("cpu"), CpuBackend)


def test_unknown_backend_names_every_backend_and_the_one_meant():
    from rnstensor.backends.cuda import cuda_unavailable_reason

    why = cuda_unavailable_reason()
    for name in ("gpu", "GPU", "cupy", "device", "Cuda"):
        with pytest.raises(ValueError, match=r"backend must be one of \('cpu', 'numpy', 'cuda'\)") as info:
            get_backend(name)
        message = str(info.value)
        assert f"got {name!r}: the GPU backend is backend='cuda'" in message
        assert (why is None) or f"(unavailable here: {why})" in message  # why 'cuda' cannot run, where it cannot
    with pytest.raises(ValueError, match=r"one of \('cpu', 'numpy', 'cuda'\); got 'CPU': did you mean backend='cpu'\?$"):
        get_backend("CPU")
    with pytest.raises(ValueError, match=r"one of \('cpu', 'numpy', 'cuda'\); got 'tpu'$"):  # no guess where none fits
        get_backend("tpu")


# ----- the modular reduction ----------------------------------------------------------------


@numba.njit(cache=False)
def _cr32_mismatches(p, lim):
    # _cr32 against the integer centered residue for every |t| <= lim
    pf = np.float32(p)
    ip = np.float32(1.0) / pf
    h = np.float32((p + 1) // 2)
    bad = 0
    for i in range(-lim, lim + 1):
        r = i % p
        if r >= (p + 1) // 2:
            r -= p
        if cpu_mod._cr32(np.float32(i), pf, ip, h) != r:
            bad += 1
    return bad


@numba.njit(cache=False)
def _cr64_mismatches(p, lo, n):
    # _cr64 for lo <= |t| < lo + n
    pf = np.float64(p)
    ip = 1.0 / pf
    h = np.float64((p + 1) // 2)
    bad = 0
    for sign in (1, -1):
        for j in range(n):
            i = sign * (lo + j)
            r = i % p
            if r >= (p + 1) // 2:
                r -= p
            if cpu_mod._cr64(np.float64(i), pf, ip, h) != r:
                bad += 1
    return bad


@pytest.mark.parametrize("p", [2, 3, 4, 5, 7, 64, 127, 128, 129, 197, 241, 251, 253, 255, 256])
def test_reductions_exact_over_their_whole_range(p):
    # _cr32 promises exactness for |t| + p < 2**22, _cr64 for |t| + p < 2**51
    assert _cr32_mismatches(p, (1 << 22) - p - 1) == 0
    for lo in (0, (1 << 48) - 50_000, (1 << 51) - p - 100_000):
        assert _cr64_mismatches(p, lo, 100_000 - (1 if lo else 0)) == 0


# ----- encode -------------------------------------------------------------------------------


def _special_values(rng, n):
    pool = np.array(
        [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.5, 2.0**-1074, -(2.0**-1074), 2.0**-1022,
         2.0**-1000, 2.0**1000, -(2.0**1000), np.finfo(float).max, -np.finfo(float).max, 2.0**53 - 1,
         2.0**52 + 0.5, 4503599627370497.0, 0.49999999999999994, 5e-324 * 3, 1e-310, -1e-310]
    )
    return rng.choice(pool, size=n)


@settings(max_examples=60)
@given(basis=bases(), bits=st.integers(1, 120), shape=shapes(max_dims=3, max_side=7),
       scale=st.integers(-1100, 1000), mix=st.integers(0, 3), seed=st.integers(0, 2**32 - 1),
       exp_mode=st.sampled_from(["alg5", "random", "per_row", "huge"]))
def test_encode_matches_reference(basis, bits, shape, scale, mix, seed, exp_mode):
    rng = np.random.default_rng(seed)
    n = math.prod(shape)
    x = rng.standard_normal(n) * 2.0 ** rng.integers(-40, 40, n)
    x = np.ldexp(x, np.clip(scale, -1020, 960))  # stays finite
    if mix >= 1:
        x = np.where(rng.random(n) < 0.3, _special_values(rng, n), x)
    if mix >= 2:  # ties: k + 1/2 at the rounding position
        x = np.where(rng.random(n) < 0.3, np.ldexp(rng.integers(-(1 << 20), 1 << 20, n) + 0.5, int(scale) % 50 - 25), x)
    if mix == 3:  # subnormals
        x = np.where(rng.random(n) < 0.5, rng.integers(-(1 << 52), 1 << 52, n) * 2.0**-1074, x)
    x = x.reshape(shape)
    if exp_mode == "alg5":
        big = np.abs(x).max()
        exponent = np.int64(bits - np.frexp(big)[1]) if big > 0 else np.int64(0)
    elif exp_mode == "random":
        exponent = np.int64(rng.integers(-1200, 1200))
    elif exp_mode == "huge":
        exponent = np.int64(rng.choice([5000, 100000, -5000, -100000, 1200, 2000]))
    else:
        exponent = rng.integers(-60, 1130, size=shape[:-1] + (1,)).astype(np.int64)
    a = REF.encode(x, exponent, basis.moduli, bits)
    b = CPU.encode(x, exponent, basis.moduli, bits)
    assert same_int8(a, b)


def test_encode_wide_and_edge_cases():
    rng = np.random.default_rng(7)
    basis = Basis.int8(49)
    x = np.concatenate([_special_values(rng, 400), rng.standard_normal(400) * 2.0 ** rng.integers(-1070, 1020, 400)])
    for bits in (1, 2, 30, 52, 53, 54, 64, 100, 120):
        big = np.abs(x).max()
        e = np.int64(bits - np.frexp(big)[1])
        assert same_int8(REF.encode(x, e, basis.moduli, bits), CPU.encode(x, e, basis.moduli, bits))
    # per-entry exponents spanning the whole table and beyond it
    e = rng.integers(-1200, 9000, size=x.shape).astype(np.int64)
    assert same_int8(REF.encode(x, e, basis.moduli, 120), CPU.encode(x, e, basis.moduli, 120))
    # 0-d input and an empty one
    assert same_int8(REF.encode(np.float64(2.5), np.int64(0), basis.moduli, 53),
                     CPU.encode(np.float64(2.5), np.int64(0), basis.moduli, 53))
    assert CPU.encode(np.zeros((0, 3)), np.int64(0), basis.moduli, 53).shape == (49, 0, 3)


def test_encode_threaded(threaded):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((37, 100)) * 2.0 ** rng.integers(-20, 20, (37, 100))
    for bits, mods in ((53, Basis.int8(15).moduli), (110, Basis.int8(20).moduli)):
        e = np.int64(bits - np.frexp(np.abs(x).max())[1])
        assert same_int8(REF.encode(x, e, mods, bits), CPU.encode(x, e, mods, bits))


EXPONENT_SHAPES = [(), (1,), (5, 1, 1), (1, 6, 1), (5, 6, 1), (5, 6, 7), (7,), (6, 7), (1, 1, 7), (5, 1, 7), (1, 1, 1)]


@pytest.mark.parametrize("eshape", EXPONENT_SHAPES)
def test_encode_exponent_broadcast_shapes(eshape, threaded):
    # exponents constant along trailing axes stay compact (runs); any others are per entry
    rng = np.random.default_rng(len(eshape))
    basis = Basis.int8(15)
    x = rng.standard_normal((5, 6, 7)) * 2.0 ** rng.integers(-30, 30, (5, 6, 7))
    e = rng.integers(-10, 60, size=eshape).astype(np.int64)
    assert same_int8(REF.encode(x, e, basis.moduli, 53), CPU.encode(x, e, basis.moduli, 53))
    e = rng.integers(900, 1200, size=eshape).astype(np.int64)  # integers already, the big path
    assert same_int8(REF.encode(x, e, basis.moduli, 120), CPU.encode(x, e, basis.moduli, 120))


# ----- products -----------------------------------------------------------------------------


@settings(max_examples=60)
@given(basis=bases(), shape=shapes(max_dims=4, max_side=7), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_product_matches_reference(basis, shape, data, seed):
    rng = np.random.default_rng(seed)
    nd = len(shape)
    axis = data.draw(st.integers(-nd, nd - 1))
    n_in = shape[axis]
    n_out = data.draw(st.integers(1, 12))
    X = random_planes(rng, basis.moduli, shape)
    A = random_planes(rng, basis.moduli, (n_out, n_in))
    assert same_int8(REF.product(A, X, basis.moduli, axis), CPU.product(A, X, basis.moduli, axis))


@pytest.mark.parametrize("shape,axis", [((64, 8, 8, 8), 1), ((64, 8, 8, 8), 2), ((64, 8, 8, 8), 3),
                                        ((5, 9, 7), 0), ((3, 40, 5), 1), ((2, 3, 2000), 2)])
def test_product_fem_shapes(shape, axis):
    rng = np.random.default_rng(axis)
    basis = Basis.int8(15)
    X = random_planes(rng, basis.moduli, shape)
    for n_out in (shape[axis], shape[axis] + 1, 2):
        A = random_planes(rng, basis.moduli, (n_out, shape[axis]))
        assert same_int8(REF.product(A, X, basis.moduli, axis), CPU.product(A, X, basis.moduli, axis))


@pytest.mark.parametrize("n_in", [191, 192, 193, 300, 1024, 1025, 2100])
def test_product_long_contractions_at_the_extremes(n_in):
    # every product (-128)(-128) = 2**14 for p = 256: the sums reach n_in * 2**14,
    # past float32's exact range once n_in > 1024 (the BLAS path must chunk)
    basis = Basis((256, 255, 7, 11))
    rng = np.random.default_rng(n_in)
    for axis, shape in ((0, (n_in, 3)), (1, (2, n_in)), (1, (2, n_in, 2))):
        X = random_planes(rng, basis.moduli, shape)
        A = random_planes(rng, basis.moduli, (5, n_in))
        X[0] = -128
        A[0] = -128
        A[1, 0] = -127
        assert same_int8(REF.product(A, X, basis.moduli, axis), CPU.product(A, X, basis.moduli, axis))


def test_product_threaded_and_noncontiguous(threaded):
    rng = np.random.default_rng(11)
    basis = Basis.int8(6)
    X = random_planes(rng, basis.moduli, (20, 9, 6, 5))
    for axis in range(4):
        A = random_planes(rng, basis.moduli, (4, X.shape[axis + 1]))
        assert same_int8(REF.product(A, X, basis.moduli, axis), CPU.product(A, X, basis.moduli, axis))
    Xt = random_planes(rng, basis.moduli, (6, 300)).transpose(0, 2, 1)  # non-contiguous, BLAS path
    A = random_planes(rng, basis.moduli, (3, 300))
    assert same_int8(REF.product(A, Xt, basis.moduli, 0), CPU.product(A, Xt, basis.moduli, 0))


@pytest.mark.parametrize("post", [1, 2, 4, 8, 12, 16, 24, 32, 40, 64, 600])
def test_product_layout_paths(post):
    # every layout move of the direct kernel: words unpacked/packed (post 1), int32
    # and int64 word runs (post 4, 8, 16, 24), long runs (>= 32), byte runs, tiles of
    # a long `post`, partial blocks (pre = 37), contractions padded to 4 terms;
    # extreme residues so the float32 sums reach their largest values
    rng = np.random.default_rng(post)
    basis = Basis((256, 255, 253, 7))
    for n_in in (1, 3, 4, 5, 8, 9, 12, 16, 24, 33):
        X = random_planes(rng, basis.moduli, (37, n_in, post))
        X[0, :3] = -128
        for n_out in (1, 4, 7, 8, 16, 24):
            A = random_planes(rng, basis.moduli, (n_out, n_in))
            A[0, 0] = -128
            assert same_int8(REF.product(A, X, basis.moduli, 1), CPU.product(A, X, basis.moduli, 1)), (n_in, n_out)


def test_product_layout_paths_threaded(threaded):
    rng = np.random.default_rng(17)
    basis = Basis.int8(5)
    for shape, axis in (((300, 8), 1), ((150, 16), 1), ((100, 12), 1), ((90, 4), 1), ((70, 8, 8), 1),
                        ((40, 8, 600), 1), ((33, 4, 4), 1)):
        X = random_planes(rng, basis.moduli, shape)
        for n_out in (shape[axis], 8, 5):
            A = random_planes(rng, basis.moduli, (n_out, shape[axis]))
            assert same_int8(REF.product(A, X, basis.moduli, axis), CPU.product(A, X, basis.moduli, axis))


# ----- elementwise --------------------------------------------------------------------------


def _field_shape(shape, data):
    kind = data.draw(st.sampled_from(["same", "suffix", "ones", "scalar", "planes_broadcast"]))
    if kind == "same":
        return shape, shape
    if kind == "suffix":
        k = data.draw(st.integers(0, len(shape)))
        return shape, shape[k:]
    if kind == "ones":
        return shape, tuple(d if data.draw(st.booleans()) else 1 for d in shape)
    if kind == "scalar":
        return shape, ()
    return tuple(1 if i == 0 else d for i, d in enumerate(shape)), shape


@settings(max_examples=60)
@given(basis=bases(), shape=shapes(max_dims=4, max_side=9), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_hadamard_matches_reference(basis, shape, data, seed):
    rng = np.random.default_rng(seed)
    sa, sf = _field_shape(shape, data)
    X = random_planes(rng, basis.moduli, sa)
    F = random_planes(rng, basis.moduli, sf)
    assert same_int8(REF.hadamard(X, F, basis.moduli), CPU.hadamard(X, F, basis.moduli))


@settings(max_examples=60)
@given(basis=bases(), shape=shapes(max_dims=4, max_side=9), subtract=st.booleans(), broadcast=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_add_matches_reference(basis, shape, subtract, broadcast, seed):
    rng = np.random.default_rng(seed)
    a = random_planes(rng, basis.moduli, shape)
    b = random_planes(rng, basis.moduli, shape[1:] if broadcast else shape)
    assert same_int8(REF.add(a, b, basis.moduli, subtract), CPU.add(a, b, basis.moduli, subtract))


def test_elementwise_large_and_threaded(threaded):
    rng = np.random.default_rng(5)
    basis = Basis.int8(15)
    X = random_planes(rng, basis.moduli, (40, 8, 8, 8))
    Y = random_planes(rng, basis.moduli, (40, 8, 8, 8))
    F = random_planes(rng, basis.moduli, (8, 8, 8))
    G = random_planes(rng, basis.moduli, (8, 1))
    assert same_int8(REF.hadamard(X, F, basis.moduli), CPU.hadamard(X, F, basis.moduli))
    assert same_int8(REF.hadamard(X, G, basis.moduli), CPU.hadamard(X, G, basis.moduli))
    assert same_int8(REF.hadamard(X, Y, basis.moduli), CPU.hadamard(X, Y, basis.moduli))
    for sub in (False, True):
        assert same_int8(REF.add(X, Y, basis.moduli, sub), CPU.add(X, Y, basis.moduli, sub))


# ----- drop and base extension --------------------------------------------------------------


def _active_subset(basis, data):
    mods = basis.moduli
    if len(mods) > 1 and data.draw(st.booleans()):
        keep = data.draw(st.lists(st.booleans(), min_size=len(mods), max_size=len(mods)))
        sub = tuple(p for p, k in zip(mods, keep) if k)
        if sub:
            return sub
    return mods


@settings(max_examples=80)
@given(basis=bases(), data=st.data(), shape=shapes(max_dims=2, max_side=12), seed=st.integers(0, 2**32 - 1))
def test_drop_extend_matches_reference(basis, data, shape, seed):
    rng = np.random.default_rng(seed)
    active = _active_subset(basis, data)
    drops = data.draw(st.integers(0, len(active) - 1))
    if data.draw(st.booleans()):
        # an explicit drop order (the error-optimal planner's), not the smallest first
        drops = tuple(data.draw(st.permutations(active))[:drops])
    extend = data.draw(st.booleans())
    X = random_planes(rng, active, shape)
    a, act_a = REF.drop_extend(X, active, basis, drops, extend)
    b, act_b = CPU.drop_extend(X, active, basis, drops, extend)
    assert act_a == act_b
    assert same_int8(a, b)


@pytest.mark.parametrize("s", [2, 3, 15, 16, 33, 49])
def test_drop_extend_every_drop_count(s):
    basis = Basis.int8(s)
    rng = np.random.default_rng(s)
    X = random_planes(rng, basis.moduli, (3, 50))
    for drops in range(s):
        for extend in (False, True):
            a, act_a = REF.drop_extend(X, basis.moduli, basis, drops, extend)
            b, act_b = CPU.drop_extend(X, basis.moduli, basis, drops, extend)
            assert act_a == act_b and same_int8(a, b), (drops, extend)


def test_drop_extend_all_dropped_and_threaded(threaded):
    basis = Basis.int8(15)
    rng = np.random.default_rng(1)
    X = random_planes(rng, basis.moduli, (2000,))
    cases = [(15, False), (15, True), (16, True), (7, True), (1, False), (0, True), ((), True),
             ((197, 256, 211), True), ((256, 255), False), (np.int64(3), True)]
    for drops, extend in cases:
        a, act_a = REF.drop_extend(X, basis.moduli, basis, drops, extend)
        b, act_b = CPU.drop_extend(X, basis.moduli, basis, drops, extend)
        assert act_a == act_b and same_int8(a, b), (drops, extend)
    with pytest.raises(ValueError):
        CPU.drop_extend(X, basis.moduli, basis, -1, False)
    with pytest.raises(ValueError):
        CPU.drop_extend(X, basis.moduli, basis, (197, 197), True)
    with pytest.raises(ValueError):
        CPU.drop_extend(X, basis.moduli, basis, (7,), True)


# ----- decode -------------------------------------------------------------------------------


def _reference_decode(X, active, exponent, factor, mode):
    try:
        return REF.decode(X, active, exponent, factor, mode)
    except OverflowError:
        if mode != "exact":
            raise
    # arith.round_scaled_int overflows a second time in its own overflow branch,
    # math.copysign(inf, w) with an int w too large for a float: same rounding,
    # with the sign taken from the int
    v = arith.to_int_ref(X, active)
    e = np.broadcast_to(np.asarray(exponent, dtype=np.int64), v.shape)
    out = np.empty(v.shape, np.float64)
    for i in np.ndindex(v.shape):
        w = int(v[i]) * int(factor)
        try:
            out[i] = arith.round_scaled_int(w, int(e[i]))
        except OverflowError:
            out[i] = math.inf if w > 0 else -math.inf
    return out


def _decode_both(X, active, exponent, factor, mode):
    a = _reference_decode(X, active, exponent, factor, mode)
    b = CPU.decode(X, active, exponent, factor, mode)
    assert_same_float(a, b)


FACTORS = [1, 2, 3, 251 * 241, 2**64, 2**300 + 1, 3**500, 7 * 2**1000, math.prod(int8_pool()), -5]


@settings(max_examples=80)
@given(basis=bases(), data=st.data(), shape=shapes(max_dims=2, max_side=10), mode=st.sampled_from(["fp64", "exact"]),
       factor=st.sampled_from(FACTORS), seed=st.integers(0, 2**32 - 1))
def test_decode_matches_reference(basis, data, shape, mode, factor, seed):
    rng = np.random.default_rng(seed)
    active = _active_subset(basis, data)
    X = random_planes(rng, active, shape)
    P = math.prod(active)
    fbits = abs(factor).bit_length()
    # around the interesting places: overflow, the normal/subnormal border, underflow to zero
    anchor = data.draw(st.sampled_from([0, 1024, -1022, -1074, -1100, 1100, -1200]))
    e0 = anchor - P.bit_length() - fbits + data.draw(st.integers(-60, 60))
    if data.draw(st.booleans()):
        exponent = np.int64(e0)
    else:
        exponent = (e0 + rng.integers(-40, 40, size=shape[:-1] + (1,))).astype(np.int64)
    _decode_both(X, active, exponent, factor, mode)


@pytest.mark.parametrize("mode", ["fp64", "exact"])
def test_decode_ties_subnormals_and_overflow(mode):
    basis = Basis.int8(15)
    P = basis.product
    rng = np.random.default_rng(2)
    vals = [0, 1, -1, 2, 3, 4, 5, 6, 7, 8, 12, 20, (P - 1) // 2, -((P - 1) // 2), 2**53, 2**53 + 1, 2**54 + 2,
            2**54 + 6, -(2**54 + 2), 2**60 + 2**7, 2**80 + 2**27, 2**80 + 2**27 + 1, 2**100 - 1]
    vals += [int(v) for v in rng.integers(-(2**62), 2**62, 40)]
    X = planes_of(vals, basis.moduli)
    for e in [0, -1, -3, -1074, -1075, -1076, -1077, -1080, -1074 - 53, -1074 - 60, -1074 - 100, -1200, -1400,
              1000, 1023 - 53, 1024 - 53, 1024 - 100, 1100, -5000, 5000, -(1 << 16), 1 << 16]:
        for factor in (1, 3, 2**70, 2**70 + 2**17 + 1, 5**200):
            _decode_both(X, basis.moduli, np.int64(e), factor, mode)


@pytest.mark.parametrize("mode", ["fp64", "exact"])
def test_decode_threaded_and_degenerate(threaded, mode):
    basis = Basis.int8(20)
    rng = np.random.default_rng(4)
    X = random_planes(rng, basis.moduli, (400,))
    _decode_both(X, basis.moduli, np.int64(-60), 251 * 241, mode)
    _decode_both(X[:, :0], basis.moduli, np.int64(-60), 3, mode)
    _decode_both(X[:1, :5], basis.moduli[:1], np.int64(3), 7, mode)
    e = rng.integers(-1300, 1100, size=400).astype(np.int64)
    _decode_both(X, basis.moduli, e, 2**200 + 3, mode)


@pytest.mark.parametrize("mode", ["fp64", "exact"])
@pytest.mark.parametrize("eshape", EXPONENT_SHAPES)
def test_decode_exponent_broadcast_shapes(eshape, mode, threaded):
    basis = Basis.int8(15)
    rng = np.random.default_rng(len(eshape) + 10)
    X = random_planes(rng, basis.moduli, (5, 6, 7))
    e0 = -basis.product.bit_length()
    e = (e0 + rng.integers(-50, 50, size=eshape)).astype(np.int64)
    _decode_both(X, basis.moduli, e, 3, mode)
    # some exponents past the normal range (fp64: the slow path for those entries)
    e = rng.choice(np.array([e0, e0 - 1000, e0 - 1100, e0 + 1100, e0 - 5000, 5000]), size=eshape).astype(np.int64)
    _decode_both(X, basis.moduli, e, 3, mode)


# ----- batched residue GEMM (einsum's pairwise step) ----------------------------------------


def _random_planes(rng, moduli, shape, edge=None):
    rows = []
    for p in moduli:
        lo, hi = -(p // 2), (p + 1) // 2 - 1
        rows.append(np.full(shape, lo if edge == "min" else hi) if edge else rng.integers(lo, hi + 1, shape))
    return np.stack(rows).astype(np.int8)


@pytest.mark.parametrize("moduli", [Basis.int8(15).moduli, Basis.int8(49).moduli, (2, 3, 5, 7)], ids=["s15", "s49", "small"])
@pytest.mark.parametrize(
    "sa,sb,edge",
    [
        ((64, 8, 8), (64, 8, 8), None),  # many small matrices
        ((64, 8, 1024), (64, 1024, 4), "min"),  # the longest exact float32 chunk, worst sums
        ((64, 8, 1024), (64, 1024, 4), "max"),
        ((2, 1, 3, 4), (5, 4, 6), None),  # broadcast batch axes
        ((2, 40, 300), (2, 300, 50), None),  # BLAS path
        ((1, 3, 1100), (1, 1100, 2), "min"),  # BLAS path, k split into exact chunks
        ((3, 4, 0), (3, 0, 2), None),
    ],
)
def test_matmul_matches_the_reference(moduli, sa, sb, edge):
    rng = np.random.default_rng(len(moduli) + sa[-1])
    a, b = _random_planes(rng, moduli, sa, edge), _random_planes(rng, moduli, sb, edge)
    assert np.array_equal(CpuBackend().matmul(a, b, moduli), NumpyBackend().matmul(a, b, moduli))


@pytest.mark.parametrize("shape", [(3, 4, 20), (5, 3, 2), (7, 2, 1), (0, 3, 4), (70, 3, 2), (66, 2, 17), (130, 8, 1),
                                   (600, 8, 3), (200, 11, 2), (64, 8, 8), (80, 10, 20)])
def test_mode_magnitudes(shape):
    # the classical certification's fused pass: the magnitudes within (K + 1) 2**-53 of exact, the smallest
    # positive one, and the largest (alpha colsum + beta rowsum + kappa) / magnitude over the positive entries
    from fractions import Fraction

    from rnstensor.backends.cpu import mode_magnitudes

    rng = np.random.default_rng(sum(shape))
    B, K, R = shape
    X = np.abs(rng.standard_normal(shape)) * (rng.random(shape) < 0.7)
    A = np.abs(rng.standard_normal((4, K))) * (rng.random((4, K)) < 0.7)
    out, least, worst = mode_magnitudes(X, A, 0.5, 0.25, 0.125)
    assert out.shape == (B, 4, R)
    if B == 0:
        assert least == np.inf and worst == 0.0
        return
    exact = np.empty(out.shape, dtype=object)
    for b, j, r in np.ndindex(*out.shape):
        exact[b, j, r] = sum(Fraction(float(A[j, k])) * Fraction(float(X[b, k, r])) for k in range(K))
        assert abs(Fraction(float(out[b, j, r])) - exact[b, j, r]) <= (K + 1) * Fraction(1, 2**53) * exact[b, j, r]
        in_order = 0.0  # k ascending, each product and sum rounded once: the documented accumulation, bit for bit
        for k in range(K):
            in_order += float(A[j, k]) * float(X[b, k, r])
        assert out[b, j, r] == in_order
    pos = out > 0
    assert (pos == (exact > 0)).all()  # a zero magnitude is exactly zero, a positive one positive
    assert least == (out[pos].min() if pos.any() else np.inf)
    num = 0.5 * X.sum(axis=1)[:, None, :] + 0.25 * A.sum(axis=1)[None, :, None] + 0.125
    want = (num[pos] / out[pos]).max() if pos.any() else 0.0
    assert worst == pytest.approx(want, rel=1e-14)


def test_encode_magnitudes():
    # |x| 2**-e per row, correctly rounded (also where it is subnormal or the exponent is beyond +-1000), the
    # smallest over the nonzero entries (0 where one underflows) and whether all are integers
    from fractions import Fraction

    from rnstensor.backends.cpu import encode_magnitudes

    rng = np.random.default_rng(9)
    X = rng.uniform(-1, 1, (6, 40)) * (rng.random((6, 40)) < 0.8)
    X[5] = 0.0
    e = np.array([-53, 10, 1070, -1100, 3, 0])
    X[3] *= 2.0**-1000
    c, least, whole = encode_magnitudes(X, e)
    for b, i in np.ndindex(*X.shape):
        want = Fraction(abs(float(X[b, i]))) * Fraction(2) ** int(-e[b])
        assert c[b, i] == float(want)  # float() of a Fraction rounds once, subnormals included
    nz = X != 0
    assert least == c[nz].min()
    assert whole is False
    ints = np.array([[3.0, -4.0, 0.0], [1.0, 2.0, 5.0]])
    c, least, whole = encode_magnitudes(ints, np.array([0, -1]))
    assert whole is True and least == 2.0 and c.tolist() == [[3.0, 4.0, 0.0], [2.0, 4.0, 10.0]]
    c, least, whole = encode_magnitudes(np.zeros((2, 3)), np.array([0, 0]))
    assert least == np.inf and whole is True


@pytest.mark.parametrize("L, shape", [(2, (7,)), (5, (3, 40)), (17, (600,)), (49, (2, 3, 90)), (18, ())])
def test_mrc_digits_are_the_references_and_give_the_crt_integers(L, shape):
    from oracle import crt, residues

    rng = np.random.default_rng(L)
    moduli = int8_pool()[:L]
    P = math.prod(moduli)
    vals = np.array([int(rng.integers(0, 1 << 62)) * int(rng.integers(0, 1 << 62)) ** 5 % P - P // 2
                     for _ in range(math.prod(shape))], dtype=object).reshape(shape)
    planes = residues(vals, moduli)
    digits, order = CpuBackend().mrc_digits(planes, moduli)
    ref, ref_order = arith.mrc_digits_ref(planes, moduli)
    assert digits.dtype == np.int64 and order == ref_order and np.array_equal(digits, ref)
    got = arith.ints_from_digits(digits, order)
    assert got.shape == shape and (got == crt(planes, moduli)).all()
