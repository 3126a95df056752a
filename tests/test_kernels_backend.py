"""CudaBackend's host side without a GPU: the CuPy stand-in (tests/cupy_standin.py) emulates each launch.

What this proves: the backend builds its tables, exponent runs, argument
lists and launch shapes so that the kernels compute CpuBackend's bits. What
it does not: the device code as the GPU runs it (tests/gpu/) or CuPy's own API.
"""

from __future__ import annotations

import re

import cupy_standin
import numpy as np
import pytest
from cupy_standin import DevArray, dev

from rnstensor.backends.cpu import CpuBackend
from rnstensor.basis import Basis, int8_pool
from rnstensor.kernels import build

CPU = CpuBackend()
POOL = int8_pool()


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    # the session's kernel cache, shared with tests/test_kernels.py
    shared = tmp_path_factory.getbasetemp() / "rnstensor-kernel-cache"
    shared.mkdir(exist_ok=True)
    try:
        _, launches, restore = cupy_standin.install(tmp_path_factory.mktemp("standin"), shared)
    except build.KernelBuildError as exc:  # pragma: no cover
        pytest.skip(f"NVRTC (the 'test' extras) or a host C++ compiler is missing: {exc}")
    try:
        from rnstensor.backends.cuda import CudaBackend

        yield CudaBackend(), launches
    finally:
        restore()


