"""Shared test set-up: hypothesis profile, the exact oracles on sys.path."""

from __future__ import annotations

import os
import sys

from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))
# every CPU kernel runs, compiled, from the first small call on (rnstensor.backends.cpu.warm routes a cold
# kernel's small calls to the NumPy reference; tests/test_backend_cpu_warm.py tests that routing itself)
os.environ.setdefault("RNSTENSOR_COLD_START", "0")

# no deadline (the numpy reference backend is slow by design, numba compiles on first use);
# every property test sets its own modest max_examples
settings.register_profile(
    "rnstensor",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("ci", parent=settings.get_profile("rnstensor"), derandomize=True)
settings.load_profile(os.environ.get("RNSTENSOR_HYPOTHESIS_PROFILE", "rnstensor"))

# the strict CuPy stand-in fixture ``device`` (tests/device.py) for the tests of public entry points on device arrays
from device import device  # noqa: E402,F401
