"""The cold-start routing of the CPU backend (rnstensor.backends.cpu.warm): small calls on cold kernels take the
reference paths, with the same bits, and compile nothing heavy."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rnstensor as rt
from rnstensor.backends.cpu import backend as cpu_backend
from rnstensor.backends.cpu import magnitudes, warm
from rnstensor.fem import MassOperator, PoissonOperator, TensorBasis, box_mesh

from oracle import assert_bits_equal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Kernel:
    """A stand-in dispatcher: its compiled signatures and the index file of its disk cache."""

    def __init__(self, index_path: str, signatures=()):
        self.signatures = list(signatures)
        self._cache = type("C", (), {"_cache_file": type("F", (), {"_index_path": index_path})()})()


@pytest.fixture
def routing(monkeypatch):
    monkeypatch.setitem(warm._state, "enabled", True)
    monkeypatch.setattr(warm, "_spent", {})
    monkeypatch.setattr(warm, "_cached", {})


def test_warm_routes_small_calls_of_cold_kernels_only(routing, tmp_path):
    cold = _Kernel(str(tmp_path / "none.nbi"))
    small = warm.COLD_WORK_MAX
    # each routed call is charged its reference time's estimate; the first call past COLD_SECONDS compiles
    charge = warm.REFERENCE_CALL_S + small * warm.REFERENCE_ENTRY_S
    rented = math.ceil(warm.COLD_SECONDS / charge)
    before = warm.routed()
    assert [warm.warm(cold, small) for _ in range(rented)] == [False] * rented
    assert warm.routed() == before + rented
    assert warm.warm(cold, small)  # the next small call compiles it: a loop of small calls then runs compiled
    tiny = _Kernel(str(tmp_path / "none.nbi"))
    assert [warm.warm(tiny, 1) for _ in range(100)] == [False] * 100  # 100 tiny calls cost less than a compile
    before = dict(warm._spent)
    assert not warm.warm(tiny, 1, charge=False) and warm._spent == before  # a question ahead of the call: no charge
    # a dearer reference (the caller's estimate): 0.1 s so far, then 0.6 s, then 1.1 s charged: the third compiles
    assert [warm.warm(tiny, 1, call_s=warm.COLD_SECONDS / 2) for _ in range(3)] == [False, False, True]
    assert warm.warm(_Kernel(str(tmp_path / "none.nbi")), small + 1)  # a large call compiles at once
    assert warm.warm(_Kernel(str(tmp_path / "none.nbi"), ["sig"]), 1)  # compiled in this process
    (tmp_path / "on_disk.nbi").write_text("")
    assert warm.warm(_Kernel(str(tmp_path / "on_disk.nbi")), 1)  # numba's cache holds it: a load, not a compile
    assert warm.warm(object.__new__(type("NoCache", (), {"signatures": []})), 1)  # no cache to ask: as before
    warm.enabled(False)
    assert warm.warm(_Kernel(str(tmp_path / "none.nbi")), 1)


def _cases():
    rng = np.random.default_rng(7)
    a, b = rng.uniform(-1, 1, (12, 40)), rng.uniform(-1, 1, (40, 9)) * 2.0 ** rng.integers(-30, 30, (40, 1))
    sq = rng.uniform(-1, 1, (64, 64))
    ops = [rng.uniform(-1, 1, (6, 6)) for _ in range(3)]
    X = rng.standard_normal((5, 6, 6, 6)) * np.exp2(rng.integers(-40, 40, (5, 1, 1, 1)))
    wide = [rng.uniform(-1, 1, (5, 200))]
    g = rng.standard_normal((5, 5, 5, 5)) * np.exp(rng.uniform(-10, 0, (5, 5, 5, 5)))
    C = rng.standard_normal((5, 5))
    basis = TensorBasis(3)
    mesh = box_mesh(basis, shape=(2, 2, 1), curved=0.1)
    u = rng.uniform(-1, 1, (mesh.nelem, 3, 3, 3))
    return {
        "dgemm": lambda: rt.dgemm(a, b, alpha=0.5),
        "dgemm wide engine": lambda: rt.dgemm(sq, sq.T),
        "dgemm auto beta": lambda: rt.dgemm(a, b, a @ b, beta=-0.25, moduli="auto"),
        "zgemm": lambda: rt.zgemm(a + 1j * a[::-1], b - 0.5j * b),
        "einsum": lambda: rt.einsum("pqrs,pi,qj,rk,sl->ijkl", g, C, C, C, C),
        "einsum exact": lambda: rt.einsum("ij,jk->ik", a[:, :9], a[:9], moduli=15, decode="exact"),
        "chain": lambda: rt.plan_chain(ops, [0, 1, 2]).run(X),
        "chain fp64 exact": lambda: rt.plan_chain(ops, [0, 1, 2], moduli=15).run(X, "exact"),
        "chain auto": lambda: rt.plan_chain(ops, [0, 1, 2], moduli="auto").run(X),
        "chain wide operator": lambda: rt.plan_chain(wide, [0], moduli=15).run(rng.uniform(-1, 1, (3, 200))),
        "mass": lambda: MassOperator(basis, mesh.qdata).apply(u),
        "poisson exact": lambda: PoissonOperator(basis, mesh.G).apply(u, "exact"),
    }


def test_every_reference_path_gives_the_compiled_bits(monkeypatch):
    # every kernel cold (the backend's primitives, the wide GEMM engine, the fused interpreter, the chain statistics):
    # each call takes the reference paths, and its bits are the compiled paths'
    want = {name: fn() for name, fn in _cases().items()}
    calls = []
    monkeypatch.setattr(cpu_backend, "warm", lambda kernel, work, call_s=None, charge=True: calls.append(kernel) and False)
    monkeypatch.setattr(magnitudes, "warm", lambda kernel, work: calls.append(kernel) and False)
    for name, fn in _cases().items():
        got = np.asarray(fn())
        if got.dtype.kind == "c":  # each part's bits
            got, want[name] = got.view(np.float64), np.asarray(want[name]).view(np.float64)
        assert_bits_equal(got, want[name])
    from rnstensor.backends.cpu import decoding, drop_extend, encoding, fused, products, wide

    routed = set(calls)
    for kernel in (encoding._encode_kernel, products._product_direct, products._elementwise, drop_extend._drop_extend_kernel,
                   decoding._decode_fp64_kernel, decoding._decode_exact_kernel, wide._wide_decode, fused._chain_blocks,
                   magnitudes._chain_magnitude_stats_kernel):
        assert kernel in routed, kernel


#: the first calls of a new user, as source: run in a fresh process and in this one
_FIRST_CALLS = """
rng = np.random.default_rng(0)
a = rng.uniform(-1, 1, (64, 64))
ops = [rng.uniform(-1, 1, (8, 8)) for _ in range(3)]
X = rng.uniform(-1, 1, (16, 8, 8, 8))
out = {"einsum": rt.einsum("ij,jk->ik", a[:8, :8], a[:8, :8]), "dgemm": rt.dgemm(a, a),
       "chain": rt.plan_chain(ops, [0, 1, 2])(X)}