def planes(rng, moduli, shape):
    return np.stack([rng.integers(-(p // 2), (p + 1) // 2, shape) for p in moduli]).astype(np.int8)


def same(a, b):
    a = np.asarray(a)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


def test_device_and_arch(fake):
    be, _ = fake
    assert be.arch == "sm_90a" and be.device_name == "Fake H200"
    assert set(be.built_kernels()) == set(build.MODULES)


def test_encode(fake):
    be, launches = fake
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, 7)) * np.exp2(rng.integers(-50, 50, (20, 7)))
    x.reshape(-1)[:6] = [0.0, -0.0, 5e-324, 2.5, -3.5, 1e300]
    moduli = POOL[:15]
    for e in (np.int64(30), rng.integers(-80, 1200, (20, 1)), rng.integers(-80, 80, (20, 7))):
        same(be.encode(dev(x), e, moduli, 53), CPU.encode(x, e, moduli, 53))
        same(be.encode(x, e, moduli, 53), CPU.encode(x, e, moduli, 53))  # numpy in, numpy out
    same(be.encode(dev(np.array(1.5)), np.int64(3), moduli, 53), CPU.encode(np.array(1.5), np.int64(3), moduli, 53))
    assert "rns_encode" in launches


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("n_in, n_out", [(1, 1), (8, 8), (9, 17), (40, 33), (64, 70)])
def test_product(fake, axis, n_in, n_out):
    be, launches = fake
    rng = np.random.default_rng(axis * 1000 + n_in * 10 + n_out)
    moduli = POOL[:4]
    shape = [3, 5, 4]
    shape[axis] = n_in
    X = planes(rng, moduli, tuple(shape))
    A = planes(rng, moduli, (n_out, n_in))
    got = be.product(dev(A), dev(X), moduli, axis)
    assert isinstance(got, DevArray)
    same(got, CPU.product(A, X, moduli, axis))
    bn = next((b for b in (8, 16, 32, 64) if b >= n_out), 64)
    assert launches[-1] == f"rns_product_n{bn}"


@pytest.mark.parametrize("n_in, n_out, kernel", [(16, 5, "rns_gemm_wgmma_n64"), (48, 64, "rns_gemm_wgmma_n64"),
                                                 (80, 65, "rns_gemm_wgmma_n128"), (272, 130, "rns_gemm_wgmma_n128")])
def test_product_wgmma(fake, n_in, n_out, kernel):
    # product_engine='wgmma' on the (fake) sm_90a device: the last axis with n_in % 16 == 0 runs the wgmma
    # kernel (product_wgmma.cu through its SIMT build), every other product the mma.sync kernel
    from rnstensor.backends.cuda import CudaBackend

    _, launches = fake
    be = CudaBackend(product_engine="wgmma")
    rng = np.random.default_rng(n_in + n_out)
    moduli = POOL[:3]
    X = planes(rng, moduli, (3, 50, n_in))
    A = planes(rng, moduli, (n_out, n_in))
    same(be.product(dev(A), dev(X), moduli, 2), CPU.product(A, X, moduli, 2))
    assert launches[-1] == kernel
    Xm = X.transpose(0, 1, 3, 2).copy()  # (L, 3, n_in, 50)
    same(be.product(dev(A), dev(Xm), moduli, 1), CPU.product(A, Xm, moduli, 1))
    assert launches[-1].startswith("rns_product_n")  # a middle axis: mma.sync
    Xo = planes(rng, moduli, (3, 50, n_in + 4))
    Ao = planes(rng, moduli, (n_out, n_in + 4))
    same(be.product(dev(Ao), dev(Xo), moduli, 2), CPU.product(Ao, Xo, moduli, 2))
    assert launches[-1].startswith("rns_product_n")  # n_in % 16 != 0: mma.sync
    # a view 1 byte into a buffer: not 16-byte aligned, so mma.sync
    buf = dev(np.zeros(X.size + 1, np.int8))
    Xv = buf[1:].reshape(X.shape)
    Xv[...] = X
    same(be.product(dev(A), Xv, moduli, 2), CPU.product(A, X, moduli, 2))
    assert launches[-1].startswith("rns_product_n")


def test_product_auto_dispatch(fake, monkeypatch):
    from rnstensor.backends import cuda as cuda_mod

    default, launches = fake
    assert default.product_engine == "mma"  # until the engines are measured on a GPU
    be = cuda_mod.CudaBackend(product_engine="auto")
    rng = np.random.default_rng(4)
    moduli = POOL[:2]
    X = planes(rng, moduli, (300, 64))
    A = planes(rng, moduli, (64, 64))
    # the default thresholds keep this small product on mma.sync
    assert be.product_engine_for(300, 64, 1, 64, 2) == "mma"
    same(be.product(dev(A), dev(X), moduli, 1), CPU.product(A, X, moduli, 1))
    assert launches[-1] == "rns_product_n64"
    # lowered thresholds (an override) send it to wgmma
    low = cuda_mod.CudaBackend(product_engine="auto", product_thresholds={"wgmma_min_macs": 0, "wgmma_min_k": 16})
    assert low.product_engine_for(300, 64, 1, 64, 2) == "wgmma"
    same(low.product(dev(A), dev(X), moduli, 1), CPU.product(A, X, moduli, 1))
    assert launches[-1] == "rns_gemm_wgmma_n64"
    # the environment forces an engine
    monkeypatch.setenv("RNSTENSOR_PRODUCT_ENGINE", "mma")
    assert cuda_mod.CudaBackend().product_engine_for(10**6, 4096, 1, 4096, 15) == "mma"
    monkeypatch.setenv("RNSTENSOR_PRODUCT_ENGINE", "fast")
    with pytest.raises(ValueError, match=r"\$RNSTENSOR_PRODUCT_ENGINE must be one of"):
        cuda_mod.CudaBackend()
    with pytest.raises(ValueError, match="unknown keys"):
        cuda_mod.CudaBackend(product_engine="auto", product_thresholds={"wgmma_rows": 1})


@pytest.mark.parametrize("axis, n_in, n_out", [(0, 8, 8), (1, 9, 40), (2, 33, 5)])
def test_product_3m(fake, axis, n_in, n_out):
    be, launches = fake
    rng = np.random.default_rng(axis + n_in)
    moduli = POOL[:4]
    shape = [3, 5, 4]
    shape[axis] = n_in
    re, im = planes(rng, moduli, tuple(shape)), planes(rng, moduli, tuple(shape))
    ore, oim = planes(rng, moduli, (n_out, n_in)), planes(rng, moduli, (n_out, n_in))
    P0, P1 = CPU.product(ore, re, moduli, axis), CPU.product(oim, im, moduli, axis)
    P2 = CPU.product(CPU.add(ore, oim, moduli), CPU.add(re, im, moduli), moduli, axis)
    got_re, got_im = be.product_3m(dev(ore), dev(oim), dev(re), dev(im), moduli, axis)
    same(got_re, CPU.add(P0, P1, moduli, subtract=True))
    same(got_im, CPU.add(CPU.add(P2, P0, moduli, subtract=True), P1, moduli, subtract=True))
    assert launches[-1].startswith("rns_product3m_n")


def test_product_splits_long_column_ranges(fake, monkeypatch):
    # columns pre * post beyond int32 are split along pre: shrink the limit to see it
    from rnstensor.backends import cuda as cuda_mod

    be, launches = fake
    monkeypatch.setattr(cuda_mod, "_MAX_COLS", 10)
    rng = np.random.default_rng(7)
    moduli = POOL[:4]
    X = planes(rng, moduli, (7, 6, 3))
    A = planes(rng, moduli, (5, 6))
    n0 = len(launches)
    same(be.product(dev(A), dev(X), moduli, 1), CPU.product(A, X, moduli, 1))
    assert len(launches) - n0 == 3  # pre = 7 in chunks of 10 // 3 = 3 rows


@pytest.mark.parametrize("basis", [Basis.int8(15), Basis((7, 5, 3, 2)), Basis((255, 256, 7))], ids=str)
def test_elementwise(fake, basis):
    be, _ = fake
    rng = np.random.default_rng(len(basis))
    a = planes(rng, basis.moduli, (4, 3, 5))
    b = planes(rng, basis.moduli, (4, 3, 5))
    f = planes(rng, basis.moduli, (3, 5))
    same(be.hadamard(dev(a), dev(f), basis.moduli), CPU.hadamard(a, f, basis.moduli))
    same(be.hadamard(a, b, basis.moduli), CPU.hadamard(a, b, basis.moduli))
    same(be.add(dev(a), dev(b), basis.moduli, subtract=True), CPU.add(a, b, basis.moduli, subtract=True))
    with pytest.raises(ValueError, match="does not broadcast"):
        be.add(dev(f), dev(a), basis.moduli)


@pytest.mark.parametrize(
    "basis, drops, extend",
    [(Basis.int8(15), 3, True), (Basis.int8(15), (256, 241), False), (Basis.int8(49), 6, True),
     (Basis.int8(15), 0, True), (Basis.int8(15), 0, False), (Basis((7, 5, 3)), 3, False)],
)
def test_drop_extend(fake, basis, drops, extend):
    be, _ = fake
    rng = np.random.default_rng(11)
    active = tuple(rng.permutation(basis.moduli).tolist())
    X = planes(rng, active, (9, 13))
    ref, ref_act = CPU.drop_extend(X, active, basis, drops, extend)
    got, act = be.drop_extend(dev(X), active, basis, drops, extend)
    assert tuple(act) == tuple(ref_act)
    same(got, ref)


def test_drop_extend_from_many_threads(fake):
    # the drop tables are one constant bank per module: concurrent callers (Dask's threaded scheduler)
    # must each launch on their own tables
    from concurrent.futures import ThreadPoolExecutor

    be, _ = fake
    basis = Basis.int8(15)
    rng = np.random.default_rng(12)
    jobs = []
    for i in range(24):
        active = tuple(rng.permutation(basis.moduli).tolist())
        jobs.append((active, planes(rng, active, (3, 7)), 1 + i % 7))

    def run(job):
        active, X, drops = job
        return [be.drop_extend(dev(X), active, basis, drops, True)[0] for _ in range(6)]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, jobs))
    for (active, X, drops), got in zip(jobs, results):
        ref, _ = CPU.drop_extend(X, active, basis, drops, True)
        for g in got:
            same(g, ref)


