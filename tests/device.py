"""The strict CuPy stand-in as a fixture: device arrays that refuse implicit host conversion, counted transfers.

``device`` (module scope) installs tests/cupy_standin.py in strict mode with a
:class:`~rnstensor.backends.cuda.CudaBackend` on it and yields a
:class:`Device` helper; the stand-in is removed afterwards, so the other test
modules see no CuPy.
"""

from __future__ import annotations

import numpy as np
import pytest

import cupy_standin
from rnstensor.kernels import build

#: the most bytes one host <-> device copy may carry after a warm-up call: scalars read back (a flag,
#: a maximum), never an array that grows with the data
SCALAR_BYTES = 16


class Device:
    """What a device test needs: the stand-in CuPy module, its launches and transfers, and checks on them."""

    def __init__(self, cp, launches):
        self.cp, self.launches = cp, launches

    def put(self, x) -> "cupy_standin.DevArray":
        """An explicit host-to-device copy (not counted against the call under test)."""
        return self.cp.asarray(np.asarray(x))

    def get(self, x) -> np.ndarray:
        assert isinstance(x, self.cp.ndarray), f"expected a device array back, got {type(x).__name__}"
        return x.get()

    def resident(self, call, *, warm: int = 1, limit: int = SCALAR_BYTES, kernels: bool = True):
        """Run ``call()`` ``warm`` times, then once more with transfers counted: the result, checked device-resident.

        The counted call must launch kernels (unless ``kernels=False``: CuPy's
        own float64 arithmetic), copy nothing above ``limit`` bytes either way,
        and return device arrays (a tuple of them is fine).
        """
        for _ in range(warm):
            call()
        self.cp.transfers.reset()
        n = len(self.launches)
        out = call()
        big = self.cp.transfers.at_least(limit + 1)
        assert not big, f"data-sized host <-> device copies after warm-up: {big[:5]}"
        assert len(self.launches) > n or not kernels, "no kernel was launched"
        for o in out if isinstance(out, tuple) else (out,):
            assert isinstance(o, self.cp.ndarray), f"expected a device array, got {type(o).__name__}"
        return out


def same_bits(got, want) -> None:
    """``got`` (a device array) and ``want`` (a host array) hold the same bits."""
    got = got.get() if hasattr(got, "get") else got
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    assert np.array_equal(got.reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8)), np.argwhere(got != want)[:5]


@pytest.fixture(scope="module")
def device(tmp_path_factory):
    from rnstensor import backends

    shared = tmp_path_factory.getbasetemp() / "rnstensor-kernel-cache"  # shared with the other kernel tests
    shared.mkdir(exist_ok=True)
    try:
        cp, launches, restore = cupy_standin.install(
            tmp_path_factory.mktemp("standin"), shared, device_arrays_are_cupy=True, simt_max_macs=1 << 18,
            strict=True)
    except build.KernelBuildError as exc:  # pragma: no cover
        pytest.skip(f"NVRTC (the 'test' extras) or a host C++ compiler is missing: {exc}")
    saved = backends._BACKENDS.pop("cuda", None)
    try:
        from rnstensor.backends.cuda import CudaBackend

        backends._BACKENDS["cuda"] = CudaBackend()
        yield Device(cp, launches)
    finally:
        backends._BACKENDS.pop("cuda", None)
        if saved is not None:
            backends._BACKENDS["cuda"] = saved
        restore()
