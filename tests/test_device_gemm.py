"""dgemm / zgemm / matmul on device arrays (strict CuPy stand-in): CuPy in, CuPy out, the CPU backend's bits."""

from __future__ import annotations

import numpy as np
import pytest

import rnstensor as rt
from device import same_bits
from rnstensor.arrays import MixedDevicesError


def _operands(rng, m, k, n, cplx=False):
    a = rng.standard_normal((m, k)) * np.exp2(rng.integers(-20, 20, (m, 1)))
    b = rng.standard_normal((k, n)) * np.exp2(rng.integers(-20, 20, (1, n)))
    if cplx:
        a = a + 1j * rng.standard_normal((m, k))
        b = b - 1j * rng.standard_normal((k, n))
    return a, b


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (17, 33, 9), (40, 64, 24)])
@pytest.mark.parametrize("moduli", [None, "auto", 12])
def test_dgemm(device, m, k, n, moduli):
    rng = np.random.default_rng(m + k + n)
    a, b = _operands(rng, m, k, n)
    ad, bd = device.put(a), device.put(b)
    got = device.resident(lambda: rt.dgemm(ad, bd, moduli=moduli))
    same_bits(got, rt.dgemm(a, b, moduli=moduli))


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (-0.75, 0.5), (2.0**-40, 1.0)])
def test_dgemm_blas_parameters(device, alpha, beta):
    rng = np.random.default_rng(3)
    a, b = _operands(rng, 9, 20, 7)
    c = rng.standard_normal((7, 9))
    ad, bd, cd = device.put(a), device.put(b), device.put(c)
    kw = dict(alpha=alpha, beta=beta, trans_a="T", trans_b="C")
    want = rt.dgemm(a.T, b.T, c.T.copy(), **kw)
    got = device.resident(lambda: rt.dgemm(ad.T, bd.T, cd.T, **kw))
    same_bits(got, want)
    out = device.cp.zeros((9, 7))
    assert rt.dgemm(ad, bd, out=out, alpha=alpha) is out
    same_bits(out, rt.dgemm(a, b, alpha=alpha))


def test_zgemm(device):
    rng = np.random.default_rng(4)
    a, b = _operands(rng, 12, 30, 8, cplx=True)
    c = rng.standard_normal((12, 8)) + 1j * rng.standard_normal((12, 8))
    ad, bd, cd = device.put(a), device.put(b), device.put(c)
    for kw in ({}, {"alpha": 0.5 - 2j}, {"alpha": 1j, "beta": 0.25, "c": cd}, {"trans_b": "C", "moduli": "auto"}):
        host = {key: (c if key == "c" else v) for key, v in kw.items()}
        bb, bh = (bd.T.conj(), b.T.conj().copy()) if kw.get("trans_b") == "C" else (bd, b)
        got = device.resident(lambda: rt.zgemm(ad, bb, **kw))
        same_bits(got, rt.zgemm(a, bh, **host))


def test_auto_with_alpha_and_beta_rounds_once_on_the_device(device):
    # the exact epilogue runs on the host (Python integers): the product's integers and c come over, the CPU's bits
    # come back as a device array
    rng = np.random.default_rng(6)
    a, b = _operands(rng, 9, 20, 7)
    c = rng.standard_normal((9, 7)) * 1e-3
    ad, bd, cd = device.put(a), device.put(b), device.put(c)
    got = rt.dgemm(ad, bd, cd, alpha=1.5, beta=-0.3, moduli="auto")
    assert isinstance(got, device.cp.ndarray)
    same_bits(got, rt.dgemm(a, b, c, alpha=1.5, beta=-0.3, moduli="auto"))
    za, zb = a + 1j * a[::-1], b - 0.5j * b
    zc = c + 1j
    got = rt.zgemm(device.put(za), device.put(zb), device.put(zc), alpha=0.5 + 2j, beta=1 - 1j, moduli="auto")
    same_bits(got, rt.zgemm(za, zb, zc, alpha=0.5 + 2j, beta=1 - 1j, moduli="auto"))


