"""Whether this test process builds the SIMT host harnesses with ASan and UBSan (tests/test_kernels_sanitized.py sets it)."""

from __future__ import annotations

import os

#: ``RNSTENSOR_SANITIZE=1``: the SIMT harness fixtures build with :data:`rnstensor.kernels.build.SANITIZE_FLAGS`
#: (the process must preload the runtimes: :func:`rnstensor.kernels.build.sanitizer_preload`)
SANITIZE = os.environ.get("RNSTENSOR_SANITIZE") == "1"