@pytest.mark.parametrize("mode", ["fp64", "exact"])
def test_decode(fake, mode):
    be, launches = fake
    launches.clear()
    rng = np.random.default_rng(12)
    for active in (POOL[:15], POOL[:49], (7, 5, 3, 2)):
        X = planes(rng, active, (10, 6))
        ev = rng.integers(-1100, 1100, (10, 1))
        for factor in (1, 253 * 251, -(1 << 70), 0, 3**700):
            with np.errstate(over="ignore"):
                ref = CPU.decode(X, active, ev, factor, mode)
            same(be.decode(dev(X), active, ev, factor, mode), ref)
    # 3 tensors x 5 factors, less the zero factor (no launch) and 3**700 on 49 moduli (too wide: the CPU)
    assert launches.count("rns_decode_exact") == (11 if mode == "exact" else 0)


def test_chain_through_the_backend(fake, monkeypatch):
    # a whole RescaleBE chain: encode, products on every axis, drops with extension, decode
    import rnstensor as rt
    from rnstensor import backends

    be, launches = fake
    monkeypatch.setitem(backends._BACKENDS, "cuda", be)
    rng = np.random.default_rng(2)
    plan = rt.plan_chain([rng.uniform(-1, 1, (8, 8)) for _ in range(3)], [0, 1, 2])
    X = rng.uniform(-1, 1, (3, 8, 8, 8))
    for decode in ("fp64", "exact"):
        want = plan.run(X, decode, backend="cpu")
        same(plan.run(X, decode, backend="cuda", fused=False), want)  # one kernel per step
        same(plan.run(X, decode, backend="cuda"), want)  # the fused kernel (its plan-specialized build)
        assert launches[-1] == ("rns_chain_fused_exact" if decode == "exact" else "rns_chain_fused")
        monkeypatch.setattr(DevArray, "__module__", "cupy")  # how ChainPlan.run recognizes CuPy input
        got = plan.run(dev(X), decode)  # device input: the cuda backend, a device array out
        monkeypatch.setattr(DevArray, "__module__", __name__)
        assert isinstance(got, DevArray) and launches[-1].startswith("rns_chain_fused")
        same(got, want)
    monkeypatch.setattr(be, "specialize_chains", False)  # the generic kernel (a chain is specialized by default)
    same(plan.run(X, backend="cuda", fused=True), plan.run(X, backend="cpu"))
    X[1, 2, 3, 4] = np.nan
    monkeypatch.setattr(DevArray, "__module__", "cupy")
    with pytest.raises(ValueError, match="non-finite"):  # the fused kernel's flag (the default follows numpy instead)
        plan.run(dev(X), nonfinite="raise")
    monkeypatch.setattr(DevArray, "__module__", __name__)
    a, b = rng.standard_normal((9, 40)), rng.standard_normal((40, 7))
    same(rt.dgemm(a, b, backend="cuda"), rt.dgemm(a, b, backend="cpu"))


