"""rnstensor.dask: results identical bit for bit to the in-memory ones for any chunking, on a local cluster too."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import rnstensor as rt
from rnstensor.backends.cuda import cuda_available

da = pytest.importorskip("dask.array")
rd = pytest.importorskip("rnstensor.dask")


def _chain_case(nelem=23, n=4, seed=0):
    r = np.random.default_rng(seed)
    X = r.uniform(-1, 1, (nelem, n, n, n))
    ops = [r.uniform(-1, 1, (n, n)) for _ in range(3)]
    return X, ops


@pytest.mark.parametrize("chunk", [1, 5, 8, 23])
def test_apply_plan_and_expression_bitwise_for_any_chunking(chunk):
    X, ops = _chain_case()
    plan = rt.plan_chain(ops, [0, 1, 2], ndim=3)
    expr = rt.contract_expression("eijk,ai,bj,ck->eabc", X.shape, *ops, constants=[1, 2, 3])
    D = da.from_array(X, chunks=(chunk, 4, 4, 4))
    assert np.array_equal(rd.apply(plan, D).compute(), plan(X))
    assert np.array_equal(rd.apply(expr, D).compute(), expr(X))


@pytest.mark.parametrize("chunk", [1, 5])
def test_apply_certified_default_that_escalates_is_chunking_free(chunk):
    # one tensor of 23 spans e**+-12: it escalates to a wider plan (verdicts per tensor), in any chunk alike
    X, ops = _chain_case()
    X[5] *= np.exp(4 * np.random.default_rng(1).standard_normal(X.shape[1:]))
    plan = rt.plan_chain(ops, [0, 1, 2], ndim=3)
    want = plan(X)
    assert plan.last_evaluation != "residues on 15 moduli"  # some of the batch escalated
    assert np.array_equal(rd.apply(plan, da.from_array(X, chunks=(chunk, 4, 4, 4))).compute(), want)


@pytest.mark.parametrize("chunk", [1, 5])
def test_apply_certified_expression_that_escalates_is_chunking_free(chunk):
    # the same for a one-operand expression: its elements (the first index) decide their widths apart
    X, ops = _chain_case()
    X[5] *= np.exp(4 * np.random.default_rng(1).standard_normal(X.shape[1:]))
    expr = rt.contract_expression("eijk,ai,bj,ck->eabc", X.shape, *ops, constants=[1, 2, 3])
    want = expr(X)
    assert "(1 of 23 elements)" in expr.last_evaluation  # element 5 alone escalated
    assert np.array_equal(rd.apply(expr, da.from_array(X, chunks=(chunk, 4, 4, 4))).compute(), want)


def test_apply_with_a_function_of_batches_and_new_shapes():
    X, ops = _chain_case()
    A = np.random.default_rng(1).uniform(-1, 1, (2, 4))  # 4 -> 2 along every axis
    plan = rt.plan_chain([A, A, A], [0, 1, 2], ndim=3)
    D = da.from_array(X, chunks=(7, 4, 4, 4))
    out = rd.apply(plan, D)
    assert out.shape == (23, 2, 2, 2)
    assert np.array_equal(out.compute(), plan(X))
    g = rd.apply(lambda b: plan(b, decode="exact"), D)
    assert np.array_equal(g.compute(), plan(X, decode="exact"))


def test_apply_rejects_chunks_along_element_axes():
    X, ops = _chain_case()
    plan = rt.plan_chain(ops, [0, 1, 2], ndim=3)
    with pytest.raises(ValueError, match=r"chunk it along the element \(batch\) axis 0 only"):
        rd.apply(plan, da.from_array(X, chunks=(5, 2, 4, 4)))
    with pytest.raises(TypeError, match="dask.array.Array"):
        rd.apply(plan, X)


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
    )
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


def test_local_cluster_matches_in_memory(client):
    X, ops = _chain_case(nelem=40)
    plan = rt.plan_chain(ops, [0, 1, 2], ndim=3)
    D = da.from_array(X, chunks=(6, 4, 4, 4))
    assert np.array_equal(rd.apply(plan, D).compute(), plan(X))


def test_killed_worker_is_retried_without_a_wrong_result(client):
    import os
    import signal
    import time

    X, ops = _chain_case(nelem=64, n=8, seed=3)
    plan = rt.plan_chain(ops, [0, 1, 2], ndim=3)
    slow = lambda b: (time.sleep(0.15), plan(b))[1]  # noqa: E731 - long enough to kill a worker mid-run
    D = da.from_array(X, chunks=(2, 8, 8, 8))
    fut = client.compute(rd.apply(slow, D))
    time.sleep(0.6)
    pids = client.run(os.getpid)
    victim = sorted(pids.values())[0]
    os.kill(victim, signal.SIGKILL)
    result = fut.result(timeout=120)
    assert victim not in client.run(os.getpid).values()  # the worker really died (its nanny restarted it)
    assert np.array_equal(result, plan(X))


def _gemm_case(m=13, k=37, n=11, seed=0, cplx=False):
    r = np.random.default_rng(seed)
    A = r.uniform(-1, 1, (m, k)) * 2.0 ** r.integers(-20, 20, (m, k))
    B = r.uniform(-1, 1, (k, n))
    if cplx:
        A = A + 1j * r.uniform(-1, 1, A.shape)
        B = B + 1j * r.uniform(-1, 1, B.shape) * 2.0 ** r.integers(-10, 10, B.shape)
    return A, B


@pytest.mark.parametrize(
    "moduli,chunks",
    [
        (None, ((4, 5), (7, 3))),
        (None, ((13, 37), (37, 11))),
        ("auto", ((5, 9), (9, 4))),
        ("auto", ((13, 37), (37, 11))),
        (12, ((1, 37), (37, 1))),
        (12, ((6, 10), (12, 5))),
    ],
)
def test_dgemm_bitwise_for_any_chunking(moduli, chunks):
    A, B = _gemm_case()
    ref = rt.dgemm(A, B, moduli=moduli)
    D = rd.dgemm(da.from_array(A, chunks=chunks[0]), da.from_array(B, chunks=chunks[1]), moduli=moduli)
    assert np.array_equal(D.compute(), ref)


def _assert_correctly_rounded(got, A, B):
    """Every entry of ``got`` is ``A @ B`` rounded once (Fractions)."""
    rows, cols = [[Fraction(float(v)) for v in r] for r in A], [[Fraction(float(v)) for v in c] for c in B.T]
    for i, j in np.ndindex(got.shape):
        assert got[i, j] == float(sum(x * y for x, y in zip(rows[i], cols[j])))


def test_dgemm_default_widens_like_in_memory_and_refuses_splits():
    rng = np.random.default_rng(6)
    A, B = rng.standard_normal((9, 40)), rng.standard_normal((40, 7))
    A[0, :20] *= 2.0**-60  # a row whose small entries meet B's large ones: more moduli than the 53-bit width
    B[:20] *= 2.0**30
    assert rt.gemm_moduli(A, B) > rt.gemm_moduli(A, B, "fast")
    got = rd.dgemm(da.from_array(A, chunks=(4, 16)), da.from_array(B, chunks=(16, 3))).compute()
    assert np.array_equal(got, rt.dgemm(A, B))
    A[1, :20] *= 2.0**-1000  # beyond 49 moduli, every product mattering: in memory split exactly; Dask says so
    A[1, 20:] *= 2.0**900
    B[:20] *= 2.0**870
    B[20:] *= 2.0**-1000
    with pytest.raises(rt.RNSRangeError, match="in-memory dgemm splits") as info:
        rd.dgemm(da.from_array(A, chunks=(4, 16)), da.from_array(B, chunks=(16, 3)))
    assert "moduli='auto'" in str(info.value)
    fast = rd.dgemm(da.from_array(A, chunks=(4, 16)), da.from_array(B, chunks=(16, 3)), moduli="fast").compute()
    assert np.array_equal(fast, rt.dgemm(A, B, moduli="fast"))
    # the fix it names: 'auto' splits each output tile exactly, as in memory (correctly rounded: the same bits)
    got = rd.dgemm(da.from_array(A, chunks=(4, 16)), da.from_array(B, chunks=(16, 3)), moduli="auto").compute()
    assert np.array_equal(got, rt.dgemm(A, B, moduli="auto"))
    _assert_correctly_rounded(got, A, B)


def test_auto_splits_every_entry_point_beyond_49_moduli():
    # rows and columns 49 moduli cannot hold exactly: zgemm with complex alpha, beta and c, and matmul, rounded once
    rng = np.random.default_rng(8)
    A = rng.standard_normal((6, 30)) * np.exp2(rng.integers(-480, 480, (6, 30)))
    B = rng.standard_normal((30, 5)) * np.exp2(rng.integers(-480, 480, (30, 5)))
    with pytest.raises(rt.RNSRangeError, match="splits such rows"):  # (the default's width cannot: a split)
        rd.dgemm(da.from_array(A, chunks=3), da.from_array(B, chunks=3))
    Z, W = A + 1j * A[::-1], B - 2j * B[::-1]
    C = rng.standard_normal((6, 5)) + 1j
    kw = dict(alpha=0.5 - 1.5j, beta=2 + 1j, moduli="auto")
    got = rd.zgemm(da.from_array(Z, chunks=(4, 7)), da.from_array(W, chunks=(9, 2)), C, **kw).compute()
    assert np.array_equal(got, rt.zgemm(Z, W, C, **kw))
    got = rd.matmul(da.from_array(A, chunks=(3, 10)), da.from_array(B, chunks=(10, 3)), moduli="auto").compute()
    assert np.array_equal(got, rt.matmul(A, B, moduli="auto"))
    _assert_correctly_rounded(got, A, B)


@pytest.mark.parametrize("rtol", [1e-10, 1.2e-16])
def test_targets_split_tiles_as_in_memory(rtol):
    # rtol= on rows 49 moduli cannot hold: in memory the exact split (correctly rounded product), beta * c added in
    # float64 (a loose target) or before the one rounding (a target within the float64 epilogue's roundings); every
    # tile the same, for any chunking (this was refused, naming a fix the in-memory call did not need)
    rng = np.random.default_rng(9)
    A = rng.standard_normal((6, 30)) * np.exp2(rng.integers(-480, 480, (6, 30)))
    B = rng.standard_normal((30, 5))
    C = rng.standard_normal((6, 5))
    for chunks in ((3, 10), (4, 30), (6, 7)):
        got = rd.dgemm(da.from_array(A, chunks=chunks), da.from_array(B, chunks=(chunks[1], 2)), C, alpha=1.5,
                       beta=-0.3, rtol=rtol).compute()
        assert np.array_equal(got, rt.dgemm(A, B, C, alpha=1.5, beta=-0.3, rtol=rtol))
    Z, W = A + 1j * A[::-1], B - 2j * B[::-1]
    kw = dict(alpha=0.5 - 1.5j, beta=2 + 1j, rtol=rtol)
    got = rd.zgemm(da.from_array(Z, chunks=(4, 7)), da.from_array(W, chunks=(9, 2)), C + 1j, **kw).compute()
    assert np.array_equal(got, rt.zgemm(Z, W, C + 1j, **kw))


def test_dgemm_blas_parameters_and_non_finite_rows():
    A, B = _gemm_case(seed=1)
    C = np.random.default_rng(2).uniform(-1, 1, (13, 11))
    ref = rt.dgemm(A.T.copy(), B, C, alpha=1.5, beta=-0.5, trans_a="T")
    got = rd.dgemm(da.from_array(A.T.copy(), chunks=(6, 4)), da.from_array(B, chunks=(5, 5)), C, alpha=1.5, beta=-0.5, trans_a="T")
    assert np.array_equal(got.compute(), ref)
    An = A.copy()
    An[2, 3], An[5, 1] = np.inf, np.nan
    got = rd.dgemm(da.from_array(An, chunks=(4, 5)), da.from_array(B, chunks=(7, 3))).compute()
    assert np.array_equal(got, rt.dgemm(An, B), equal_nan=True)
    Cn = np.full((13, 11), np.nan)
    assert np.array_equal(rd.dgemm(da.from_array(A, chunks=4), da.from_array(B, chunks=4), Cn).compute(), rt.dgemm(A, B))


def test_auto_with_alpha_beta_is_the_in_memory_correctly_rounded_result():
    # moduli='auto' rounds alpha op(a) op(b) + beta c once, in every tile as in memory (the exact epilogue)
    A, B = _gemm_case(seed=6)
    C = np.random.default_rng(7).standard_normal((13, 11)) * 1e-5
    ref = rt.dgemm(A, B, C, alpha=1.5, beta=-0.3, moduli="auto")
    got = rd.dgemm(da.from_array(A, chunks=(5, 7)), da.from_array(B, chunks=(6, 4)), C, alpha=1.5, beta=-0.3,
                   moduli="auto").compute()
    assert np.array_equal(got, ref)
    Z = A + 1j * A[::-1]
    W = B - 2j * B
    ref = rt.zgemm(Z, W, C + 1j, alpha=0.5 - 1.5j, beta=2 + 1j, moduli="auto")
    got = rd.zgemm(da.from_array(Z, chunks=4), da.from_array(W, chunks=(5, 6)), C + 1j, alpha=0.5 - 1.5j,
                   beta=2 + 1j, moduli="auto").compute()
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("trans_b", ["N", "C"])
def test_zgemm_bitwise_for_any_chunking(trans_b):
    A, B = _gemm_case(cplx=True, seed=4)
    Bop = B if trans_b == "N" else B.T.copy()
    ref = rt.zgemm(A, Bop, alpha=2 - 1j, trans_b=trans_b) if trans_b != "C" else rt.zgemm(A, B.conj().T.copy(), alpha=2 - 1j, trans_b="C")
    Bin = Bop if trans_b != "C" else B.conj().T.copy()
    got = rd.zgemm(da.from_array(A, chunks=(4, 6)), da.from_array(Bin, chunks=5), alpha=2 - 1j, trans_b=trans_b)
    assert np.array_equal(got.compute(), ref)


def test_zgemm_complex_alpha_terms_past_the_range_as_in_memory():
    # (ar + i ai)(Re + i Im): the decode's two float64 terms both past the range gave inf - inf = NaN in a Dask
    # tile where the real part is exactly -2**999; the one epilogue recomputes them exactly, as in memory:
    # (1 + i)(2**1024 (1 + i) + 2**999 i) = -2**999 + (2**1025 + 2**999) i
    a = np.array([[2.0**1001 + 0j, 2.0**1000], [3.0 + 1j, 2.0]])
    b = np.array([[2.0**23 + 2.0**23 * 1j, 1.0], [0.5j, 1.0]])
    for chunks in ((1, 1), (2, 1)):
        y = rd.zgemm(da.from_array(a, chunks=chunks), da.from_array(b, chunks=chunks), alpha=1 + 1j).compute()
        assert y[0, 0].real == -2.0**999 and y[0, 0].imag == np.inf
        assert np.array_equal(y, rt.zgemm(a, b, alpha=1 + 1j))


def test_matmul_vectors_and_batches():
    A, B = _gemm_case(seed=5)
    S = np.stack([A, -A])
    assert np.array_equal(rd.matmul(da.from_array(S, chunks=(1, 4, 5)), da.from_array(B, chunks=(7, 3))).compute(), rt.matmul(S, B))
    assert np.array_equal(rd.matmul(da.from_array(A, chunks=(4, 5)), da.from_array(B[:, 0], chunks=7)).compute(), rt.matmul(A, B[:, 0]))


def test_gemm_bad_input():
    A, B = _gemm_case()
    with pytest.raises(TypeError, match="dask.array.Array"):
        rd.dgemm(A, da.from_array(B))
    with pytest.raises(ValueError, match="shape mismatch"):
        rd.dgemm(da.from_array(A), da.from_array(B.T.copy()))
    with pytest.raises(TypeError, match="float64"):
        rd.dgemm(da.from_array(A.astype(np.float32)), da.from_array(B))
    with pytest.raises(ValueError, match="beta"):
        rd.dgemm(da.from_array(A), da.from_array(B), beta=2.0)


def test_dgemm_on_a_local_cluster(client):
    A, B = _gemm_case(m=40, k=300, n=30, seed=6)
    got = rd.dgemm(da.from_array(A, chunks=(16, 64)), da.from_array(B, chunks=(100, 8)), moduli="auto")
    assert np.array_equal(got.compute(), rt.dgemm(A, B, moduli="auto"))


@pytest.mark.parametrize("chunk", [1, 5, 12])
def test_apply_fem_operators_bitwise(chunk):
    from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

    basis = TensorBasis(3, dim=3)
    mesh = box_mesh(basis, shape=(3, 2, 2), curved=0.1)
    u = mesh.gather(np.sin(mesh.coords[:, 0]) + mesh.coords[:, 2])
    U = da.from_array(u, chunks=(chunk, 3, 3, 3))
    for op in (MassOperator(basis, mesh.qdata), PoissonOperator(basis, mesh.G)):
        assert np.array_equal(rd.apply(op, U).compute(), op.apply(u))
    with pytest.raises(ValueError, match="elements"):
        rd.apply(MassOperator(basis, mesh.qdata[:5]), U)


# ----- NumPy or CuPy chunks: the dispatch, checked without CuPy -----------------------------------

class _FakeDeviceArray(np.ndarray):
    """A NumPy array whose type claims to live in CuPy: drives the chunk-type dispatch without a GPU."""


_FakeDeviceArray.__module__ = "cupy._fake"


class _FakeOtherArray(np.ndarray):
    pass


_FakeOtherArray.__module__ = "sparse._fake"


def _fake(x, cls=_FakeDeviceArray, chunks=4):
    return da.from_array(np.asarray(x).view(cls), chunks=chunks)


def test_chunk_module_reads_the_meta():
    A, _ = _gemm_case()
    assert rd.chunk_module(da.from_array(A, chunks=4)) == "numpy"
    assert rd.chunk_module(A) == "numpy"
    assert rd.chunk_module(_fake(A)) == "cupy"
    assert rd.chunk_module(_fake(A, _FakeOtherArray)) == "sparse"


@pytest.mark.skipif(cuda_available(), reason="checks the refusal on a machine without a GPU")
def test_backend_cuda_is_refused_without_a_device():
    A, B = _gemm_case()
    X, ops = _chain_case()
    plan = rt.plan_chain(ops, [0, 1, 2], ndim=3)
    D = da.from_array(X, chunks=(5, 4, 4, 4))
    msg = r"the 'cuda' backend (needs CuPy|found no CUDA device)"
    with pytest.raises(RuntimeError, match=msg):
        rd.dgemm(da.from_array(A, chunks=4), da.from_array(B, chunks=4), backend="cuda")
    with pytest.raises(RuntimeError, match=msg):
        rd.matmul(da.from_array(A, chunks=4), da.from_array(B, chunks=4), backend="cuda")
    with pytest.raises(RuntimeError, match=msg):
        rd.apply(plan, D, backend="cuda")
    # CuPy chunks mean backend 'cuda': refused the same way, when the graph is built
    with pytest.raises(RuntimeError, match=msg):
        rd.dgemm(_fake(A), _fake(B))
    with pytest.raises(RuntimeError, match=msg):
        rd.zgemm(_fake(A.astype(complex)), _fake(B.astype(complex)))
    with pytest.raises(RuntimeError, match=msg):
        rd.apply(plan, _fake(X, chunks=(5, 4, 4, 4)))


def test_device_chunks_refuse_a_host_backend_and_mixing():
    A, B = _gemm_case()
    with pytest.raises(ValueError, match=r"CuPy chunks run on backend='cuda'.*got backend='cpu'"):
        rd.dgemm(_fake(A), _fake(B), backend="cpu")
    with pytest.raises(TypeError, match=r"a has CuPy chunks, b has NumPy chunks.*move one explicitly"):
        rd.dgemm(_fake(A), da.from_array(B, chunks=4))
    with pytest.raises(TypeError, match=r"a has NumPy chunks, b has CuPy chunks"):
        rd.matmul(da.from_array(A, chunks=4), _fake(B))
    C = np.zeros((13, 11))
    with pytest.raises(TypeError, match=r"c has CuPy chunks"):
        rd.dgemm(da.from_array(A, chunks=4), da.from_array(B, chunks=4), _fake(C), beta=1.0)
    with pytest.raises(TypeError, match=r"NumPy or CuPy chunks"):
        rd.dgemm(_fake(A, _FakeOtherArray), _fake(B, _FakeOtherArray))
    with pytest.raises(ValueError, match="backend must be one of"):
        rd.dgemm(da.from_array(A, chunks=4), da.from_array(B, chunks=4), backend="tpu")


def test_results_keep_numpy_meta():
    A, B = _gemm_case()
    X, ops = _chain_case()
    plan = rt.plan_chain(ops, [0, 1, 2], ndim=3)
    for r in (
        rd.dgemm(da.from_array(A, chunks=4), da.from_array(B, chunks=4)),
        rd.matmul(da.from_array(np.stack([A, A]), chunks=4), da.from_array(B, chunks=4)),
        rd.apply(plan, da.from_array(X, chunks=(5, 4, 4, 4))),
    ):
        assert type(r._meta) is np.ndarray and r._meta.dtype == np.float64


@pytest.mark.parametrize("moduli", [None, "auto", 12])
@pytest.mark.parametrize("cplx", [False, True])
def test_batched_matmul_blocks_are_the_in_memory_matmul(moduli, cplx):
    """Batched matmul runs rt.matmul on whole-k blocks (NumPy or CuPy alike): its bits, inf / NaN included."""
    A, B = _gemm_case(m=9, k=21, n=7, seed=7, cplx=cplx)
    S = np.stack([A, -2.0 * A, A[::-1]])
    S[1, 4, 3] = np.inf
    T = B.copy()
    T[5, 2] = np.nan
    St = S.transpose(0, 2, 1).copy()  # (3, 21, 9)
    cases = ((S, B), (S, T), (A, np.stack([B, T])), (S, B[:, 0]), (A[0], St), (S[:, None], np.stack([B, -B])))
    for x, y in cases:
        got = rd.matmul(da.from_array(x, chunks=2), da.from_array(y, chunks=2), moduli=moduli).compute()
        ref = rt.matmul(x, y, moduli=moduli)
        assert got.shape == ref.shape
        assert np.array_equal(got, ref, equal_nan=True)
    empty = rd.matmul(da.from_array(S[:, :, :0]), da.from_array(B[:0]), moduli=moduli)
    assert empty.compute().shape == (3, 9, 7)


@pytest.mark.parametrize("cplx", [False, True])
def test_explicit_backend_is_passed_to_every_block(cplx):
    """backend='numpy' (the reference backend) reaches every block: the same bits as the default."""
    A, B = _gemm_case(m=7, k=11, n=5, seed=8, cplx=cplx)
    f = rd.zgemm if cplx else rd.dgemm
    ref = (rt.zgemm if cplx else rt.dgemm)(A, B)
    got = f(da.from_array(A, chunks=(3, 4)), da.from_array(B, chunks=(5, 2)), backend="numpy")
    assert np.array_equal(got.compute(), ref)
    X, ops = _chain_case(nelem=7, n=3)
    plan = rt.plan_chain(ops, [0, 1, 2], ndim=3)
    expr = rt.contract_expression("eijk,ai,bj,ck->eabc", X.shape, *ops, constants=[1, 2, 3])
    D = da.from_array(X, chunks=(3, 3, 3, 3))
    assert np.array_equal(rd.apply(plan, D, backend="numpy").compute(), plan(X))
    assert np.array_equal(rd.apply(expr, D, backend="numpy").compute(), expr(X))