@pytest.mark.parametrize("cplx", [False, True])
def test_auto_beyond_one_plan_on_the_device(device, cplx, monkeypatch):
    # moduli='auto' (and a target) on rows 49 moduli cannot hold: the exact product's integers made on the host (as
    # einsum's), its residue GEMMs of limbs (taken here however small) on the device, a device array back: the
    # host's bits
    from rnstensor.run import exact_path

    monkeypatch.setattr(exact_path, "RESIDUE_GEMM_TERMS", 0)
    rng = np.random.default_rng(12)
    a = rng.standard_normal((6, 20)) * np.exp2(rng.integers(-500, 500, (6, 20)))
    b, c = rng.standard_normal((20, 5)), rng.standard_normal((6, 5))
    a[0, :2], b[:2, 0] = (1e300, 1e-300), (1e-300, 1e300)  # (two terms of one size: a target needs both exactly)
    gemm, alpha, beta = rt.dgemm, 1.5, -0.3
    if cplx:
        a, b, c = a + 1j * a[::-1], b - 0.5j * b[::-1], c + 1j
        gemm, alpha, beta = rt.zgemm, 0.5 + 2j, 1 - 1j
    cuda = rt.backends.get_backend("cuda")
    gemms = []  # (cuBLAS: no kernel of ours)
    real = cuda.matmul
    monkeypatch.setattr(cuda, "matmul", lambda x, y, m: gemms.append(type(x)) or real(x, y, m))
    for kw in ({"moduli": "auto"}, {"rtol": 1e-12}):
        want = gemm(a, b, c, alpha=alpha, beta=beta, **kw)
        gemms.clear()
        got = gemm(device.put(a), device.put(b), device.put(c), alpha=alpha, beta=beta, **kw)
        assert isinstance(got, device.cp.ndarray)
        assert gemms and set(gemms) == {device.cp.ndarray}, kw
        same_bits(got, want)


def test_nonfinite_rows_and_tiles(device):
    rng = np.random.default_rng(5)
    a, b = _operands(rng, 20, 50, 16)
    a[3, 7] = np.inf
    b[2, 5] = np.nan
    ad, bd = device.put(a), device.put(b)
    want = rt.dgemm(a, b, workspace_bytes=20_000)
    got = device.resident(lambda: rt.dgemm(ad, bd, workspace_bytes=20_000))
    same_bits(got, want)


def test_matmul(device):
    rng = np.random.default_rng(6)
    S = rng.standard_normal((2, 3, 5, 7))
    v = rng.standard_normal(7)
    Sd, vd = device.put(S), device.put(v)
    # a stack of 6 matrices reads back one number per matrix at most (see test_matmul_stack_batched)
    same_bits(device.resident(lambda: rt.matmul(Sd, vd), limit=8 * 6), rt.matmul(S, v))
    same_bits(device.resident(lambda: rt.matmul(Sd, Sd.transpose(0, 1, 3, 2)), limit=8 * 6),
              rt.matmul(S, S.transpose(0, 1, 3, 2)))
    assert rt.gemm_moduli(Sd[0, 0], Sd[0, 0].T, "auto") == rt.gemm_moduli(S[0, 0], S[0, 0].T, "auto")