def test_prebuild_fills_the_cache(fake, monkeypatch):
    # every build a program needs, made side by side before the first launch; the runs then compile nothing
    import rnstensor as rt
    from rnstensor import backends
    from rnstensor.fem import PoissonOperator, TensorBasis, box_mesh
    from rnstensor.kernels import fused

    be, launches = fake
    monkeypatch.setitem(backends._BACKENDS, "cuda", be)
    assert be.specialize_chains == "auto"  # the default, which the other tests restore
    rng = np.random.default_rng(11)
    # fresh operators: a new build (an explicit basis: the plan runs as planned, the program prebuilt)
    plan = rt.plan_chain([rng.uniform(-1, 1, (4, 4)) for _ in range(3)], [0, 1, 2], moduli=15)
    basis = TensorBasis(3)
    poisson = fused.compile_request(PoissonOperator(basis, box_mesh(basis, shape=(2, 1, 1)).G).fusion_request())
    chain = fused.compile_request(plan.fusion_request((4, 4, 4)))
    assert fused.specialize_by_default(chain) and not fused.specialize_by_default(poisson)
    # the modules of the arch, the chain's own build; Poisson runs the generic chain module (counted once)
    assert be.prebuild([chain, poisson, chain], jobs=2) == len(build.modules_for("sm_90a")) + 1

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled after prebuild")

    monkeypatch.setattr(build, "_nvrtc_compile", no_compile)
    X = rng.uniform(-1, 1, (2, 4, 4, 4))
    same(plan.run(X, backend="cuda", fused=True), plan.run(X, backend="cpu"))
    assert launches[-1] == "rns_chain_fused"
    for m in build.modules_for("sm_90a"):
        build.compile_module(m, "sm_90a")
    with pytest.raises(TypeError, match="ChainProgram"):
        be.prebuild([plan])


