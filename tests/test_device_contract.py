"""einsum and contract_expression on device arrays (strict CuPy stand-in): CuPy in, CuPy out, the CPU bits."""

from __future__ import annotations

import re

import numpy as np
import pytest

import rnstensor as rt
from device import same_bits
from rnstensor.arrays import MixedDevicesError

CASES = [
    ("ij,jk,kl->il", [(6, 7), (7, 8), (8, 5)]),
    ("eijk,ai,bj,ck->eabc", [(3, 4, 4, 4), (5, 4), (5, 4), (5, 4)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(4, 4)]),
    ("ij,ij->", [(3, 5), (3, 5)]),
    ("i,j->ij", [(3,), (4,)]),
]


@pytest.mark.parametrize("subscripts, shapes", CASES)
@pytest.mark.parametrize("decode", ["fp64", "exact"])
def test_einsum(device, subscripts, shapes, decode):
    rng = np.random.default_rng(len(subscripts))
    ops = [rng.standard_normal(s) * np.exp2(rng.integers(-8, 8, s)) for s in shapes]
    kw = dict(decode=decode)
    if decode == "exact":  # correctly rounded: no drops and exact encodings (checked on the device)
        ops, kw["moduli"] = [np.round(x * 2.0**10) for x in ops], 30
    want = rt.einsum(subscripts, *ops, **kw)
    dev = [device.put(x) for x in ops]
    got = device.resident(lambda: rt.einsum(subscripts, *dev, **kw))
    same_bits(got, want)


@pytest.mark.parametrize("spread", [6, 300])
def test_einsum_auto(device, spread, monkeypatch):
    # moduli='auto' on device arrays: one exact plan (spread 6) on the device, or (spread 300: no plan of 49
    # moduli holds it) the exact value pairwise in Python integers, its residue GEMMs (taken here for every pair,
    # however small) on the device: the host's bits
    from rnstensor.run import exact_path

    monkeypatch.setattr(exact_path, "RESIDUE_GEMM_TERMS", 0)
    rng = np.random.default_rng(spread)
    sub, shapes = "eijk,ai,bj,ck->eabc", [(2, 3, 3, 3), (2, 3), (3, 3), (2, 3)]
    ops = [rng.standard_normal(s) * np.exp2(rng.integers(-spread, spread, s)) for s in shapes]
    expr = rt.contract_expression(sub, *shapes, moduli="auto")
    want = expr(*ops)
    assert ("pairwise" in expr.last_evaluation) == (spread > 100)
    cuda = rt.backends.get_backend("cuda")
    gemms = []  # the residue GEMMs the pairwise path sends to the device (cuBLAS: no kernel of ours)
    real = cuda.matmul
    monkeypatch.setattr(cuda, "matmul", lambda a, b, m: gemms.append(type(a)) or real(a, b, m))
    got = expr(*[device.put(x) for x in ops])
    assert isinstance(got, device.cp.ndarray)
    assert (gemms and set(gemms) == {device.cp.ndarray}) if spread > 100 else not gemms
    same_bits(got, want)


def _default_data(data: str) -> tuple:
    """``(rng, a, b)``: (16, 24) and (24, 8) operands, uniform, phi = 4, or with a row too wide for 49 moduli."""
    rng = np.random.default_rng(3)
    a, b = rng.uniform(-1, 1, (16, 24)), rng.uniform(-1, 1, (24, 8))
    if data == "phi4":
        a, b = ((rng.random(x.shape) - 0.5) * np.exp(4 * rng.standard_normal(x.shape)) for x in (a, b))
    if data == "wide":
        a[0, :2], b[:2, 0] = (1e300, 1e-300), (1e-300, 1e300)
    return rng, a, b


@pytest.mark.parametrize("data, path", [("uniform", r"15 moduli, 53 bits"), ("phi4", r"(1[6-9]|[2-4]\d) moduli"),
                                        ("wide", r"composed")])
