"""Each arch's launch limits (shared memory, registers, threads) and a table of the fused launches against them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["ArchLimits", "ARCH_LIMITS", "DEFAULT_SHARED", "arch_limits", "LaunchUse", "launch_use", "fused_launch_table",
           "format_table"]

#: dynamic shared memory a kernel may take without opting in (cudaFuncAttributeMaxDynamicSharedMemorySize)
DEFAULT_SHARED = 48 * 1024


@dataclass(frozen=True)
class ArchLimits:
    """What one SM of an arch offers a launch (CUDA C Programming Guide, compute capability tables)."""

    shared_per_block: int  # the most dynamic shared memory one block may opt in to (bytes)
    shared_per_sm: int  # shared memory of one SM (bytes)
    reserved_per_block: int  # shared memory the system keeps per resident block (bytes)
    registers_per_sm: int
    registers_per_thread: int
    threads_per_sm: int
    blocks_per_sm: int


#: compute capability 8.0 (A100), 8.6 / 8.9 (consumer Ampere, Ada), 9.0 (H100, H200)
ARCH_LIMITS: dict[str, ArchLimits] = {
    "sm_80": ArchLimits(163 * 1024, 164 * 1024, 1024, 65536, 255, 2048, 32),
    "sm_86": ArchLimits(99 * 1024, 100 * 1024, 1024, 65536, 255, 1536, 16),
    "sm_89": ArchLimits(99 * 1024, 100 * 1024, 1024, 65536, 255, 1536, 24),
    "sm_90": ArchLimits(227 * 1024, 228 * 1024, 1024, 65536, 255, 2048, 32),
}


def arch_limits(arch: str) -> ArchLimits:
    """The limits of ``arch`` (``'sm_90a'`` is ``'sm_90'``'s); ``ValueError`` for an arch not listed."""
    key = arch[:-1] if arch.endswith("a") else arch
    if key not in ARCH_LIMITS:
        raise ValueError(f"arch must be one of {sorted(ARCH_LIMITS)} (or sm_90a); got {arch!r}")
    return ARCH_LIMITS[key]


@dataclass(frozen=True)
class LaunchUse:
    """One launch's resources against an arch's limits."""

    name: str
    arch: str
    threads: int
    shared: int  # dynamic shared memory (bytes)
    registers: Optional[int]  # per thread, from ptxas (cuobjdump); None where unknown
    needs_opt_in: bool  # above DEFAULT_SHARED: the launch must raise the kernel's attribute first
    blocks_per_sm: int  # resident blocks by shared memory, registers and threads (0: the launch fails)
    problem: Optional[str]  # why the launch cannot run on this arch, or None

    @property
    def fits(self) -> bool:
        return self.problem is None


def launch_use(name: str, arch: str, threads: int, shared: int, registers: Optional[int] = None) -> LaunchUse:
    """How a launch of ``threads`` threads with ``shared`` bytes of dynamic shared memory sits on ``arch``."""
    lim = arch_limits(arch)
    problem = None
    if shared > lim.shared_per_block:
        problem = f"{shared} B of shared memory per block, more than {arch}'s {lim.shared_per_block} B"
    elif threads > 1024 or threads % 32:
        problem = f"{threads} threads per block (at most 1024, whole warps)"
    elif registers is not None and registers > lim.registers_per_thread:
        problem = f"{registers} registers per thread, more than {lim.registers_per_thread}"
    by_shared = lim.shared_per_sm // (shared + lim.reserved_per_block)
    by_regs = lim.registers_per_sm // (registers * threads) if registers else lim.blocks_per_sm
    blocks = 0 if problem else min(by_shared, by_regs, lim.threads_per_sm // threads, lim.blocks_per_sm)
    if problem is None and blocks == 0:
        problem = f"no block fits one SM ({shared} B shared, {registers} registers x {threads} threads)"
    return LaunchUse(name, arch, threads, shared, registers, shared > DEFAULT_SHARED, blocks, problem)


def fused_launch_table(programs: Sequence, arch: str, registers: Optional[dict] = None,
                       names: Optional[Sequence[str]] = None) -> list[LaunchUse]:
    """The fused chain launches of ``programs`` (:class:`~rnstensor.kernels.fused.ChainProgram`) on ``arch``.

    ``registers``: ``{kernel name: registers}`` of the generic chain module's
    cubin for ``arch`` (:func:`rnstensor.kernels.build.resource_usage`); the
    larger of the fp64 and exact kernels counts. ``names`` label the rows
    (default: the programs' shapes).
    """
    regs = max((registers or {}).values(), default=None)
    out = []
    for i, prog in enumerate(programs):
        label = names[i] if names is not None else f"{tuple(prog.in_shape)} -> {tuple(prog.out_shape)}"
        out.append(launch_use(label, arch, prog.threads, prog.shared_bytes, regs))
    return out


def format_table(rows: Sequence[LaunchUse]) -> str:
    """The rows as a text table (``python -m rnstensor.kernels limits``, device_check.sh)."""
    lines = [f"{'launch':<34} {'arch':<7} {'threads':>7} {'shared B':>9} {'opt-in':>6} {'regs':>5} {'blocks/SM':>9}  fits"]
    for r in rows:
        regs = "-" if r.registers is None else str(r.registers)
        lines.append(f"{r.name:<34} {r.arch:<7} {r.threads:>7} {r.shared:>9} {'yes' if r.needs_opt_in else 'no':>6} "
                     f"{regs:>5} {r.blocks_per_sm:>9}  {'yes' if r.fits else 'NO: ' + r.problem}")
    return "\n".join(lines)
