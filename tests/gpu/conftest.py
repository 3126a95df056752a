"""GPU tests: skipped unless CuPy imports and sees a CUDA device."""

from __future__ import annotations

import pytest

from rnstensor.backends.cuda import cuda_available

HAVE_GPU = cuda_available()


def pytest_collection_modifyitems(config, items):
    if HAVE_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA device: CuPy and a GPU are needed (pip install 'rnstensor[gpu]')")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
