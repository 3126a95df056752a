"""The fused chain kernel (chain.cu) run on CPU threads (chain_host.cpp) against the plans' own execution.

Every plan is run through ``rns_chain_fused`` as written — encode from the IEEE
bits, dp4a products in shared memory, drops and extensions, both decodes —
with the host program of ``rnstensor.kernels.fused``, and compared bit for bit
with ``plan.run`` on the CPU backend (which the chain tests check against
exact rationals). Shared memory starts filled with two different byte
patterns: a kernel reading bytes it never wrote would not match both times.
"""

from __future__ import annotations

import functools

import ctypes

import numpy as np
import pytest

import rnstensor as rt
from rnstensor.kernels import build, fused
from rnstensor.fem.fused import operator_field
from sanitize import SANITIZE


# the papers' methods at any width: these tests check plans that keep fewer than min_bits bits
plan_any = functools.partial(rt.plan_chain, min_bits=0)


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    try:
        return ctypes.CDLL(str(build.chain_simt_library(cache=tmp_path_factory.mktemp("chain"), sanitize=SANITIZE)))
    except build.KernelBuildError as exc:  # pragma: no cover - CI images have g++ >= 11
        pytest.skip(f"no C++20 host compiler for the SIMT build of chain.cu: {exc}")


def _p(a):
    return np.asarray(a).ctypes.data_as(ctypes.c_void_p)


def run_fused(emu, plan, X, decode="fp64", fill=0xA5, prog=None, field=None, fexp=None):
    """``plan.run(X)`` through the emulated fused kernel (or ``prog``, with its field and field exponents)."""
    x = np.ascontiguousarray(X, np.float64)
    if prog is None:
        batch = x.shape[: x.ndim - plan.ndim]
        prog = fused.compile_request(plan.fusion_request(x.shape[len(batch):]))
    else:
        batch = x.shape[: x.ndim - len(prog.in_shape)]
    B = int(np.prod(batch, dtype=np.int64))
    Y = np.full((B,) + prog.out_shape, np.nan)
    flags = np.zeros(1, np.int32)
    exact = decode == "exact"
    if exact and prog.F is None:
        pytest.skip("factor too wide for the kernel's limbs")
    F = prog.F if exact else np.zeros(1, np.uint32)
    dexp = prog.dexp_exact if exact else prog.dexp_fp64
    rc = emu.emu_chain(
        _p(x.view(np.uint64)), ctypes.c_int64(B), _p(Y), _p(prog.ints), _p(prog.floats), _p(prog.qd), _p(prog.ops),
        _p(dexp), int(exact), ctypes.c_double(prog.f), ctypes.c_double(prog.g), _p(F), int(F.size), int(prog.fneg),
        None if field is None else _p(field), ctypes.c_int64(0 if field is None else field[0].size),
        None if fexp is None else _p(fexp), _p(flags), ctypes.c_int64(prog.shared_bytes), fill,
    )
    assert rc == 0
    return Y.reshape(batch + prog.out_shape), int(flags[0])


def _same(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint64), b.view(np.uint64))


def _ops(rng, shapes, kind="uniform"):
    out = []
    for n_out, n_in in shapes:
        if kind == "wide":  # rows spanning many binades: pending row exponents and folding
            A = rng.uniform(-1, 1, (n_out, n_in)) * np.ldexp(1.0, rng.integers(-30, 30, (n_out, 1)))
        else:
            A = rng.uniform(-1, 1, (n_out, n_in))
        out.append(A)
    return out


