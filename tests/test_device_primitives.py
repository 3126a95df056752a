"""The primitives on device arrays (strict CuPy stand-in): CuPy in, CuPy out, nothing data-sized copied, CPU bits."""

from __future__ import annotations

import numpy as np
import pytest

import rnstensor as rt
from device import same_bits
from rnstensor.arrays import MixedDevicesError


def _data(rng, shape):
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, shape))
    x.reshape(-1)[:3] = [0.0, -0.0, 5e-324]
    return x


def test_encode_decode_round_trip(device):
    rng = np.random.default_rng(0)
    x = _data(rng, (6, 5, 4))
    xd = device.put(x)
    for shared in (None, (1, 2), ()):
        T = device.resident(lambda: rt.encode(xd, 15, shared_axes=shared).residues)
        same_bits(T, rt.encode(x, 15, shared_axes=shared).residues)
        Td, Th = rt.encode(xd, 15, shared_axes=shared), rt.encode(x, 15, shared_axes=shared)
        for mode in ("fp64", "exact"):
            got = device.resident(lambda: rt.decode(Td, mode))
            same_bits(got, rt.decode(Th, mode))
    assert rt.decode(rt.encode(xd, 15), "exact")[0, 0, 1].get() == 0.0  # -0.0 survives
    assert np.signbit(rt.decode(rt.encode(xd, 15), "exact")[0, 0, 1].get())


def test_products_sums_drops(device):
    rng = np.random.default_rng(1)
    x, a, f = _data(rng, (3, 8, 6)), rng.uniform(-1, 1, (5, 8)), rng.uniform(0.5, 2, (8, 6))
    B = rt.Basis.int8(15)
    xd, ad, fd = device.put(x), device.put(a), device.put(f)

    def chain(x, a, f):
        X = rt.encode(x, B, 40, shared_axes=(1, 2))
        A = rt.encode(a, B, 40, shared_axes=(1,))
        F = rt.encode(f, B, 30)
        Y = rt.mode_product(X, A, 1)
        Y = rt.drop(Y, 3)
        Z = rt.base_extend(Y)
        H = rt.hadamard(rt.encode(x, B, 40, shared_axes=(1, 2)), F)
        S = rt.sub(rt.add(H, H), H)
        return Z, S

    Zh, Sh = chain(x, a, f)
    Zd, Sd = chain(xd, ad, fd)
    assert (Zd.bound, Zd.active, Sd.bound) == (Zh.bound, Zh.active, Sh.bound)
    same_bits(Zd.residues, Zh.residues)
    same_bits(Sd.residues, Sh.residues)
    for mode in ("fp64", "exact"):
        same_bits(rt.decode(Zd, mode), rt.decode(Zh, mode))
        same_bits(rt.decode(Sd, mode), rt.decode(Sh, mode))
    out = device.resident(lambda: tuple(rt.decode(T, "exact") for T in chain(xd, ad, fd)))
    same_bits(out[0], rt.decode(Zh, "exact"))


def test_mixing_host_and_device_is_a_type_error(device):
    rng = np.random.default_rng(2)
    x, a = rng.uniform(-1, 1, (4, 3)), rng.uniform(-1, 1, (2, 4))
    X = rt.encode(device.put(x), 15)
    A = rt.encode(a, 15, shared_axes=(1,))
    with pytest.raises(MixedDevicesError, match="T.*op|op.*T"):
        rt.mode_product(X, A, 0)
    with pytest.raises(TypeError):
        np.asarray(X.residues)  # the strict stand-in refuses implicit conversion, as CuPy does
    with pytest.raises(ValueError, match="backend"):
        rt.encode(device.put(x), 15, backend="cpu")


def test_the_readme_gpu_example_runs(device):
    # the README's CuPy example (its ```py block), on the strict stand-in
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    (block,) = re.findall(r"```py\n(.*?)```", readme, re.S)
    assert "import cupy" in block
    exec(compile(block, "README.md", "exec"), {})
