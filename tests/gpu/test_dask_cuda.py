"""rnstensor.dask with CuPy chunks: the in-memory CPU results bit for bit, CuPy chunks out, blocks kept on the device."""

from __future__ import annotations

import os

import numpy as np
import pytest

import rnstensor as rt

from cuda_support import cupy_or_skip  # noqa: E402

cp = cupy_or_skip()

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
rd = pytest.importorskip("rnstensor.dask")

from test_dask import _gemm_case  # noqa: E402  (the same operands as the CPU tests)


@pytest.fixture(autouse=True)
def _threads():
    # the default threaded scheduler: several blocks on one device at once
    with dask.config.set(scheduler="threads"):
        yield


def dev(x, chunks):
    """A Dask array with CuPy chunks (and a CuPy meta)."""
    D = da.from_array(np.asarray(x), chunks=chunks).map_blocks(cp.asarray, dtype=np.asarray(x).dtype)
    assert isinstance(D._meta, cp.ndarray)
    return D


def same_on_device(D, ref, client=None):
    """``D`` (a Dask array) has CuPy chunks and computes to ``ref`` (NumPy) bit for bit (on ``client`` if given)."""
    assert isinstance(D._meta, cp.ndarray), type(D._meta)
    got = D.compute() if client is None else client.compute(D).result(timeout=120)
    assert isinstance(got, cp.ndarray), type(got)
    got = cp.asnumpy(got)
    ref = np.asarray(ref)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))


@pytest.mark.parametrize(
    "moduli,chunks",
    [
        (None, ((4, 5), (7, 3))),
        (None, ((13, 37), (37, 11))),
        ("auto", ((5, 9), (9, 4))),
        (12, ((1, 37), (37, 1))),
        (12, ((6, 10), (12, 5))),  # b's k chunks differ from a's: rechunked
    ],
)
def test_dgemm_bitwise_for_any_chunking(moduli, chunks):
    A, B = _gemm_case()
    ref = rt.dgemm(A, B, moduli=moduli, backend="cpu")
    same_on_device(rd.dgemm(dev(A, chunks[0]), dev(B, chunks[1]), moduli=moduli), ref)


@pytest.mark.parametrize("moduli", [None, "auto"])
def test_dgemm_long_k_chunked(moduli):
    A, B = _gemm_case(m=40, k=1300, n=30, seed=6)
    ref = rt.dgemm(A, B, moduli=moduli, backend="cpu")
    same_on_device(rd.dgemm(dev(A, (16, 128)), dev(B, (300, 7)), moduli=moduli), ref)


def test_dgemm_blas_parameters_and_non_finite_rows():
    A, B = _gemm_case(seed=1)
    C = np.random.default_rng(2).uniform(-1, 1, (13, 11))
    At = A.T.copy()
    ref = rt.dgemm(At, B, C, alpha=1.5, beta=-0.5, trans_a="T", backend="cpu")
    same_on_device(rd.dgemm(dev(At, (6, 4)), dev(B, (5, 5)), dev(C, (3, 4)), alpha=1.5, beta=-0.5, trans_a="T"), ref)
    # an in-memory c (NumPy or CuPy) goes to the device
    same_on_device(rd.dgemm(dev(At, (6, 4)), dev(B, (5, 5)), C, alpha=1.5, beta=-0.5, trans_a="T"), ref)
    same_on_device(rd.dgemm(dev(At, (6, 4)), dev(B, (5, 5)), cp.asarray(C), alpha=1.5, beta=-0.5, trans_a="T"), ref)
    An = A.copy()
    An[2, 3], An[5, 1] = np.inf, np.nan
    Bn = B.copy()
    Bn[4, 7] = -np.inf
    got = cp.asnumpy(rd.dgemm(dev(An, (4, 5)), dev(Bn, (7, 3))).compute())
    ref = rt.dgemm(An, Bn, backend="cpu")
    assert np.array_equal(got, ref, equal_nan=True)
    fin = np.isfinite(ref)
    assert np.array_equal(got[fin].view(np.uint8), ref[fin].view(np.uint8))


@pytest.mark.parametrize("trans_b", ["N", "C"])
@pytest.mark.parametrize("beta", [0.0, -0.5, 0.25 - 1.5j])
def test_zgemm_bitwise_for_any_chunking(trans_b, beta):
    A, B = _gemm_case(cplx=True, seed=4)
    Bin = B if trans_b == "N" else B.conj().T.copy()
    C = np.random.default_rng(5).uniform(-1, 1, (13, 11)) + 1j * np.random.default_rng(6).uniform(-1, 1, (13, 11))
    c = C if beta != 0 else None
    ref = rt.zgemm(A, Bin, c, alpha=2 - 1j, beta=beta, trans_b=trans_b, backend="cpu")
    got = rd.zgemm(dev(A, (4, 6)), dev(Bin, 5), None if c is None else dev(C, (5, 4)), alpha=2 - 1j, beta=beta, trans_b=trans_b)
    same_on_device(got, ref)


@pytest.mark.parametrize("moduli", [None, "auto"])
def test_matmul_2d_vectors_and_batches(moduli):
    A, B = _gemm_case(seed=5)
    S = np.stack([A, -A, A * 2.0**-30])
    same_on_device(rd.matmul(dev(A, (4, 5)), dev(B, (7, 3)), moduli=moduli), rt.matmul(A, B, moduli=moduli, backend="cpu"))
    same_on_device(rd.matmul(dev(A, (4, 5)), dev(B[:, 0], 7), moduli=moduli), rt.matmul(A, B[:, 0], moduli=moduli, backend="cpu"))
    same_on_device(rd.matmul(dev(S, (1, 4, 5)), dev(B, (7, 3)), moduli=moduli), rt.matmul(S, B, moduli=moduli, backend="cpu"))
    Z = S + 1j * S[::-1]
    same_on_device(rd.matmul(dev(Z, (2, 5, 9)), dev(B, (37, 4)), moduli=moduli), rt.matmul(Z, B, moduli=moduli, backend="cpu"))