def test_classical_default_paths(device, data, path):
    # the certified plan, a wider rung (16-19 moduli) and the composed classical GEMMs of an expression that is not
    # one GEMM (j and k both summed): on the device, the CPU's bits
    rng, a, b = _default_data(data)
    expr = rt.contract_expression("ij,jk->i", a.shape, b.shape)
    want = expr(a, b)
    assert re.match(path, expr.last_evaluation), expr.last_evaluation
    path = expr.last_evaluation
    ad, bd = device.put(a), device.put(b)
    same_bits(device.resident(lambda: expr(ad, bd)), want)
    assert expr.last_evaluation == path
    composed = path.startswith("composed")  # its bound is CuPy's own arithmetic: no kernel of ours
    same_bits(device.resident(lambda: expr.error_bound(ad, bd), kernels=not composed), expr.error_bound(a, b))
    ints = rng.integers(-1000, 1000, a.shape)
    di = device.put(ints)  # integers convert exactly, on the device
    same_bits(device.resident(lambda: rt.einsum("ij,jk->i", di, bd)), rt.einsum("ij,jk->i", ints, b))


@pytest.mark.parametrize("data", ["uniform", "phi4", "wide"])
def test_gemm_shaped_default(device, data):
    # one GEMM: each row on the moduli dgemm gives it alone (a row too wide for 49 moduli: the certificate's path),
    # on the device the CPU's bits, dgemm's bits row by row, and the same error bound
    _, a, b = _default_data(data)
    expr = rt.contract_expression("ij,jk->ik", a.shape, b.shape)
    want = expr(a, b)
    path = expr.last_evaluation
    assert ("composed classical GEMMs (1 of 16 elements)" in path) == (data == "wide"), path
    for i in range(1 if data == "wide" else 0, 16):
        same_bits(want[i:i + 1], rt.dgemm(a[i:i + 1], b))
    ad, bd = device.put(a), device.put(b)
    # (the moduli choice reads one number per element back per width it tries, as a stack's per matrix)
    same_bits(device.resident(lambda: expr(ad, bd), limit=8 * 16), want)
    assert expr.last_evaluation == path
    same_bits(device.resident(lambda: expr.error_bound(ad, bd), limit=8 * 16), expr.error_bound(a, b))


def test_complex_einsum(device):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((4, 6)) + 1j * rng.standard_normal((4, 6))
    b = rng.standard_normal((6, 3))
    ad, bd = device.put(a), device.put(b)
    # one GEMM: each row on zgemm's moduli for it alone (one number per element back per width tried, as for real
    # operands), zgemm's bits row by row; an expression that is not one GEMM: the certificate's path, scalars back
    for sub, x, y, xd, yd in (("ij,jk->ik", a, b, ad, bd), ("ij,jk->ik", a, a.T.conj(), ad, ad.T.conj())):
        want = rt.einsum(sub, x, y)
        same_bits(device.resident(lambda: rt.einsum(sub, xd, yd), limit=8 * 4), want)
        for i in range(4):
            same_bits(want[i:i + 1], rt.zgemm(x[i:i + 1], y.astype(complex)))
    same_bits(device.resident(lambda: rt.einsum("ij,jk->i", ad, bd)), rt.einsum("ij,jk->i", a, b))


def test_contract_expression_with_host_and_device_constants(device):
    rng = np.random.default_rng(8)
    X = rng.uniform(-1, 1, (5, 4, 4, 4))
    A = rng.uniform(-1, 1, (3, 4))
    for const in (A, device.put(A)):  # constants on either side: encoded once, kept on the device
        expr = rt.contract_expression("eijk,ai,bj,ck->eabc", X.shape, const, const, const, constants=[1, 2, 3])
        want = rt.contract_expression("eijk,ai,bj,ck->eabc", X.shape, A, A, A, constants=[1, 2, 3])
        Xd = device.put(X)
        same_bits(device.resident(lambda: expr(Xd)), want(X))
        bound = device.resident(lambda: expr.error_bound(Xd))
        same_bits(bound, want.error_bound(X))