CASES = [
    # (tensor shape, operator shapes, axes, method, batch)
    ((8, 8, 8), [(8, 8)] * 3, (0, 1, 2), "rescale_be", (5,)),
    ((4, 4, 4), [(4, 4)] * 3, (2, 1, 0), "rescale_be", (37,)),  # many tensors per block, a partial last block
    ((5, 6, 7), [(3, 5), (9, 6), (7, 7)], (0, 1, 2), "rescale_be", (3,)),  # padding, n_out != n_in
    ((16, 16), [(16, 16), (12, 16)], (1, 0), "rescale", (2,)),  # drops without extension
    ((6, 6, 6), [(6, 6)] * 3, (1, 2, 0), "norescale", (2, 2)),  # no drops; two batch axes
    ((3, 4, 2, 5), [(3, 3), (4, 4), (2, 2), (5, 5)], (0, 1, 2, 3), "rescale_be", (4,)),  # d = 4
    ((8, 8, 8), [(8, 8)] * 6, (0, 1, 2, 0, 1, 2), "rescale_be", (2,)),  # each axis twice (the layout cycles)
    ((33, 2), [(20, 33)], (0,), "rescale_be", (3,)),  # one product, 9 words a row, an untouched axis
    ((13,), [(13, 13)] * 3, (0, 0, 0), "rescale_be", (6,)),  # one axis, three times
    # 16 x 16 on the tensor cores (4-word rows, 16 operator rows) with a partial last tile: 4 tensors of
    # 15 x 3 rows, 180 rows a block
    ((16, 15, 3), [(16, 16), (15, 15)], (0, 1), "rescale_be", (5,)),
]


@pytest.mark.parametrize("shape, opshapes, axes, method, batch", CASES)
def test_fused_kernel_matches_plan(emu, shape, opshapes, axes, method, batch):
    rng = np.random.default_rng(sum(shape) * 7 + len(axes))
    ops = _ops(rng, opshapes, "wide" if method == "rescale_be" else "uniform")
    plan = plan_any(ops, axes, ndim=len(shape), method=method, moduli=15)
    X = rng.uniform(-1, 1, batch + shape)
    # tensors of very different scales, an all-zero one, signed zeros and subnormals
    X[(0,) * len(batch)] *= 2.0**-1060
    if X.shape[0] > 1:
        X[(1,) + (0,) * (len(batch) - 1)] = 0.0
    X.reshape(-1)[-1] = -0.0
    X.reshape(-1)[-2] *= 1e300
    for decode in ("fp64", "exact"):
        want = plan.run(X, decode=decode, backend="cpu")
        got, flags = run_fused(emu, plan, X, decode)
        assert flags == 0
        assert _same(got, want), (decode, np.argwhere(got != want)[:5])


def test_fused_kernel_ignores_stale_shared_memory(emu):
    rng = np.random.default_rng(3)
    plan = rt.plan_chain(_ops(rng, [(5, 5)] * 3), (0, 1, 2), moduli=12)
    X = rng.normal(size=(9, 5, 5, 5))
    a, _ = run_fused(emu, plan, X, fill=0x00)
    b, _ = run_fused(emu, plan, X, fill=0x7F)
    assert _same(a, b) and _same(a, plan.run(X, backend="cpu"))


def test_fused_kernel_flags_non_finite_input(emu):
    rng = np.random.default_rng(4)
    plan = rt.plan_chain(_ops(rng, [(4, 4)] * 2), (0, 1))
    X = rng.normal(size=(3, 4, 4))
    _, flags = run_fused(emu, plan, X)
    assert flags == 0
    X[2, 1, 3] = np.inf
    _, flags = run_fused(emu, plan, X)
    assert flags == 1


def test_fusable_says_why_not():
    rng = np.random.default_rng(5)
    A = rng.uniform(-1, 1, (8, 8))
    assert fused.reason(rt.plan_chain([A, A, A], (0, 1, 2)).fusion_request()) is None
    composed = rt.plan_chain([A, A], (0, 1), method="composed")
    assert "composed" in fused.reason(composed.fusion_request())
    twice = rt.plan_chain([A, A], (0, 0), ndim=2)
    with pytest.raises(ValueError, match="never contracted"):  # axis 1's length comes from the input
        twice.fusion_request()
    # (1, 0) -> (0, 1): axis 0 is not inside again
    assert "transpose" in fused.reason(twice.fusion_request((8, 3)))
    wide = rng.uniform(-1, 1, (4, 80))
    assert "columns" in fused.reason(rt.plan_chain([wide], (0,), ndim=1).fusion_request())
    with pytest.raises(ValueError, match="transpose"):
        fused.compile_request(twice.fusion_request((8, 3)))


