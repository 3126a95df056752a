"""The GEMM accuracy harness ([2610.26945] Tables 6-8, ZGEMM rows) against Fraction oracles, and `rnstensor accuracy gemm`."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import rnstensor as rt
from rnstensor import gemm as G
from rnstensor import gemm_accuracy as GA
from rnstensor.cli import main


def frac_matmul(A: np.ndarray, B: np.ndarray) -> list[list[Fraction]]:
    """The exact real ``A @ B`` in Fractions (independent of every harness function)."""
    Af = [[Fraction(float(x)) for x in row] for row in A]
    Bf = [[Fraction(float(x)) for x in row] for row in B.T]
    return [[sum((x * y for x, y in zip(ra, cb)), Fraction(0)) for cb in Bf] for ra in Af]


def frac_error(c: float, exact: Fraction) -> float:
    """``|c - exact|`` rounded once (Fraction -> float rounds correctly)."""
    return float(abs(Fraction(c) - exact)) if math.isfinite(c) else math.inf


# ----- ExactReference: the fast metrics agree with an exact oracle ---------------------------------


def _perturbed(ref: np.ndarray, rng) -> np.ndarray:
    """Results near and far from ``ref``: exact, a few ulps off, sign flips, zeros, gross errors, inf, NaN."""
    C = ref.copy()
    kind = rng.integers(0, 8, ref.shape)
    ulps = rng.integers(-5, 6, ref.shape).astype(np.float64)
    C = np.where(kind == 1, ref + ulps * np.spacing(np.abs(ref)), C)
    C = np.where(kind == 2, -ref, C)
    C = np.where(kind == 3, 0.0, C)
    C = np.where(kind == 4, ref * 3.5, C)
    C = np.where(kind == 5, ref * 0.3 + 1e-300, C)
    C.flat[0], C.flat[1] = np.inf, np.nan
    return C


@pytest.mark.parametrize("name", ["uniform", "phi4", "cancel", "sincos"])
def test_exact_reference_errors_match_fraction_oracle(name):
    A, B = GA.gemm_dataset(name, 4, 16, 5, seed=3)
    exact = frac_matmul(A, B)
    ref = GA.ExactReference.of(A, B)
    # the rounded value and the residual are the correctly rounded exact quantities
    for i in range(4):
        for j in range(5):
            assert ref.rounded[i, j] == float(exact[i][j])
            assert ref.residual[i, j] == float(exact[i][j] - Fraction(float(ref.rounded[i, j])))
    C = _perturbed(ref.rounded, np.random.default_rng(7))
    err = ref.errors(C)
    for i in range(4):
        for j in range(5):
            want = frac_error(float(C[i, j]), exact[i][j])
            if C[i, j] == ref.rounded[i, j] or not math.isfinite(want):
                assert err[i, j] == want or (math.isinf(want) and math.isinf(err[i, j]))
            else:
                assert abs(err[i, j] - want) <= 2.0**-51 * want
    # the CR count is exact, and equals the slow exact gemm_metrics
    m_fast = ref.metrics(C)
    S, e = GA.exact_gemm(A, B)
    m_slow = GA.gemm_metrics(C, S, e, np.abs(A) @ np.abs(B))
    assert m_fast["cr_percent"] == m_slow["cr_percent"] == 100.0 * float((C == ref.rounded).mean())


def test_exact_reference_metrics_of_a_correctly_rounded_result():
    A, B = GA.gemm_dataset("phi2", 3, 32, 4, seed=1)
    ref = GA.ExactReference.of(A, B)
    m = ref.metrics(ref.rounded)
    S, e = GA.exact_gemm(A, B)
    assert m == GA.gemm_metrics(ref.rounded, S, e, np.abs(A) @ np.abs(B))  # identical where C == rounded
    assert m["cr_percent"] == 100.0 and m["max_ulp"] <= 0.5
    bad = ref.rounded.copy()
    bad[1, 2] = np.nextafter(bad[1, 2], np.inf)
    m2 = ref.metrics(bad)
    assert m2["cr_percent"] == pytest.approx(100.0 * 11 / 12) and 0.5 <= m2["max_ulp"] <= 1.5


# ----- complex references and data -----------------------------------------------------------------


def test_exact_zgemm_matches_fraction_oracle():
    A, B = GA.zgemm_dataset("phi1", 3, 12, 4, seed=2)
    re, im = GA.exact_zgemm(A, B)
    rr, ii = frac_matmul(A.real, B.real), frac_matmul(A.imag, B.imag)
    ri, ir = frac_matmul(A.real, B.imag), frac_matmul(A.imag, B.real)
    for i in range(3):
        for j in range(4):
            assert re.rounded[i, j] == float(rr[i][j] - ii[i][j])
            assert im.rounded[i, j] == float(ri[i][j] + ir[i][j])
    np.testing.assert_array_equal(re.abs_product, np.abs(A.real) @ np.abs(B.real) + np.abs(A.imag) @ np.abs(B.imag))


def test_zgemm_dataset_parts():
    for name in GA.GEMM_DATASETS:
        A, B = GA.zgemm_dataset(name, 3, 8, 2, seed=4)
        Ar, Br = GA.gemm_dataset(name, 3, 8, 2, seed=4)
        assert A.dtype == B.dtype == np.complex128 and A.shape == (3, 8) and B.shape == (8, 2)
        np.testing.assert_array_equal(A.real, Ar)
        np.testing.assert_array_equal(B.real, Br)
        if name != "boundary":
            assert not np.array_equal(A.imag, A.real)
    A, _ = GA.zgemm_dataset("boundary", 2, 4, 2)
    assert np.all(A.imag == 1 - 2.0**-53)


# ----- Table 6 / 8 rows ------------------------------------------------------------------------------


def test_gemm_accuracy_rows_resolve_moduli():
    rows = GA.gemm_accuracy(["phi2"], [None, "auto", 14, "fast"], m=3, k=64, n=3)
    assert [r["method"] for r in rows] == ["numpy", "dgemm", "dgemm", "dgemm", "dgemm"]
    assert [r["moduli"] for r in rows] == [None, "default", "auto", "14", "fast"]
    assert rows[1]["s"] == G.gemm_moduli(*GA.gemm_dataset("phi2", 3, 64, 3)) >= rows[4]["s"]
    assert rows[4]["s"] == G.moduli_for_bits(64) and rows[3]["s"] == 14
    assert rows[2]["s"] >= rows[1]["s"] and rows[2]["t"] == G.gemm_width(rows[2]["s"], 64)
    assert rows[2]["cr_percent"] == 100.0 and rows[2]["max_ulp"] <= 0.5
    assert rows[0]["s"] is None and rows[0]["t"] is None


@pytest.mark.parametrize("cplx", [False, True])
def test_table8_worst_cases_default_and_auto(cplx):
    """Boundary: exact with the default and 'auto' moduli; spike and cancel: correctly rounded with 'auto'."""
    rows = GA.gemm_accuracy(GA.TABLE8_DATASETS, ["default", "fast", "auto"], m=4, k=128, n=3, complex=cplx)
    by = {(r["data"], r["method"], r["moduli"]): r for r in rows}
    meth = "zgemm" if cplx else "dgemm"
    for mod in ("default", "fast", "auto"):
        r = by[("boundary", meth, mod)]
        assert r["cr_percent"] == 100.0 and r["max_ulp"] <= 0.5
    A, B = (GA.zgemm_dataset if cplx else GA.gemm_dataset)("boundary", 4, 128, 3)
    C = (rt.zgemm if cplx else rt.dgemm)(A, B)
    S, e = GA.exact_gemm(A.real, B.real) if cplx else GA.exact_gemm(A, B)
    x = Fraction(1) - Fraction(1, 2**53)
    want_re = 0.0 if cplx else float(128 * x * x)
    assert np.all(C.real == want_re)
    if cplx:
        assert np.all(C.imag == float(2 * 128 * x * x))
    n = 130 if cplx else 128
    gamma = (2**0.5 if cplx else 1) * n * 2.0**-53 / (1 - n * 2.0**-53)
    for name in ("spike", "cancel"):
        auto, fast = by[(name, meth, "auto")], by[(name, meth, "fast")]
        assert auto["cr_percent"] == 100.0 and auto["max_ulp"] <= 0.5
        assert auto["s"] > fast["s"]
        # the shared exponent costs the 53-bit width accuracy ([2610.26945] Sec. 8.3): able to fail
        assert fast["componentwise"] > auto["componentwise"] or fast["normwise"] > auto["normwise"]
        # the default widens until the classical componentwise bound holds (gamma_k; complex sqrt(2) gamma_{k+2})
        assert by[(name, meth, "default")]["componentwise"] <= gamma
    # cancellation: numpy float64 loses about 30 bits
    assert by[("cancel", "numpy", None)]["normwise"] > 1e-10


def test_zgemm_as_accurate_as_dgemm_on_uniform():
    """At the default moduli ZGEMM (3M) rounds every part correctly, as DGEMM does ([2610.26945]: 'as accurate')."""
    real = GA.gemm_accuracy(["uniform"], ["default"], m=4, k=1024, n=4, include_numpy=False)[0]
    cplx = GA.gemm_accuracy(["uniform"], ["default"], m=4, k=1024, n=4, include_numpy=False, complex=True)[0]
    assert real["cr_percent"] == cplx["cr_percent"] == 100.0
    assert cplx["s"] in (real["s"], real["s"] + 1)  # the 3M width rule costs at most one modulus


# ----- Table 7 ---------------------------------------------------------------------------------------


def test_gemm_thresholds_are_the_first_s_of_the_scan():
    rows = GA.gemm_thresholds(["phi1", "uniform"], [64], m=4, n=4, s_min=10)
    for r in rows:
        scan = {p["s"]: p for p in r["scan"]}
        for crit in GA.CRITERIA:
            s = r[crit]
            assert s is not None and s > 10 and r[crit + "_t"] == G.gemm_width(s, 64)
            assert GA._meets(crit, scan[s], r["numpy"]["componentwise"])
            assert not any(GA._meets(crit, scan[q], r["numpy"]["componentwise"]) for q in scan if q < s)
            noext = r[crit + "_noext"]
            if r[crit + "_t"] <= GA.EXTENDED_WIDTH:
                assert noext == s
            else:
                assert noext is None or G.gemm_width(noext, 64) <= GA.EXTENDED_WIDTH
        assert r["cr99.9"] <= r["cr100"] <= r["auto"]
        assert r["auto"] == G.gemm_moduli(*GA.gemm_dataset(r["data"], 4, 64, 4), "auto")
        assert scan[r["cr100"]]["cr_percent"] == 100.0
        assert max(scan) <= r["auto"]
    assert rows[0]["paper"] is None  # the paper has no k = 64 row
    assert GA.gemm_thresholds(["uniform"], [256], m=2, n=2)[0]["paper"] == (14, 15, 15)


def test_gemm_thresholds_bad_arguments():
    with pytest.raises(ValueError, match="s_min"):
        GA.gemm_thresholds(["uniform"], [64], s_min=20, s_max=12)
    with pytest.raises(ValueError, match="unknown data set"):
        GA.gemm_thresholds(["nope"], [64], m=2, n=2)


# ----- gemm_moduli: what dgemm / zgemm use -------------------------------------------------------------


def test_gemm_moduli_is_what_dgemm_uses():
    A, B = GA.gemm_dataset("spike", 3, 40, 2, seed=5)
    assert G.gemm_moduli(A, B, "fast") == G.moduli_for_bits(40) <= G.gemm_moduli(A, B)
    np.testing.assert_array_equal(rt.dgemm(A, B), rt.dgemm(A, B, moduli=G.gemm_moduli(A, B)))
    s = G.gemm_moduli(A, B, "auto")
    assert s == G._resolve_moduli("auto", A, B, 40, False) > G.moduli_for_bits(40)
    np.testing.assert_array_equal(rt.dgemm(A, B, moduli="auto"), rt.dgemm(A, B, moduli=s))
    assert G.gemm_moduli(A.T, B, "auto", trans_a="T") == s
    Z, W = GA.zgemm_dataset("uniform", 2, 40, 2)
    assert G.gemm_moduli(Z, W, "fast") == G.moduli_for_bits(40, kind="complex")
    A[0, 0] = np.nan  # non-finite rows do not count
    assert G.gemm_moduli(A, B, "auto") <= s
    with pytest.raises(ValueError, match="moduli"):
        G.gemm_moduli(A, B, 1)
    with pytest.raises(ValueError, match="trans_a"):
        G.gemm_moduli(A, B, trans_a="X")


# ----- the CLI -----------------------------------------------------------------------------------------


def test_cli_table7(capsys, tmp_path):
    path = tmp_path / "t7.json"
    assert main(["accuracy", "gemm", "--table", "7", "--size", "4", "0", "4", "--ks", "64", "--data", "uniform", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    line = [ln for ln in out.splitlines() if ln.startswith("uniform")][0].split()
    assert line[1] == "64" and "[" in line[4]
    assert path.exists() and '"cr100"' in path.read_text()


def test_cli_table8_complex(capsys):
    assert main(["accuracy", "gemm", "--table", "8", "--complex", "--size", "3", "64", "3", "--data", "boundary"]) == 0
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if ln.startswith("boundary")]
    assert [r[1] for r in rows] == ["numpy"] + ["zgemm"] * 7
    assert [r[2] for r in rows[1:4]] == ["default", "fast", "auto"]
    assert all(float(r[-3]) == 100.0 for r in rows[1:4])


def test_cli_bad_gemm_moduli(capsys):
    with pytest.raises(SystemExit):
        main(["accuracy", "gemm", "--gemm-moduli", "many"])
    assert main(["accuracy", "gemm", "--size", "2", "8", "2", "--data", "nope"]) == 2
    assert main(["accuracy", "gemm", "--table", "7", "--complex"]) == 2
    assert "--table 7" in capsys.readouterr().err


def test_table7_uniform_k256_matches_the_paper():
    """[2610.26945] Table 7, U[-1, 1), k = 256: 99.9 % and 100 % correctly rounded from s = 15 (deterministic levels)."""
    r = GA.gemm_thresholds(["uniform"], [256], m=16, n=16, s_min=12)[0]
    assert (r["cr99.9"], r["cr100"]) == r["paper"][1:] == (15, 15)
    assert r["cr100_noext"] == 15 and r["cr100_t"] <= GA.EXTENDED_WIDTH
