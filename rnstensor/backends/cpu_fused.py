"""Kept for existing imports: ``rnstensor.backends.cpu_fused`` is the module :mod:`rnstensor.backends.cpu.fused` itself.

The old name is bound to the same module object (not a copy of its names), so that an attribute set through it (a
test's ``monkeypatch.setattr(cpu_fused, "run_chain", ...)``) reaches the code that reads it.
"""

import sys

from .cpu import fused as _fused

__all__ = list(_fused.__all__)

sys.modules[__name__] = _fused