def test_rnstensor_operands_and_out(device):
    rng = np.random.default_rng(9)
    x, y = rng.uniform(-1, 1, (3, 4)), rng.uniform(-1, 1, (4, 2))
    Tx, Ty = rt.encode(device.put(x), 15, shared_axes=(1,)), rt.encode(device.put(y), 15, shared_axes=(0,))
    Hx, Hy = rt.encode(x, 15, shared_axes=(1,)), rt.encode(y, 15, shared_axes=(0,))
    Z = rt.einsum("ij,jk->ik", Tx, Ty)
    assert isinstance(Z, rt.RNSTensor)
    same_bits(Z.residues, rt.einsum("ij,jk->ik", Hx, Hy).residues)
    out = device.cp.zeros((3, 2))
    assert rt.einsum("ij,jk->ik", device.put(x), device.put(y), out=out) is out
    same_bits(out, rt.einsum("ij,jk->ik", x, y))
    with pytest.raises(MixedDevicesError, match="operand"):
        rt.einsum("ij,jk->ik", device.put(x), y)
    with pytest.raises(ValueError, match="out"):
        rt.einsum("ij,jk->ik", device.put(x), device.put(y), out=np.zeros((3, 2)))


def test_nonfinite_operands_on_the_device(device):
    """inf / NaN operands follow numpy where the data lives: the CPU call's bits, computed on the device."""
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((4, 5)), rng.standard_normal((5, 3))
    a[1, 2], b[3, 0] = np.inf, np.nan
    want = rt.einsum("ij,jk->ik", a, b)
    ad, bd = device.put(a), device.put(b)
    same_bits(rt.einsum("ij,jk->ik", ad, bd), want)
    expr = rt.contract_expression("ij,jk->ik", a.shape, b.shape)
    same_bits(expr.error_bound(ad, bd), expr.error_bound(a, b))


def test_correctly_rounded_fallback_on_the_device(device):
    # no residue plan certifies an entry of 2**-200 read alone, one exact plan holds the operands: the default's
    # correctly rounded fallback runs on the device, without data-sized copies, with the CPU's bits and bound
    # (the first row: the second is certified in residues, each row deciding alone)
    a = np.array([[1.0, 2.0**-200, 3.0]])
    b = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 2.0**-100]])
    expr = rt.contract_expression("ij,jk->ik", a.shape, b.shape)
    want = expr(a, b)
    assert expr.last_evaluation.startswith("correctly rounded")
    ad, bd = device.put(a), device.put(b)
    same_bits(device.resident(lambda: expr(ad, bd)), want)
    assert expr.last_evaluation.startswith("correctly rounded")
    same_bits(device.resident(lambda: expr.error_bound(ad, bd), kernels=False), expr.error_bound(a, b))
    # both rows: apart on the device as on the CPU
    a2 = np.array([[1.0, 2.0**-200, 3.0], [0.5, 1.0, 2.0**-150]])
    expr2 = rt.contract_expression("ij,jk->ik", a2.shape, b.shape)
    same_bits(expr2(device.put(a2), bd), expr2(a2, b))
    assert expr2.last_evaluation.endswith("correctly rounded (43 moduli, exact) (1 of 2 elements)")
    same_bits(expr2.error_bound(device.put(a2), bd), expr2.error_bound(a2, b))


@pytest.mark.parametrize("kw", [{}, {"moduli": "fast"}, {"moduli": 17}, {"moduli": 30, "decode": "exact"}])
def test_mode_chains_fuse_on_the_device(device, kw):
    # an expression's mode products by constant operators run as the one fused chain kernel on the device (the CPU
    # runs them in its fused interpreter), with the CPU's bits
    rng = np.random.default_rng(9)
    ops = [rng.uniform(-1, 1, (5, 4)) for _ in range(3)]
    X = rng.uniform(-1, 1, (6, 4, 4, 4))
    if kw.get("decode") == "exact":  # correctly rounded: exact encodings, no drops
        ops, X = [np.round(A * 64) for A in ops], np.round(X * 64)
    expr = rt.contract_expression("eijk,ai,bj,ck->eabc", X.shape, *ops, constants=[1, 2, 3], **kw)
    want = expr(X)
    Xd = device.put(X)
    got = device.resident(lambda: expr(Xd))
    same_bits(got, want)
    assert any(k.startswith("rns_chain_fused") for k in device.launches[-3:]), device.launches[-3:]
    # no batch axis: one tensor
    expr = rt.contract_expression("ijk,ai,bj,ck->abc", X.shape[1:], *ops, constants=[1, 2, 3], **kw)
    same_bits(device.resident(lambda: expr(Xd[0])), expr(X[0]))