def test_program_layout_and_tables():
    """The host program: a block batch within budget, operators padded with zero columns, tables in place."""
    rng = np.random.default_rng(6)
    plan = rt.plan_chain(_ops(rng, [(7, 5), (5, 5), (5, 5)]), (0, 1, 2), moduli=15)
    prog = fused.compile_request(plan.fusion_request())
    assert prog.in_shape == (5, 5, 5) and prog.out_shape == (7, 5, 5)
    assert prog.nb >= 1 and prog.shared_bytes <= fused.SHARED_BUDGET
    # ops: the three products and one drop op before each product that follows a drop
    assert prog.ints[0] == 3 and prog.ints[1] == 3 + sum(1 for d in plan.drops if d) and prog.ints[4] == prog.nb
    # first product: 5 columns padded to 8 bytes; its planes are the operator's residues on every modulus
    L = len(plan.basis)
    op0 = prog.ops[: L * 7 * 8].reshape(L, 7, 8)
    assert not op0[:, :, 5:].any()
    enc = plan.encoded_operators[0]
    assert np.array_equal(op0[:, :, :5], np.asarray(enc.residues))


@pytest.mark.parametrize("case", [0, 3, 6, 9])
def test_specialized_kernel_matches_plan(tmp_path_factory, case):
    """A plan compiled into the kernel (RNS_SPEC: constexpr program, unrolled loops, register digits)."""
    shape, opshapes, axes, method, batch = CASES[case]
    rng = np.random.default_rng(case)
    plan = rt.plan_chain(_ops(rng, opshapes, "wide"), axes, ndim=len(shape), method=method, moduli=15)
    prog = fused.compile_request(plan.fusion_request(shape))
    try:
        lib = ctypes.CDLL(str(build.chain_simt_library(cache=tmp_path_factory.mktemp("spec"), sanitize=SANITIZE,
                                                       headers=fused.spec_header(prog),
                                                       options=fused.SPEC_OPTIONS)))
    except build.KernelBuildError as exc:  # pragma: no cover
        pytest.skip(f"no C++20 host compiler: {exc}")
    X = rng.uniform(-1, 1, batch + shape) * np.exp2(rng.integers(-60, 60, batch + (1,) * len(shape)))
    X.reshape(-1)[0] = 0.0
    for decode in ("fp64", "exact"):
        got, flags = run_fused(lib, plan, X, decode)
        assert flags == 0 and _same(got, plan.run(X, decode=decode, backend="cpu"))


def test_spec_header_has_exact_literals():
    """The specialized program's arrays are written exactly (hex floats) and parse back to the program."""
    import re

    rng = np.random.default_rng(8)
    plan = rt.plan_chain(_ops(rng, [(6, 6)] * 2), (0, 1), moduli=13)
    prog = fused.compile_request(plan.fusion_request((6, 6)))
    (text,) = fused.spec_header(prog).values()
    assert "namespace rns_spec {" in text

    def array(name):
        return re.search(rf"\b{name}\[\]=\{{([^}}]*)\}}", text).group(1).split(",")

    assert [int(v) for v in array("PI")] == prog.ints.tolist()
    pf = np.array([float.fromhex(v.rstrip("f")) for v in array("PF")], np.float32)
    assert np.array_equal(pf.view(np.uint32), prog.floats.view(np.uint32))
    assert [float.fromhex(v) for v in array("QD")] == prog.qd.tolist()
    words = np.array([int(v) for v in array("OPW")], "<i4")
    assert words.tobytes() == prog.ops.tobytes()


@pytest.mark.parametrize("P, dim, shape", [(2, 3, (3, 2, 1)), (4, 3, (2, 2, 2)), (6, 2, (5, 3)), (8, 3, (1, 1, 3))])
def test_fused_mass_operator_matches_cpu(emu, P, dim, shape):
    """The mass operator (products, the Hadamard product with w detJ, transposed products) as one kernel."""
    from rnstensor.fem import MassOperator, TensorBasis, box_mesh

    basis = TensorBasis(P, dim=dim)
    mesh = box_mesh(basis, shape=shape, curved=0.15)
    op = MassOperator(basis, mesh.qdata)
    prog = fused.compile_request(op.fusion_request())
    assert prog.nfield == 1 and prog.nq == basis.Q**dim
    rng = np.random.default_rng(P + dim)
    u = rng.standard_normal((mesh.nelem,) + (P,) * dim) * np.exp2(rng.integers(-30, 30, (mesh.nelem,) + (1,) * dim))
    u[0] = 0.0  # an all-zero element
    field, fexp = operator_field(op)
    for decode in ("fp64", "exact"):
        got, flags = run_fused(emu, None, u, decode, prog=prog, field=field, fexp=fexp)
        assert flags == 0 and _same(got, op.apply(u, decode))


