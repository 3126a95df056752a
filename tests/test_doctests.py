"""The examples in the public docstrings run and print what they claim."""

import doctest
import importlib

import pytest

MODULES = [
    "rnstensor.arith",
    "rnstensor.arrays",
    "rnstensor.basis",
    "rnstensor.encode",
    "rnstensor.primitives",
    "rnstensor.reference",
    "rnstensor.backends",
    "rnstensor.backends.cpu_gemm",
    "rnstensor.chain",
    "rnstensor.contract",
    "rnstensor.gemm",
    "rnstensor.gemm_accuracy",
    "rnstensor.progress",
    "rnstensor.results",
    "rnstensor.plot",
    "rnstensor.dask",
    "rnstensor.fem.quadrature",
    "rnstensor.fem.tensorbasis",
    "rnstensor.fem.operators",
    "rnstensor.fem.mesh",
    "rnstensor.fem.program",
    "rnstensor.fem.hexmesh",
    "rnstensor.fem.meshop",
    "rnstensor.planner.drops",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
