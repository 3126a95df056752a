"""The runtime carries the array module its front end found: the executor, the certificate and the tile driver never
ask for it (a host exponent meeting device planes, or the reverse, would otherwise pick the wrong one)."""

from __future__ import annotations

import ast
import importlib
import inspect

import numpy as np
import pytest

import rnstensor as rt

CARRIED = ["rnstensor.program.execute", "rnstensor.program.classical", "rnstensor.run.tiles", "rnstensor.run.groups"]


@pytest.mark.parametrize("name", CARRIED)
def test_runtime_modules_take_the_module_from_their_callers(name):
    tree = ast.parse(inspect.getsource(importlib.import_module(name)))
    asked = [node.lineno for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "array_module"]
    assert not asked, f"{name} asks for the array module at lines {asked}: take it from the caller (xp)"


def test_executor_runs_on_the_module_it_is_handed(monkeypatch):
    # the executor's steps build their arrays with the xp they are handed: a program run with a stand-in module
    # that counts its calls goes through it, and gives numpy's bits
    ex = importlib.import_module("rnstensor.program.execute")
    calls = []

    class Counting:
        def __getattr__(self, attr):
            calls.append(attr)
            return getattr(np, attr)

    rng = np.random.default_rng(2)
    plan = rt.plan_chain([rng.uniform(-1, 1, (4, 5)), rng.uniform(-1, 1, (3, 4))], [0, 1], moduli=15)
    X = rng.uniform(-1, 1, (2, 5, 4))
    want = plan.run(X, "fp64", fused=False)
    real = ex.execute

    def run_counting(program, be, backend_name, xp, **kw):
        assert xp is np
        return real(program, be, backend_name, Counting(), **kw)

    monkeypatch.setattr("rnstensor.chain.execute", run_counting)
    got = plan.run(X, "fp64", fused=False)
    assert calls, "the executor built nothing with the module it was handed"
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))
