"""Kept for existing imports: ``rnstensor.backends.cpu_gemm`` is the module :mod:`rnstensor.backends.cpu.gemm` itself.

The old name is bound to the same module object (not a copy of its names), so that a setting made through it
(``cpu_gemm.ENGINE``, ``KEEP_BYTES``, ``PHASES``, a test's monkeypatch) reaches the code that reads it.
"""

import sys

from .cpu import gemm as _gemm

__all__ = list(_gemm.__all__)

sys.modules[__name__] = _gemm