@pytest.mark.parametrize("P, dim, shape", [(2, 3, (2, 1, 1)), (3, 3, (2, 2, 1)), (5, 2, (3, 2)), (4, 2, (1, 1))])
def test_fused_poisson_operator_matches_cpu(emu, P, dim, shape):
    """The Poisson operator as one kernel: several partial gradients alive at once, sums of two and three
    terms, the Hadamard products with the packed G, transposed products accumulated into one result."""
    from rnstensor.fem import PoissonOperator, TensorBasis, box_mesh

    basis = TensorBasis(P, dim=dim)
    mesh = box_mesh(basis, shape=shape, curved=0.2 if shape != (1, 1) else 0.0)  # a straight box: G has zero components
    op = PoissonOperator(basis, mesh.G)
    prog = fused.compile_request(op.fusion_request())
    assert prog.nfield == 3 * (dim - 1) and prog.ints[20] > 2  # several tensors alive at once
    rng = np.random.default_rng(P * dim)
    u = rng.standard_normal((mesh.nelem,) + (P,) * dim) * np.exp2(rng.integers(-20, 20, (mesh.nelem,) + (1,) * dim))
    field, fexp = operator_field(op)
    for decode in ("fp64", "exact"):
        got, flags = run_fused(emu, None, u, decode, prog=prog, field=field, fexp=fexp)
        assert flags == 0 and _same(got, op.apply(u, decode))


def test_specialized_poisson_kernel_matches_cpu(tmp_path_factory):
    """The Poisson operator compiled into the kernel (its program as constexpr arrays)."""
    from rnstensor.fem import PoissonOperator, TensorBasis, box_mesh

    basis = TensorBasis(3)
    mesh = box_mesh(basis, shape=(2, 1, 1), curved=0.2)
    op = PoissonOperator(basis, mesh.G)
    prog = fused.compile_request(op.fusion_request())
    try:
        lib = ctypes.CDLL(str(build.chain_simt_library(cache=tmp_path_factory.mktemp("spec-poisson"), sanitize=SANITIZE,
                                                       headers=fused.spec_header(prog), options=fused.SPEC_OPTIONS)))
    except build.KernelBuildError as exc:  # pragma: no cover
        pytest.skip(f"no C++20 host compiler: {exc}")
    u = np.random.default_rng(9).standard_normal((mesh.nelem, 3, 3, 3))
    field, fexp = operator_field(op)
    got, flags = run_fused(lib, None, u, "fp64", prog=prog, field=field, fexp=fexp)
    assert flags == 0 and _same(got, op.apply(u))


def test_operator_fusable_says_why_not():
    from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

    basis = TensorBasis(3)
    mesh = box_mesh(basis, shape=(1, 1, 1))
    assert fused.reason(MassOperator(basis, mesh.qdata).fusion_request()) is None
    assert fused.reason(PoissonOperator(basis, mesh.G).fusion_request()) is None
    with pytest.raises(ValueError, match="cannot run fused: only method='rescale_be'"):
        MassOperator(basis, mesh.qdata, method="composed").fusion_request()
    with pytest.raises(ValueError, match="cannot run fused: only method='rescale_be'"):
        PoissonOperator(basis, mesh.G, method="float64").fusion_request()
    # Poisson sums two transposed products: fused for rows of at most 16 points, refused beyond
    wide = TensorBasis(16)
    with pytest.raises(ValueError, match="adds at most 2 over at most 16"):
        fused.compile_request(PoissonOperator(wide, box_mesh(wide, shape=(1, 1, 1)).G).fusion_request())
