"""Launch limits per arch (rnstensor/kernels/limits.py): the fused launches' shared memory and registers fit every arch.

The table is what device_check.sh prints for the device's arch; here every
fused program the GPU tests and the benchmark run is held against sm_80,
sm_86, sm_89 and sm_90 with the generic chain kernel's registers from ptxas
(cuobjdump of this machine's NVRTC build).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import rnstensor as rt
from rnstensor.kernels import build, fused, limits

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a")


def test_launch_use_by_hand():
    # sm_90: 228 KiB an SM, 1 KiB reserved a block: two blocks of 100 KiB; 64 registers x 256 threads: four by
    # registers; 2048 threads: eight by threads
    u = limits.launch_use("k", "sm_90a", 256, 100 * 1024, 64)
    assert u.fits and u.needs_opt_in and u.blocks_per_sm == 2
    assert limits.launch_use("k", "sm_90", 256, 48 * 1024, 128).blocks_per_sm == 2  # by registers
    small = limits.launch_use("k", "sm_80", 128, 0, 32)
    assert not small.needs_opt_in and small.blocks_per_sm == 16  # by threads: 2048 / 128
    over = limits.launch_use("k", "sm_89", 256, 100 * 1024, 64)
    assert not over.fits and "101376" in over.problem  # sm_89 lets a block opt in to 99 KiB only
    assert not limits.launch_use("k", "sm_90", 256, 1024, 256).fits  # 255 registers a thread at most
    assert not limits.launch_use("k", "sm_90", 1056, 0).fits
    with pytest.raises(ValueError, match="arch must be one of"):
        limits.arch_limits("sm_70")


def _programs():
    """Every fused program the GPU tests and bench_gpu.py run, with a label."""
    tests = Path(__file__).resolve().parent
    sys.path.insert(0, str(tests / "gpu"))
    sys.path.insert(0, str(tests.parent / "benchmarks"))
    import bench_gpu
    from test_kernels_chain import CASES, _ops, plan_any

    out = []
    for shape, opshapes, axes, method, _batch in CASES:
        rng = np.random.default_rng(sum(shape) + len(axes))
        plan = plan_any(_ops(rng, opshapes, "wide"), axes, ndim=len(shape), method=method, moduli=15)
        out.append((f"chain {shape} {method}", fused.compile_request(plan.fusion_request(shape))))
    for n in (4, 8, 16):  # the cubes, on wide bases too (the classical default escalates to them)
        rng = np.random.default_rng(n)
        ops = [rng.uniform(-1, 1, (n, n)) for _ in range(3)]
        for s in (15, 24, 40):
            plan = rt.plan_chain(ops, (0, 1, 2), moduli=s, input_bits="max")
            prog, why = fused.program_or_reason(lambda: fused.compile_request(plan.fusion_request((n, n, n))), "fp64")
            if prog is not None:  # else the plan runs unfused (one tensor needs more than 227 KiB)
                out.append((f"cube n={n} s={s}", prog))
    out += [(f"bench {i}", p) for i, p in enumerate(bench_gpu.fused_programs())]
    return out


@pytest.fixture(scope="module")
def chain_registers():
    """``{arch: registers}`` of the generic chain kernels (the larger of fp64 and exact); {} without cuobjdump."""
    out = {}
    for arch in ARCHS:
        try:
            usage = build.resource_usage(build.compile_module("chain", arch).path)
        except build.KernelBuildError:
            return {}
        out[arch] = {k: v.registers for k, v in usage.items() if k.startswith("rns_chain_fused")}
    return out


def test_fused_launches_fit_every_arch(chain_registers):
    programs = _programs()
    assert any(p.shared_bytes > limits.DEFAULT_SHARED for _, p in programs)  # the opt-in is exercised
    for arch in ARCHS:
        rows = limits.fused_launch_table([p for _, p in programs], arch, chain_registers.get(arch),
                                         [name for name, _ in programs])
        table = limits.format_table(rows)
        if arch == "sm_90a":  # the H100 / H200 these programs are sized for: every one launches
            assert all(r.fits for r in rows), table
        # elsewhere only a single tensor too large for the arch's shared memory may not (CudaBackend then runs the
        # plan step by step: test_cuda_backend_declines_a_program_its_arch_cannot_launch)
        cap = limits.arch_limits(arch).shared_per_block
        assert all(r.fits or (r.shared > cap and p.nb == 1) for r, (_, p) in zip(rows, programs)), table
        assert all(r.blocks_per_sm >= 1 for r in rows if r.fits), table
        assert all(r.needs_opt_in == (r.shared > 48 * 1024) for r in rows)
        assert all(r.shared <= fused.SHARED_BUDGET for r, (_, p) in zip(rows, programs) if p.nb > 1), table
        if chain_registers:
            assert all(r.registers is not None and r.registers <= 255 for r in rows)


def test_budget_fits_the_smallest_arch():
    # a block of several tensors may take SHARED_BUDGET: every arch must let it opt in to that much
    assert all(fused.SHARED_BUDGET <= lim.shared_per_block for lim in limits.ARCH_LIMITS.values())


def test_cuda_backend_declines_a_program_its_arch_cannot_launch():
    from rnstensor.backends.cuda import CudaBackend

    class Big:
        threads, shared_bytes = 256, 150 * 1024

    be = object.__new__(CudaBackend)  # the arch check alone: no device needed
    for arch, fits in (("sm_90a", True), ("sm_80", True), ("sm_89", False), ("sm_86", False)):
        be.arch = arch
        prog, why = be._on_this_device((Big(), None))
        assert (prog is not None) == fits, (arch, why)
        if not fits:
            assert arch in why and str(150 * 1024) in why
    be.arch = "sm_120"  # no table: the launch itself would say
    assert be._on_this_device((Big(), None))[0] is not None