def _chain_case(nelem=23, n=4, seed=0):
    r = np.random.default_rng(seed)
    X = r.uniform(-1, 1, (nelem, n, n, n))
    ops = [r.uniform(-1, 1, (n, n)) for _ in range(3)]
    return X, ops


@pytest.mark.parametrize("chunk", [1, 5, 23])
def test_apply_plan_expression_and_function(chunk):
    X, ops = _chain_case()
    plan = rt.plan_chain(ops, [0, 1, 2], ndim=3)
    expr = rt.contract_expression("eijk,ai,bj,ck->eabc", X.shape, *ops, constants=[1, 2, 3])
    D = dev(X, (chunk, 4, 4, 4))
    same_on_device(rd.apply(plan, D), plan.run(X, backend="cpu"))
    same_on_device(rd.apply(expr, D), expr(X, backend="cpu"))
    same_on_device(rd.apply(lambda b: plan(b, decode="exact"), D), plan.run(X, "exact", backend="cpu"))
    A = np.random.default_rng(1).uniform(-1, 1, (2, 4))  # a new element shape
    small = rt.plan_chain([A, A, A], [0, 1, 2], ndim=3)
    same_on_device(rd.apply(small, D), small.run(X, backend="cpu"))


@pytest.mark.parametrize("chunk", [1, 5, 12])
def test_apply_fem_operators(chunk):
    from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

    basis = TensorBasis(3, dim=3)
    mesh = box_mesh(basis, shape=(3, 2, 2), curved=0.1)
    u = mesh.gather(np.sin(mesh.coords[:, 0]) + mesh.coords[:, 2])
    U = dev(u, (chunk, 3, 3, 3))
    for op in (MassOperator(basis, mesh.qdata), PoissonOperator(basis, mesh.G)):
        same_on_device(rd.apply(op, U), op.apply(u))


def test_gemm_keeps_blocks_on_the_device(monkeypatch):
    """Between encode and decode no block leaves the device: every backend call gets CuPy, only vectors come home."""
    from rnstensor.backends.cuda import CudaBackend

    host_results = []
    orig_out = CudaBackend._out

    def out(self, arr, host):
        host_results.append(host)
        return orig_out(self, arr, host)

    moved = []
    orig_host = rd._host

    def to_host(a):
        moved.append(getattr(a, "ndim", 0))
        return orig_host(a)

    monkeypatch.setattr(CudaBackend, "_out", out)
    monkeypatch.setattr(rd, "_host", to_host)
    A, B = _gemm_case(m=20, k=300, n=12, seed=9)
    with dask.config.set(scheduler="synchronous"):  # the patches hold in this thread
        same_on_device(rd.dgemm(dev(A, (8, 64)), dev(B, (100, 5)), moduli="auto"), rt.dgemm(A, B, moduli="auto", backend="cpu"))
        Z, W = _gemm_case(m=9, k=50, n=7, seed=10, cplx=True)
        same_on_device(rd.zgemm(dev(Z, (4, 16)), dev(W, (20, 3)), alpha=0.5 + 2j), rt.zgemm(Z, W, alpha=0.5 + 2j, backend="cpu"))
        S = np.stack([A, A[::-1]])
        same_on_device(rd.matmul(dev(S, (1, 8, 300)), dev(B, (300, 5))), rt.matmul(S, B, backend="cpu"))
    assert host_results and not any(host_results)  # no backend call took or returned NumPy
    assert moved and max(moved) <= 1  # only the exponent / finite vectors


def test_mixing_and_host_backends_are_refused():
    A, B = _gemm_case()
    with pytest.raises(TypeError, match="move one explicitly"):
        rd.dgemm(dev(A, 4), da.from_array(B, chunks=4))
    with pytest.raises(ValueError, match="CuPy chunks run on backend='cuda'"):
        rd.dgemm(dev(A, 4), dev(B, 4), backend="cpu")
    # NumPy chunks with backend='cuda': NumPy in, NumPy out, the residue work on the GPU
    got = rd.dgemm(da.from_array(A, chunks=4), da.from_array(B, chunks=4), backend="cuda")
    assert type(got._meta) is np.ndarray
    assert np.array_equal(got.compute(), rt.dgemm(A, B, backend="cpu"))


def test_one_worker_per_gpu_cluster():
    if os.environ.get("RNSTENSOR_CUPY_STANDIN") == "1":
        pytest.skip("the CuPy stand-in lives in this process only, not in the cluster's workers")
    distributed = pytest.importorskip("distributed")
    try:
        from dask_cuda import LocalCUDACluster

        cluster = LocalCUDACluster(n_workers=1, threads_per_worker=1, dashboard_address=None)
    except ImportError:
        cluster = distributed.LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
        )
    with cluster, distributed.Client(cluster) as client:
        A, B = _gemm_case(m=30, k=200, n=20, seed=11)
        same_on_device(rd.dgemm(dev(A, (16, 64)), dev(B, (64, 8))), rt.dgemm(A, B, backend="cpu"), client)
        X, ops = _chain_case(nelem=12)
        plan = rt.plan_chain(ops, [0, 1, 2], ndim=3)
        same_on_device(rd.apply(plan, dev(X, (5, 4, 4, 4))), plan.run(X, backend="cpu"), client)
