"""Public features with backend='cuda' equal to backend='cpu' bit for bit (chains, GEMM, einsum, FEM)."""

from __future__ import annotations

import numpy as np
import pytest

import rnstensor as rt

from cuda_support import cupy_or_skip  # noqa: E402

cupy_or_skip()


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


METHODS = ["rescale_be", "rescale", "norescale", "composed"]


def _chain_plan(method):
    rng = np.random.default_rng(1)
    # the papers' four methods at whatever width each keeps (min_bits=0): the point is CPU == GPU, bit for bit
    return rt.plan_chain([rng.uniform(-1, 1, (8, 8)) for _ in range(3)], [0, 1, 2], method=method, min_bits=0), rng


def spec_programs():
    """The fused programs this module runs (tests/gpu/conftest.py builds their kernels side by side first)."""
    from rnstensor.kernels import fused

    plans = [_chain_plan(m)[0] for m in METHODS]
    return [fused.compile_request(p.fusion_request((8, 8, 8))) for p in plans if fused.reason(p.fusion_request((8, 8, 8))) is None]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("decode", ["fp64", "exact"])
@pytest.mark.parametrize("fused", [None, False])  # the fused kernel where it applies, and step by step
def test_chain(method, decode, fused):
    plan, rng = _chain_plan(method)
    X = rng.uniform(-1, 1, (16, 8, 8, 8))
    same(plan.run(X, decode, backend="cuda", fused=fused), plan.run(X, decode, backend="cpu"))


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (17, 33, 9), (64, 300, 48), (128, 2048, 64)])
def test_dgemm_zgemm(m, k, n):
    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((m, k)) * np.exp2(rng.integers(-20, 20, (m, 1)))
    b = rng.standard_normal((k, n))
    same(rt.dgemm(a, b, backend="cuda"), rt.dgemm(a, b, backend="cpu"))
    za = a + 1j * rng.standard_normal((m, k))
    zb = b - 1j * rng.standard_normal((k, n))
    same(rt.zgemm(za, zb, backend="cuda"), rt.zgemm(za, zb, backend="cpu"))


@pytest.mark.parametrize("moduli", [None, "auto"])
def test_matmul_stack_on_device(moduli):
    # a stack of CuPy matrices runs batched on the device: the bits of the host stack, matrix by matrix
    import cupy as cp

    rng = np.random.default_rng(4)
    a = rng.standard_normal((12, 33, 40)) * np.exp2(rng.integers(-20, 20, (12, 1, 1)))
    b = rng.standard_normal((12, 40, 17)) * np.exp2(rng.integers(-20, 20, (12, 1, 17)))
    same(rt.matmul(cp.asarray(a), cp.asarray(b), moduli=moduli).get(), rt.matmul(a, b, moduli=moduli))
    za, zb = a + 1j * a[:, ::-1], b - 1j * b[::-1]
    same(rt.matmul(cp.asarray(za), cp.asarray(zb), moduli=moduli).get(), rt.matmul(za, zb, moduli=moduli))


def test_einsum():
    rng = np.random.default_rng(3)
    A, B, C = rng.standard_normal((6, 7)), rng.standard_normal((7, 8)), rng.standard_normal((8, 5))
    same(rt.einsum("ij,jk,kl->il", A, B, C, backend="cuda"), rt.einsum("ij,jk,kl->il", A, B, C, backend="cpu"))


def test_auto_einsum_beyond_one_plan():  # (not test_einsum*: test_gpu_required selects that one name)
    # moduli='auto' where no plan of 49 moduli holds the value: pairwise in integers, the limb GEMMs on the device
    # (K = 64 against at most 3 x 3 limb pairs: the residue route); correctly rounded, so the host's bits
    import cupy as cp

    rng = np.random.default_rng(7)
    A = rng.standard_normal((5, 64)) * np.exp2(rng.integers(-50, 50, (5, 64)))
    B = rng.standard_normal((64, 64)) * np.exp2(rng.integers(-50, 50, (64, 64)))
    C = rng.standard_normal((64, 3)) * np.exp2(rng.integers(-50, 50, (64, 3)))
    want = rt.einsum("ij,jk,kl->il", A, B, C, moduli="auto")
    same(rt.einsum("ij,jk,kl->il", cp.asarray(A), cp.asarray(B), cp.asarray(C), moduli="auto").get(), want)


