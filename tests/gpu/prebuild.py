"""What the GPU tests load, compiled ahead: the CPU backend's numba kernels and every kernel the test modules list.

Used by tests/gpu/conftest.py (a session fixture, for the selected modules)
and by benchmarks/device_check.sh, whose warm-up step runs
``python tests/gpu/prebuild.py [--bench] [--slow]`` once before anything is timed:
the disk caches (numba's, the kernel cache) then hold every build, so the
test processes and the benchmark compile nothing. A test module lists its
fused programs in a ``spec_programs()`` function.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

__all__ = ["warm_cpu_backend", "gpu_test_modules", "module_programs", "build_side_by_side", "limits_table", "main"]


def warm_cpu_backend() -> None:
    """JIT-compile the CPU backend's numba kernels that the references use (tens of seconds when cold)."""
    import numpy as np

    import rnstensor as rt
    from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

    rng = np.random.default_rng(0)
    plan = rt.plan_chain([rng.uniform(-1, 1, (4, 4)) for _ in range(3)], [0, 1, 2])
    for decode in ("fp64", "exact"):
        plan.run(rng.uniform(-1, 1, (2, 4, 4, 4)), decode, backend="cpu")
    a, b = rng.standard_normal((5, 7)), rng.standard_normal((7, 3))
    rt.dgemm(a, b, backend="cpu")
    rt.zgemm(a + 1j * a, b - 1j * b, backend="cpu")
    basis = TensorBasis(2)
    mesh = box_mesh(basis, shape=(1, 1, 1), curved=0.1)
    u = rng.standard_normal((mesh.nelem, 2, 2, 2))
    MassOperator(basis, mesh.qdata, backend="cpu").apply(u)
    PoissonOperator(basis, mesh.G, backend="cpu").apply(u)


def gpu_test_modules() -> list:
    """Every tests/gpu/test_*.py module, imported as pytest would (tests/ and tests/gpu/ on ``sys.path``)."""
    for path in (HERE.parent, HERE):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    out = []
    for path in sorted(HERE.glob("test_*.py")):
        mod = sys.modules.get(path.stem)
        if mod is None:
            spec = importlib.util.spec_from_file_location(path.stem, path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = mod
            spec.loader.exec_module(mod)
        out.append(mod)
    return out


def module_programs(modules, slow=()) -> list:
    """The fused programs of ``modules`` (their ``spec_programs()``), and the slow tests' of those in ``slow``
    (``slow_spec_programs()``, where a module has them), in order."""
    out = [p for m in modules if hasattr(m, "spec_programs") for p in m.spec_programs()]
    return out + [p for m in modules if m in slow and hasattr(m, "slow_spec_programs") for p in m.slow_spec_programs()]


def build_side_by_side(programs, warm_cpu: bool = True) -> tuple[dict, float, float]:
    """Build this device's modules and ``programs`` (one process per core) while this process warms the CPU backend.

    Returns ``(result, seconds, cpu_seconds)``: ``result`` holds ``'builds'``
    (their number) or ``'error'`` (the build's exception, as text).
    """
    from rnstensor.backends import get_backend

    backend = get_backend("cuda")
    result: dict = {}

    def build() -> None:
        try:
            result["builds"] = backend.prebuild(programs)
        except Exception as exc:  # noqa: BLE001 - reported by the caller; each test that needs the build fails on its own
            result["error"] = f"{type(exc).__name__}: {exc}"

    t0 = time.perf_counter()
    worker = threading.Thread(target=build)
    worker.start()
    if warm_cpu:
        warm_cpu_backend()
    t_cpu = time.perf_counter() - t0
    worker.join()
    return result, time.perf_counter() - t0, t_cpu


def limits_table(programs, arch: str) -> str:
    """The fused launches of ``programs`` against ``arch``'s limits (rnstensor.kernels.limits), with the generic chain
    kernel's registers from this machine's NVRTC build (none where cuobjdump is missing)."""
    from rnstensor.kernels import build, limits

    try:
        usage = build.resource_usage(build.compile_module("chain", arch).path)
        regs = {k: v.registers for k, v in usage.items() if k.startswith("rns_chain_fused")}
    except build.KernelBuildError:
        regs = None
    names = [f"{tuple(p.in_shape)} -> {tuple(p.out_shape)} nb={p.nb}" for p in programs]
    return limits.format_table(limits.fused_launch_table(programs, arch, regs, names))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", action="store_true", help="also the kernels benchmarks/bench_gpu.py loads")
    ap.add_argument("--slow", action="store_true", help="also the slow tests' (the large batches)")
    ap.add_argument("--limits", metavar="ARCH", help="print the programs' launches against ARCH's limits instead")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    modules = gpu_test_modules()
    programs = module_programs(modules, slow=modules if args.slow else ())
    if args.bench:
        sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))
        import bench_gpu

        programs += bench_gpu.fused_programs()
    t_programs = time.perf_counter() - t0
    if args.limits:
        table = limits_table(programs, args.limits)
        print(table)
        return 0 if "NO:" not in table else 1
    result, took, t_cpu = build_side_by_side(programs)
    what = f"{result['builds']} kernel builds" if "builds" in result else f"kernel prebuild FAILED ({result['error']})"
    print(f"[prebuild] {len(programs)} fused programs planned in {t_programs:.1f} s; {what} in {took:.1f} s "
          f"(CPU backend warm in {t_cpu:.1f} s)", flush=True)
    return 0 if "builds" in result else 1


if __name__ == "__main__":
    sys.exit(main())
