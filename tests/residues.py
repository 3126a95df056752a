"""Shared test inputs for the kernel tests: random centered residue planes and the NVRTC / cuobjdump markers."""

from __future__ import annotations

import numpy as np
import pytest

from rnstensor.kernels import build

try:
    build.nvrtc_version()
    HAVE_NVRTC = True
except build.KernelBuildError:  # pragma: no cover - the test extras install it
    HAVE_NVRTC = False

needs_nvrtc = pytest.mark.skipif(not HAVE_NVRTC, reason="NVRTC (cuda-python + nvidia-cuda-nvrtc, the 'test' extras) is not installed")


def _have_cuobjdump() -> bool:
    try:
        build.find_tool("cuobjdump")
        build.find_tool("nvdisasm")
        return True
    except build.KernelBuildError:
        return False


needs_cuobjdump = pytest.mark.skipif(not _have_cuobjdump(), reason="cuobjdump/nvdisasm (the 'test' extras) not found")


def random_planes(rng, moduli, shape, edge=None, ends=True):
    """int8 planes ``(len(moduli), *shape)`` of centered residues.

    ``edge``: ``'min'`` / ``'max'`` every entry at that end of its range,
    ``'mixed'`` both ends at random (the largest sums of either sign); else
    uniform, with the first two entries at the two ends when ``ends``.
    """
    rows = []
    for p in moduli:
        lo, hi = -(p // 2), (p + 1) // 2 - 1
        if edge == "min":
            rows.append(np.full(shape, lo))
        elif edge == "max":
            rows.append(np.full(shape, hi))
        elif edge == "mixed":
            rows.append(rng.choice([lo, hi], shape))
        else:
            r = rng.integers(lo, hi + 1, shape)
            if ends and r.size >= 2:
                r.reshape(-1)[:2] = (lo, hi)
            rows.append(r)
    return np.stack(rows).astype(np.int8)