def test_auto_gemm_beyond_one_plan():
    # dgemm / zgemm moduli='auto' on rows no 49 moduli hold, alpha, beta and c: the exact product's integers on the
    # host, its limb GEMMs (K = 64: the residue route) on the device, a CuPy result; correctly rounded, the host's bits
    import cupy as cp

    rng = np.random.default_rng(8)
    a = rng.standard_normal((6, 64)) * np.exp2(rng.integers(-500, 500, (6, 64)))
    b, c = rng.standard_normal((64, 5)), rng.standard_normal((6, 5))
    want = rt.dgemm(a, b, c, alpha=1.5, beta=-0.3, moduli="auto")
    same(rt.dgemm(cp.asarray(a), cp.asarray(b), cp.asarray(c), alpha=1.5, beta=-0.3, moduli="auto").get(), want)
    za, zb, zc = a + 1j * a[::-1], b - 0.5j * b[::-1], c + 1j
    want = rt.zgemm(za, zb, zc, alpha=0.5 + 2j, beta=1 - 1j, moduli="auto")
    same(rt.zgemm(cp.asarray(za), cp.asarray(zb), cp.asarray(zc), alpha=0.5 + 2j, beta=1 - 1j,
                  moduli="auto").get(), want)


def test_gemm_shaped_einsum():
    # one GEMM: each element on the moduli dgemm gives it alone, dgemm's program; on the device the host's bits
    import cupy as cp

    rng = np.random.default_rng(6)
    a = rng.standard_normal((8, 8, 30)) * np.exp(4 * rng.standard_normal((8, 8, 30)))
    b = rng.standard_normal((30, 20)) * np.exp(4 * rng.standard_normal((30, 20)))
    want = rt.einsum("ijk,kl->ijl", a, b)
    same(rt.einsum("ijk,kl->ijl", a, b, backend="cuda"), want)
    same(rt.einsum("ijk,kl->ijl", cp.asarray(a), cp.asarray(b)).get(), want)
    same(want[3], rt.dgemm(a[3], b))
    c = a + 1j * rng.standard_normal(a.shape)  # complex: zgemm's moduli and bits per element
    want = rt.einsum("ijk,kl->ijl", c, b)
    same(rt.einsum("ijk,kl->ijl", cp.asarray(c), cp.asarray(b)).get(), want)
    same(want[5], rt.zgemm(c[5], b.astype(complex)))


@pytest.mark.parametrize("moduli", [None, "fast", "auto"])
def test_matmul_stack_sharing_b(moduli):
    # a stack times one matrix: each matrix on dgemm's own choice (the default) or the stacked rows as one GEMM (a
    # fixed width, a correctly rounded policy); on the device the host's bits
    import cupy as cp

    rng = np.random.default_rng(25)
    a = rng.standard_normal((4, 3, 60)) * np.exp(4 * rng.standard_normal((4, 3, 60)))
    b = rng.standard_normal((60, 4)) * np.exp(4 * rng.standard_normal((60, 4)))
    want = rt.matmul(a, b, moduli=moduli)
    same(rt.matmul(cp.asarray(a), cp.asarray(b), moduli=moduli).get(), want)
    same(want[2], rt.dgemm(a[2], b, moduli=moduli))


@pytest.mark.parametrize("moduli", [None, "fast"])
def test_expression_mode_chain_fused(moduli):
    # an expression's mode products by constant operators: one fused chain kernel on the device (compile_program)
    rng = np.random.default_rng(5)
    ops = [rng.uniform(-1, 1, (5, 4)) for _ in range(3)]
    X = rng.uniform(-1, 1, (32, 4, 4, 4))
    expr = rt.contract_expression("eijk,ai,bj,ck->eabc", X.shape, *ops, constants=[1, 2, 3], moduli=moduli)
    same(expr(X, backend="cuda"), expr(X, backend="cpu"))


def test_fem_operators():
    from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

    b = TensorBasis(4)
    mesh = box_mesh(b, shape=(2, 2, 1), upper=(1.0, 1.0, 0.5), curved=0.1)
    u = np.random.default_rng(4).standard_normal((mesh.nelem, 4, 4, 4))
    for Op, data in ((MassOperator, mesh.qdata), (PoissonOperator, getattr(mesh, "G", None))):
        if data is None:
            continue
        same(Op(b, data, backend="cuda").apply(u), Op(b, data, backend="cpu").apply(u))