def test_fused_fem_operators_through_the_backend(fake, monkeypatch):
    # the mass and Poisson operators as one kernel: their fields (w detJ, G residues) and exponents go to the device
    from rnstensor import backends
    from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

    be, launches = fake
    monkeypatch.setitem(backends._BACKENDS, "cuda", be)
    basis = TensorBasis(3)
    mesh = box_mesh(basis, shape=(3, 1, 1), curved=0.1)
    u = np.random.default_rng(5).standard_normal((mesh.nelem, 3, 3, 3))
    cpu = MassOperator(basis, mesh.qdata, backend="cpu")
    gpu = MassOperator(basis, mesh.qdata, backend="cuda")
    for decode in ("fp64", "exact"):
        same(gpu.apply(u, decode), cpu.apply(u, decode))
        assert launches[-1].startswith("rns_chain_fused")
        same(gpu.apply(u, decode, fused=False), cpu.apply(u, decode))
        assert not launches[-1].startswith("rns_chain_fused")
    poisson = PoissonOperator(basis, mesh.G, backend="cuda")
    same(poisson.apply(u, fused=True), PoissonOperator(basis, mesh.G, backend="cpu").apply(u))
    assert launches[-1] == "rns_chain_fused"
    same(cpu.apply(u, fused=True), cpu.apply(u, fused=False))  # the cpu backend's own fused interpreter
    with pytest.raises(ValueError, match="fused=True: the fused operator runs on the 'cpu' and 'cuda' backends"):
        MassOperator(basis, mesh.qdata, backend="numpy").apply(u, fused=True)


def test_launch_arguments_are_checked_against_the_kernel_signatures(fake):
    be, _ = fake
    # every kernel of every built module has a parsed signature, and every parsed one is in a cubin
    names = {f for path in be.built_kernels().values() for f in build.resource_usage(path)}
    sigs = cupy_standin._module_signatures()
    assert all(any(re.fullmatch(k, n) for k in sigs) for n in names), names
    assert all(any(re.fullmatch(k, n) for n in names) for k in sigs), sigs.keys()
    x, out = dev(np.zeros(4, np.int8)), dev(np.zeros(4, np.int8))
    cupy_standin.check_launch_args("rns_drop_extend", (x, np.int64(4), out))
    bad = [
        (x, np.int32(4), out),  # an int where the kernel has rns_i64: the GPU would read the pointer after it
        (x, 4, out),  # a Python int: CuPy passes it as int64 whatever the parameter
        (x, np.float64(4), out),  # the right width, the wrong kind
        (dev(np.zeros(4, np.int32)), np.int64(4), out),  # a pointer to words where the kernel reads bytes
        (x, np.int64(4)),  # an argument short
    ]
    for args in bad:
        with pytest.raises(AssertionError):
            cupy_standin.check_launch_args("rns_drop_extend", args)
    with pytest.raises(AssertionError, match="no kernel"):
        cupy_standin.check_launch_args("rns_no_such_kernel", ())
    sig = cupy_standin.kernel_signatures('extern "C" __global__ void __launch_bounds__(64, 2) k_n##BN(const rns_i8* '
                                         '__restrict__ a, \\\n unsigned long long n, double f) {}')
    assert list(sig) == [r"k_n\w+"] and [(str(d), p) for d, p in sig[r"k_n\w+"]] == [
        ("int8", True), ("uint64", False), ("float64", False)]
