"""rnstensor.dask with CuPy chunks (strict CuPy stand-in): results with CuPy chunks, the in-memory bits.

GEMM blocks and the blocks of plans and expressions stay on the device from
encode to decode: after a warm-up compute, nothing data-sized is copied.
"""

from __future__ import annotations

import numpy as np
import pytest

import rnstensor as rt
from device import same_bits

da = pytest.importorskip("dask.array")
rd = pytest.importorskip("rnstensor.dask")
dask = pytest.importorskip("dask")


def _on_dev(device, x, chunks):
    return da.from_array(x, chunks=chunks).map_blocks(device.cp.asarray, dtype=x.dtype)


def _computed(device, D, ref, resident=True):
    assert type(D._meta) is device.cp.ndarray  # a result of CuPy chunks
    with dask.config.set(scheduler="synchronous"):
        if resident:
            # from_array's blocks are copied to the device each compute (counted against the input): the
            # persisted device blocks are not
            got = device.resident(lambda: D.compute())
        else:
            got = D.compute()
    same_bits(got, ref)


def _persisted(device, x, chunks):
    with dask.config.set(scheduler="synchronous"):
        return _on_dev(device, x, chunks).persist()


def test_gemm(device):
    r = np.random.default_rng(9)
    A = r.uniform(-1, 1, (20, 300)) * 2.0 ** r.integers(-20, 20, (20, 300))
    B = r.uniform(-1, 1, (300, 12))
    Ad, Bd = _persisted(device, A, (8, 64)), _persisted(device, B, (100, 5))
    _computed(device, rd.dgemm(Ad, Bd, moduli="auto"), rt.dgemm(A, B, moduli="auto"))
    Z = r.uniform(-1, 1, (9, 50)) + 1j * r.uniform(-1, 1, (9, 50))
    W = r.uniform(-1, 1, (50, 7)) - 1j * r.uniform(-1, 1, (50, 7))
    Zd, Wd = _persisted(device, Z, (4, 16)), _persisted(device, W, (20, 3))
    _computed(device, rd.zgemm(Zd, Wd, alpha=0.5 + 2j), rt.zgemm(Z, W, alpha=0.5 + 2j))
    S = np.stack([A, A[::-1]])
    _computed(device, rd.matmul(_persisted(device, S, (1, 8, 300)), _persisted(device, B, (300, 5))), rt.matmul(S, B))
    # NumPy's float64 steps (inf / NaN rows, a complex beta: on the host) and an in-memory c
    An = Z.copy()
    An[2, 3] = np.inf
    C = Z[:, :7] * 0.5
    got = rd.zgemm(_persisted(device, An, (4, 16)), Wd, C, beta=0.25 - 1.5j)
    with dask.config.set(scheduler="synchronous"):
        out = got.compute()
    assert isinstance(out, device.cp.ndarray)
    assert np.array_equal(out.get(), rt.zgemm(An, W, C, beta=0.25 - 1.5j), equal_nan=True)


def test_auto_split_tiles(device, monkeypatch):
    # moduli='auto' (and a target) on rows 49 moduli cannot hold: each tile by the in-memory dgemm / zgemm on its
    # device chunks (the limbs' residue GEMMs on the device), alpha, beta and c as there: the host's bits
    from rnstensor.run import exact_path

    monkeypatch.setattr(exact_path, "RESIDUE_GEMM_TERMS", 0)
    cuda = rt.backends.get_backend("cuda")
    gemms = []
    real = cuda.matmul
    monkeypatch.setattr(cuda, "matmul", lambda x, y, m: gemms.append(type(x)) or real(x, y, m))
    r = np.random.default_rng(8)
    A = r.standard_normal((6, 30)) * np.exp2(r.integers(-400, 400, (6, 30)))
    B = r.standard_normal((30, 5)) * np.exp2(r.integers(-400, 400, (30, 5)))
    D = rd.dgemm(_persisted(device, A, (3, 10)), _persisted(device, B, (10, 2)), moduli="auto")
    _computed(device, D, rt.dgemm(A, B, moduli="auto"), resident=False)
    assert gemms and set(gemms) == {device.cp.ndarray}
    Z, W, C = A + 1j * A[::-1], B - 1j, r.standard_normal((6, 5)) + 0.5j
    Z[0, :2], W[:2, 0] = (1e300, 1e-300), (1e-300, 1e300)  # (two terms of one size: a target needs both exactly)
    for kw in ({"moduli": "auto"}, {"rtol": 1e-12}):
        D = rd.zgemm(_persisted(device, Z, (3, 10)), _persisted(device, W, (10, 2)), _persisted(device, C, (2, 5)),
                     alpha=0.5 - 1j, beta=2j, **kw)
        _computed(device, D, rt.zgemm(Z, W, C, alpha=0.5 - 1j, beta=2j, **kw), resident=False)


def test_apply(device):
    r = np.random.default_rng(0)
    X = r.uniform(-1, 1, (23, 4, 4, 4))
    ops = [r.uniform(-1, 1, (4, 4)) for _ in range(3)]
    plan = rt.plan_chain(ops, [0, 1, 2], ndim=3)
    expr = rt.contract_expression("eijk,ai,bj,ck->eabc", X.shape, *ops, constants=[1, 2, 3])
    D = _persisted(device, X, (5, 4, 4, 4))
    _computed(device, rd.apply(plan, D), plan(X))
    _computed(device, rd.apply(expr, D), expr(X))
    # a plain function takes NumPy blocks: an explicit round trip per block
    _computed(device, rd.apply(lambda b: plan(b, decode="exact"), D), plan(X, decode="exact"), resident=False)
    from rnstensor.fem import MassOperator, TensorBasis, box_mesh

    basis = TensorBasis(3, dim=3)
    mesh = box_mesh(basis, shape=(3, 2, 2), curved=0.1)
    u = mesh.gather(np.sin(mesh.coords[:, 0]) + mesh.coords[:, 2])
    op = MassOperator(basis, mesh.qdata)
    _computed(device, rd.apply(op, _persisted(device, u, (5, 3, 3, 3))), op.apply(u))
    assert op.backend is None  # the per-block copies ran on 'cuda', the operator itself is unchanged
