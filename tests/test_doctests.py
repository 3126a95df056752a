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
    "rnstensor.run.fusion",
    "rnstensor.run.tiles",
    "rnstensor.run.escalate",
    "rnstensor.backends.cpu.warm",
]


# no IGNORE_EXCEPTION_DETAIL: an example that shows an exception shows the message the code gives
OPTIONFLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=OPTIONFLAGS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0


def test_a_stale_exception_message_fails():
    stale = ">>> int('x')\nTraceback (most recent call last):\n    ...\nValueError: a message the code no longer gives\n"
    test = doctest.DocTestParser().get_doctest(stale, {}, "stale", None, 0)
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS)
    runner.run(test, out=lambda text: None)
    assert runner.summarize(verbose=False).failed == 1
