"""rnstensor.dask: results identical bit for bit to the in-memory ones for any chunking, on a local cluster too."""

from __future__ import annotations

import numpy as np
import pytest

import rnstensor as rt

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
