"""``python -m rnstensor.kernels build --arch ARCH --out DIR``: write the cubins and report their resources."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .build import ARCHS, KernelBuildError, build_all, compile_modules, modules_for, resource_usage, sass

__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse ``argv`` and run the ``build`` command; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m rnstensor.kernels", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile every kernel module to a cubin with NVRTC (no GPU needed)")
    b.add_argument("--arch", action="append", help=f"target arch, repeatable (default: {' '.join(ARCHS)})")
    b.add_argument("--out", required=True, help="directory for <module>.<arch>.cubin")
    b.add_argument("--quiet", action="store_true", help="no resource table")
    b.add_argument("--jobs", type=int, default=None, help="builds side by side (default: every core)")
    args = ap.parse_args(argv)
    archs = args.arch or ARCHS
    try:
        compile_modules([(m, a) for a in archs for m in modules_for(a)], args.jobs)  # every arch at once
        for arch in archs:
            for built in build_all(arch, args.out):
                if args.quiet:
                    continue
                path = f"{args.out}/{built.name}.{arch}.cubin"
                try:
                    res = resource_usage(path)
                    code = sass(path)
                except KernelBuildError as exc:  # cuobjdump missing: the cubins are still written
                    print(f"{path}: written ({exc})")
                    continue
                print(path)
                for fn in sorted(res):
                    r = res[fn]
                    imma = code.get(fn, "").count("IMMA")
                    igmma = code.get(fn, "").count("IGMMA")  # Hopper wgmma (sm_90a modules)
                    print(f"  {fn:<22} regs {r.registers:>3}  stack {r.stack:>4}  local {r.local:>4}  "
                          f"shared {r.shared:>6}  IMMA {imma}" + (f"  IGMMA {igmma}" if igmma else ""))
    except (KernelBuildError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
