"""How the GPU tests get CuPy: the module where it works, a skip without a GPU, a failure where a GPU is required."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["gpu_required", "cupy_or_skip"]


def gpu_required() -> bool:
    """Whether a missing CuPy or device fails the GPU tests here: ``RNSTENSOR_REQUIRE_GPU=1`` (device_check.sh sets
    it), or an NVIDIA GPU in this machine (``/proc/driver/nvidia/gpus``) unless ``RNSTENSOR_REQUIRE_GPU=0``."""
    asked = os.environ.get("RNSTENSOR_REQUIRE_GPU")
    if asked in ("0", "1"):
        return asked == "1"
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def cupy_or_skip():
    """CuPy, for a test module's ``cp``; without it the module is skipped, or, where a GPU is required, ``None``:
    then each of its tests fails in its set-up with the reason (tests/gpu/conftest.py), never skips."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - an import that fails for any reason
        if gpu_required():
            return None
        pytest.skip(f"CuPy does not import: {type(exc).__name__}: {exc}", allow_module_level=True)
    return cupy