"""


def test_a_cold_process_compiles_nothing_heavy(tmp_path):
    # a fresh process, an empty numba cache: einsum, dgemm and a chain plan's default run without compiling the
    # products, decodes, the fused interpreter, the wide engine or the chain statistics, with the bits of this
    # process; then the Quickstart's demo (its accuracy runs too) compiles none of them either
    script = "import json, sys\nimport numpy as np, rnstensor as rt\n" + _FIRST_CALLS + textwrap.dedent("""
        import contextlib, io
        from rnstensor.backends.cpu import decoding, drop_extend, fused, magnitudes, products, wide
        from rnstensor.cli import main
        heavy = [products._product_direct, decoding._decode_fp64_kernel, fused._chain_blocks, wide._wide_decode,
                 magnitudes._chain_magnitude_stats_kernel]
        compiled = [k.py_func.__name__ for k in heavy if k.signatures]
        demo = io.StringIO()
        with contextlib.redirect_stdout(demo):
            main(["demo", "--batch", "2", "--accuracy-count", "1"])
        heavy += [decoding._decode_exact_kernel, drop_extend._drop_extend_kernel]
        json.dump({"bits": {k: v.tobytes().hex() for k, v in out.items()}, "compiled": compiled,
                   "demo": demo.getvalue(), "demo compiled": [k.py_func.__name__ for k in heavy if k.signatures]},
                  sys.stdout)
    """)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), RNSTENSOR_COLD_START="1", PYTHONPATH=ROOT)
    got = json.loads(subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True,
                                    text=True, timeout=600).stdout)
    assert got["compiled"] == [] and got["demo compiled"] == []
    assert "residue chain took" in got["demo"] and "(NumPy's reference paths where the kernels are not compiled)" in got["demo"]
    here = {"np": np, "rt": rt}
    exec(_FIRST_CALLS, here)  # noqa: S102 - the same source, compiled kernels (routing off in the tests)
    assert got["bits"] == {k: v.tobytes().hex() for k, v in here["out"].items()}
