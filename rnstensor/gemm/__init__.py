"""DGEMM / ZGEMM / matmul emulation: the two-operand residue program (Ozaki scheme II), on NumPy or CuPy arrays.

``op(a)`` gets one power-of-two exponent per row and ``op(b)`` one per
column (the exponent scan, :func:`group_stats` and :func:`gemm_scale`,
shared with :mod:`rnstensor.dask`; the default width keeps the classical
componentwise bound, :func:`classical_moduli`, and rows too wide for it are
split exactly, :func:`row_slices`), both are encoded at the width ``t``, one
exact residue product (the 3M form for complex data) gives the integer
product, and one exact decode rounds ``alpha`` times it once
(:func:`gemm_program`). NumPy operands run on the CPU backend, CuPy
operands on the CUDA backend from encode to decode, with the product in the
layout its tensor-core engines read (``op(b)`` K-contiguous).
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np  # noqa: F401 - with Basis, the names the gathered examples use (see __test__)

from ..basis import Basis  # noqa: F401
from ..encode import entry_stats, exact_bits_needed
from ..magnitude import magnitude_ratio
from . import api, checks, scan, split, tiles, width
from .api import Moduli, dgemm, gemm_moduli, matmul, zgemm
from .checks import blas_operands, default_workspace_bytes
from .scan import _group_stats_array, frexp_exponent, gemm_scale, group_lsb, group_stats  # (the array path: a test compares the scans)
from .split import row_slices, split_width
from .tiles import gemm_program
from .width import SplitNeeded, classical_fits, classical_moduli, encoding_budget, gemm_targets, gemm_width, moduli_for_bits

# private names other modules use from here: rnstensor.dask (the argument checks, the encode of a block) and the tests
from .checks import _check_moduli, _check_scalar, _check_target, _check_trans
from .split import _resolve_moduli
from .tiles import _encoded, _plan_tiles, _rows, _tiles
from .width import _groups, _inexact_rho, _measured_fits

__all__ = [
    "dgemm",
    "zgemm",
    "matmul",
    "moduli_for_bits",
    "gemm_moduli",
    "gemm_width",
    "exact_bits_needed",
    "default_workspace_bytes",
    "group_stats",
    "gemm_scale",
    "gemm_program",
    "classical_fits",
    "classical_moduli",
    "magnitude_ratio",
    "row_slices",
    "split_width",
]

# ----- timing hook (benchmarks) ---------------------------------------------------------------
# set on this package (rnstensor.gemm.PHASES = {}), read by rnstensor.gemm.tiles._phase at every phase

#: When a dict, phase times (seconds) accumulate into it: 'other' (checks, the exponent scan, the moduli choice),
#: 'encode', 'products' (ZGEMM: the 3M products with their sums and differences), 'decode'. Wall times.
PHASES: Optional[dict] = None
#: With :data:`PHASES`: called at every phase boundary (a benchmark's device synchronization, so that device phases
#: are timed as they run rather than as they are launched).
PHASE_SYNC: Optional[Callable[[], None]] = None

# tests/test_doctests.py runs doctest.testmod on this package, which collects only what this file defines: the
# submodules' examples are gathered here and run in this namespace (as they ran in the single module)
__test__ = {
    f"{mod.__name__.rpartition('.')[2]}.{name}": obj
    for mod in (width, checks, scan, tiles, split, api)
    for name, obj in vars(mod).items()
    if getattr(obj, "__module__", None) == mod.__name__ and ">>>" in (getattr(obj, "__doc__", None) or "")
}