@pytest.mark.parametrize("cplx", [False, True])
@pytest.mark.parametrize("moduli", [None, "auto", 14])
def test_matmul_stack_batched(device, cplx, moduli):
    """A device stack runs batched: the CPU's bits, fewer launches than a dgemm per matrix, and nothing read back
    beyond one number per matrix (its measured ratio or width: one vector, where a loop reads scalars per matrix)."""
    rng = np.random.default_rng(7 + cplx)
    nb, m, k, n = 6, 5, 9, 4
    a, b = rng.standard_normal((nb, m, k)), rng.standard_normal((nb, k, n))
    if cplx:
        a, b = a + 1j * rng.standard_normal(a.shape), b - 1j * rng.standard_normal(b.shape)
    a, b = a * np.exp2(rng.integers(-30, 30, (nb, 1, 1))), b * np.exp2(rng.integers(-30, 30, (nb, 1, n)))
    a[3, 1, 2] = np.inf  # a matrix left to its own dgemm (numpy's inf/NaN rule), the others gathered around it
    ad, bd = device.put(a), device.put(b)
    got = device.resident(lambda: rt.matmul(ad, bd, moduli=moduli), limit=8 * nb)
    with np.errstate(invalid="ignore"):
        same_bits(got, rt.matmul(a, b, moduli=moduli))
    gemm = rt.zgemm if cplx else rt.dgemm
    before = len(device.launches)
    device.cp.transfers.reset()
    rt.matmul(ad, bd, moduli=moduli)
    batched, copies = len(device.launches) - before, len(device.cp.transfers.events)
    for i in range(nb):
        gemm(ad[i], bd[i], moduli=moduli)
    assert batched < (len(device.launches) - before - batched) / 2
    assert copies < len(device.cp.transfers.events) - copies  # (each a wait for the device)


@pytest.mark.parametrize("moduli", [None, "fast", "auto"])
def test_stack_copies_do_not_grow_with_the_stack(device, moduli):
    """The choices of a device stack wait for the device a number of times that does not grow with its matrices: the
    spreads a search asks for come back a width at a time for every matrix (one number each), not entry by entry."""
    rng = np.random.default_rng(12)
    a, b = rng.standard_normal((1, 20, 30)), rng.standard_normal((1, 30, 10)) * np.exp2(rng.integers(-9, 9, (1, 1, 10)))
    copies = []
    for nb in (3, 12):
        ad, bd = device.put(np.repeat(a, nb, axis=0)), device.put(np.repeat(b, nb, axis=0))
        got = device.resident(lambda: rt.matmul(ad, bd, moduli=moduli), limit=8 * nb)
        same_bits(got, rt.matmul(np.repeat(a, nb, axis=0), np.repeat(b, nb, axis=0), moduli=moduli))
        device.cp.transfers.reset()
        rt.matmul(ad, bd, moduli=moduli)
        copies.append(len(device.cp.transfers.events))
    assert copies[0] == copies[1], copies


def test_device_errors(device):
    a = np.ones((3, 4))
    with pytest.raises(MixedDevicesError, match="b"):
        rt.dgemm(device.put(a), a.T)
    with pytest.raises(ValueError, match="backend"):
        rt.dgemm(device.put(a), device.put(a.T), backend="cpu")
    with pytest.raises(ValueError, match="out"):
        rt.dgemm(device.put(a), device.put(a.T), out=device.cp.zeros((3, 3), np.float32))


@pytest.mark.parametrize("cplx", [False, True])
def test_split_product_stays_on_the_device(device, cplx):
    """Rows too wide for 49 moduli (the default's exact slices): device-resident, the CPU backend's bits."""
    rng = np.random.default_rng(8)
    a, b = _operands(rng, 6, 10, 5, cplx)
    a[1, :5] *= 2.0**-1000
    a[1, 5:] *= 2.0**900
    b[:3, 2] *= 2.0**-1000
    ad, bd = device.put(a), device.put(b)
    got = device.resident(lambda: rt.zgemm(ad, bd) if cplx else rt.dgemm(ad, bd))
    same_bits(got, (rt.zgemm if cplx else rt.dgemm)(a, b))


@pytest.mark.parametrize("moduli", [None, "fast", "auto"])
def test_matmul_stack_sharing_b(device, moduli):
    """A device stack times one matrix: the CPU's bits (each matrix dgemm's alone), its widths run as the host's."""
    rng = np.random.default_rng(25)
    a = rng.standard_normal((4, 3, 60)) * np.exp(4 * rng.standard_normal((4, 3, 60)))
    b = rng.standard_normal((60, 4)) * np.exp(4 * rng.standard_normal((60, 4)))
    ad, bd = device.put(a), device.put(b)
    got = device.resident(lambda: rt.matmul(ad, bd, moduli=moduli), limit=8 * 4)
    same_bits(got, rt.matmul(a, b, moduli=moduli))
