"""rnstensor.accuracy: the [2610.05059] Sec. 6.2 experiment (Table 2, Table 3 / Fig. 6) and `rnstensor accuracy`."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

import rnstensor as rt
from rnstensor.accuracy import (
    DEPTHS,
    METHOD_LABELS,
    METHODS,
    dataset_seed,
    einsum_chain,
    run_accuracy,
)
from rnstensor.cli import main
from rnstensor.reference import (
    DATASETS,
    chain_operators,
    cycling_axes,
    dataset,
    error_metrics,
    exact_mode_chain,
    round_exact,
)


# the papers' methods at any width: these tests check plans that keep fewer than min_bits bits
plan_any = functools.partial(rt.plan_chain, min_bits=0)

PAPER_B = {3: 27, 4: 21, 5: 17, 6: 14, 7: 12, 8: 10}  # Table 2: NoRescale and Rescale


@pytest.fixture(scope="module")
def uniform_run():
    """Every depth, every method, on a few Uniform tensors (seed 0: the paper's Table 2 operators)."""
    return run_accuracy(depths=DEPTHS, count=6, datasets=("uniform",))


@pytest.fixture(scope="module")
def short_run():
    """d = 3 and 8 on all three datasets: the demo's configuration."""
    return run_accuracy(depths=(3, 8), count=3)


# ----- Table 2 ---------------------------------------------------------------------------------


def test_table2_selected_bits_and_drops(uniform_run):
    plans = uniform_run.plans
    assert list(plans) == list(DEPTHS)
    for d in DEPTHS:
        p = plans[d]
        assert set(p) == {"composed", "norescale", "rescale", "rescale_be"}
        assert p["norescale"]["bits"] == PAPER_B[d], d
        assert p["rescale"]["bits"] == PAPER_B[d], d
        assert p["composed"]["bits"] == 53 and p["rescale_be"]["bits"] == 53
        assert p["norescale"]["drops"] == (0,) * d
        assert p["norescale"]["final_moduli"] == 15 and p["rescale_be"]["final_moduli"] == 15
        # Rescale never restores: it ends on what its drops left, at least one modulus
        assert p["rescale"]["final_moduli"] == 15 - sum(p["rescale"]["drops"]) >= 1
        assert p["rescale"]["drops"][-1] == 0 and len(p["rescale"]["drops"]) == d
        want = (7,) * (d - 1) + (0,) if d <= 7 else (7, 7, 7, 7, 7, 7, 8, 0)
        assert p["rescale_be"]["drops"] == want, d


def test_table2_matches_plan_chain_on_documented_operators():
    # the documented seeding: operators at depth d are d draws from default_rng(seed)
    r = run_accuracy(depths=(5,), count=1, datasets=("uniform",), methods=("rescale",), seed=3)
    g = np.random.default_rng(3)
    ops = [g.uniform(-1, 1, (8, 8)) for _ in range(5)]
    plan = plan_any(ops, (0, 1, 2, 0, 1), method="rescale", planner="greedy")  # the paper's planner
    assert r.plans[5]["rescale"] == {
        "bits": plan.bits, "input_bits": plan.input_bits, "drops": plan.drops, "final_moduli": 15 - sum(plan.drops)
    }


# ----- the paper's qualitative accuracy claims (Fig. 6, Table 3) ------------------------------


def test_rescale_be_float64_accurate_through_depth_7(uniform_run):
    for d in range(3, 8):
        assert uniform_run.error("rescale_be", "uniform", d) <= 1e-15, d
        assert uniform_run.error("rescale_be", "uniform", d, "median") <= 1e-15, d


def test_rescale_be_degrades_at_depth_8(uniform_run):
    # the 8th drop after the 7th product costs accuracy (the paper: 6.7e-14 normwise on Uniform)
    worst_before = max(uniform_run.error("rescale_be", "uniform", d) for d in range(3, 8))
    at8 = uniform_run.error("rescale_be", "uniform", 8)
    assert 10 * worst_before < at8 < 1e-12


def test_composed_and_einsum_stay_at_float64_level(uniform_run, short_run):
    for d in DEPTHS:
        assert uniform_run.error("composed", "uniform", d) <= 8e-16, d
        assert uniform_run.error("einsum", "uniform", d) <= 8e-16, d
    for ds in DATASETS:
        for d in (3, 8):
            assert short_run.error("composed", ds, d) <= 8e-16, (ds, d)
            assert short_run.error("einsum", ds, d) <= 8e-16, (ds, d)


def test_norescale_and_rescale_far_worse(uniform_run, short_run):
    for d in DEPTHS:
        for m in ("norescale", "rescale"):
            assert uniform_run.error(m, "uniform", d) > 1e-10, (m, d)
            assert uniform_run.error(m, "uniform", d, "median") > 1e-10, (m, d)
    for ds in DATASETS:
        for m in ("norescale", "rescale"):
            assert short_run.error(m, ds, 3) > 1e-10 and short_run.error(m, ds, 8) > 1e-4, (m, ds)
        # NoRescale at b = 10: about 1e-3 (paper); Rescale at d = 8 loses everything (paper: 0.42 .. 1.32)
        assert 1e-4 < short_run.error("norescale", ds, 8) < 1e-1, ds
        assert short_run.error("rescale", ds, 8) > 1e-2, ds


def test_rescale_be_on_smooth_and_wide160(short_run):
    for ds in ("smooth", "wide160"):
        assert short_run.error("rescale_be", ds, 3) <= 3e-15, ds
        assert short_run.error("rescale_be", ds, 8) < 1e-11, ds
        assert short_run.error("rescale_be", ds, 3) < 1e-6 * short_run.error("norescale", ds, 3), ds


# ----- the pieces ------------------------------------------------------------------------------


def test_errors_are_against_the_exact_reference():
    """Recompute one cell of the table by hand: plan per tensor, exact chain, Eq. 30-32."""
    r = run_accuracy(depths=(4,), count=2, datasets=("smooth",), methods=("rescale_be", "einsum"), seed=5)
    ops = chain_operators(4, rng=np.random.default_rng(5))
    axes = cycling_axes(4)
    X = dataset("smooth", 2, 8, np.random.default_rng(dataset_seed(5, "smooth")))
    ints, k = exact_mode_chain(X, ops, axes)
    ref = round_exact(ints, k)
    # the table's basis and planner: its runs are as planned (an explicit basis), not the default's certified path
    plan = rt.plan_chain(ops, axes, moduli=15, method="rescale_be", planner="greedy")
    Y = np.stack([plan(X[i]) for i in range(2)])  # one tensor at a time: its own scale
    assert r.errors[("rescale_be", "smooth", 4)] == error_metrics(Y, ref)
    assert r.errors[("einsum", "smooth", 4)] == error_metrics(einsum_chain(X, ops, axes), ref)


def test_persistent_methods_encode_each_tensor_on_its_own():
    """Batch size does not change any bit: the same as running the plan tensor by tensor."""
    ops = chain_operators(5, rng=0)
    axes = cycling_axes(5)
    X = dataset("smooth", 4, 8, rng=2) * np.array([1.0, 2.0**-20, 3.0, 2.0**30])[:, None, None, None]
    for m in ("rescale_be", "rescale", "norescale", "composed"):
        # as planned (an explicit basis): the default certifies the whole call, and a batch takes the basis its
        # hardest tensor needs
        plan = plan_any(ops, axes, moduli=15, method=m)
        whole = plan(X)
        one_by_one = np.stack([plan(X[i]) for i in range(len(X))])
        assert np.array_equal(whole, one_by_one), m
        assert np.array_equal(whole[1:3], plan(X[1:3])), m


def test_einsum_chain_is_float64_chain():
    rng = np.random.default_rng(4)
    X = rng.uniform(-1, 1, (2, 3, 4, 5))
    ops = [rng.uniform(-1, 1, s) for s in [(2, 3), (6, 5), (3, 2)]]
    Y = einsum_chain(X, ops, [0, 2, 0])
    want = X
    for A, ax in zip(ops, [0, 2, 0]):
        want = np.moveaxis(np.tensordot(A, want, axes=([1], [1 + ax])), 0, 1 + ax)
    assert Y.shape == (2, 3, 4, 6)
    np.testing.assert_allclose(Y, want, rtol=1e-12, atol=1e-14)


def test_result_structure_json_and_printing(short_run, tmp_path):
    cfg = short_run.config
    assert cfg["depths"] == [3, 8] and cfg["count"] == 3 and cfg["n"] == 8 and cfg["moduli"] == 15
    assert cfg["datasets"] == list(DATASETS) and cfg["methods"] == list(METHODS)
    assert len(short_run.errors) == len(METHODS) * len(DATASETS) * 2
    path = tmp_path / "acc.json"
    text = short_run.to_json(str(path))
    data = json.loads(path.read_text())
    assert data == json.loads(text)
    assert data["table2"]["8"]["rescale_be"] == {"bits": 53, "input_bits": 53, "drops": [7, 7, 7, 7, 7, 7, 8, 0], "final_moduli": 15}
    rec = [e for e in data["errors"] if (e["method"], e["dataset"], e["depth"]) == ("rescale_be", "wide160", 8)]
    assert len(rec) == 1 and rec[0]["normwise"] == short_run.error("rescale_be", "wide160", 8)
    out = short_run.format()
    assert "Table 2" in out
    for label in METHOD_LABELS.values():
        assert label in out
    for ds in DATASETS:
        assert ds in out
    assert "7 7 7 7 7 7 8 0" in out and "15>4" in out


def test_run_accuracy_bad_arguments():
    for kwargs, word in [
        ({"depths": []}, "depths"),
        ({"depths": [3, 3]}, "depths"),
        ({"depths": [0]}, "depths"),
        ({"count": 0}, "count"),
        ({"datasets": ["normal"]}, "datasets"),
        ({"methods": ["fast"]}, "methods"),
        ({"decode": "fast"}, "decode"),
        ({"seed": -1}, "seed"),
    ]:
        with pytest.raises(ValueError, match=rf"^{word}\b"):
            run_accuracy(**kwargs)
    with pytest.raises(ValueError, match="metric"):
        run_accuracy(depths=[3], count=1, datasets="uniform", methods="einsum").error("einsum", "uniform", 3, "mean")


# ----- the command line ------------------------------------------------------------------------


def test_cli_accuracy(tmp_path, capsys):
    path = tmp_path / "out.json"
    assert main(["accuracy", "--depths", "3,8", "--count", "2", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Table 2" in out and "RescaleBE" in out and "float64 einsum" in out and "d=8" in out
    data = json.loads(path.read_text())
    assert data["config"]["depths"] == [3, 8] and data["config"]["count"] == 2
    assert data["table2"]["3"]["norescale"]["bits"] == 27


def test_cli_accuracy_bad_options(capsys):
    with pytest.raises(SystemExit):
        main(["accuracy", "--depths", "three"])
    assert "--depths" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["accuracy", "--count", "0"])
    assert "--count" in capsys.readouterr().err
    assert main(["accuracy", "--depths", "3", "--count", "1", "--seed", "-1"]) == 2
    assert "seed must be an integer >= 0" in capsys.readouterr().err


def test_cli_demo_includes_short_accuracy_run(capsys):
    assert main(["demo", "--batch", "1", "--accuracy-count", "1"]) == 0
    out = capsys.readouterr().out
    assert "accuracy experiment" in out and "d=3" in out and "d=8" in out and "wide160" in out


def test_cli_accuracy_gemm_prints_table6_rows(capsys):
    assert main(["accuracy", "gemm", "--size", "8", "64", "8", "--gemm-moduli", "16", "auto", "--data", "uniform"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("uniform")]
    assert [r[1] for r in rows] == ["numpy", "dgemm", "dgemm"]
    # with enough moduli (and with 'auto') every entry is correctly rounded: 100 % and at most half an ulp
    for r in rows[1:]:
        assert float(r[-3]) == 100.0 and float(r[-4]) <= 0.5
