"""The parts of ``rnstensor demo``: the chain one primitive at a time, its first run timed apart, the default's errors."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Optional, Sequence

import numpy as np

__all__ = ["chain_report", "default_plan_errors", "format_default_errors", "greedy_drops", "residue_chain",
           "timed_compiles", "timed_line", "warm_up_line"]


def greedy_drops(bound: int, active: Sequence[int], bits: int) -> int:
    """How many smallest moduli to drop so the bound falls back to about ``2**bits`` ([2610.05059] Alg. 2 rule)."""
    act, g = sorted(active), 0
    while len(act) > 1 and bound // act[0] >= (1 << bits):
        q = act.pop(0)
        bound = bound // q + 1
        g += 1
    return g


def residue_chain(X, ops, axes, basis, bits: int, step: Optional[Callable] = None):
    """The demo's chain, one primitive at a time: ``(decode 'fp64', decode 'exact')`` of the final tensor.

    Encode once; per operator, fold a revisited axis's pending scale, encode
    the operator and take the mode product; between products drop as the
    paper's Alg. 2 does and extend back to the whole basis. ``step(label, T)``
    sees the tensor after each primitive (the demo's table).
    """
    from . import base_extend, decode, drop, encode, fold_pending, mode_product

    step = step or (lambda label, T: None)
    T = encode(X, basis, bits=bits)
    step(f"encode (b = {bits}, one exponent)", T)
    for i, (A, ax) in enumerate(zip(ops, axes)):
        A_eff, T = fold_pending(T, A, ax)  # a revisited axis: its pending row scales go into A's columns
        op = encode(A_eff, basis, bits=bits, shared_axes=(1,))
        T = mode_product(T, op, ax)
        note = " (pending scale folded)" if A_eff is not A else ""
        step(f"mode product {i + 1}, axis {ax}{note}", T)
        if i < len(axes) - 1:
            g = greedy_drops(T.bound, T.active, bits)
            T = drop(T, g)
            step(f"drop {g} smallest moduli (RnsDrop)", T)
            T = base_extend(T)
            step("base extension (MRC digits)", T)
    return decode(T, mode="fp64"), decode(T, mode="exact")


def timed_compiles(run: Callable[[], object]) -> tuple[float, Optional[int]]:
    """``(seconds, functions numba compiled)`` of one call of ``run`` (the count is None without numba's events).

    numba announces every compilation as a ``numba:compile`` event and sends
    none for a function it loads from its on-disk cache: the count tells a
    cold cache from a warm one where the time alone cannot on a busy machine.
    """
    try:
        from numba.core.event import install_recorder
    except ImportError:  # no numba (the 'numpy' backend): nothing compiles
        recorder = contextlib.nullcontext(None)
    else:
        recorder = install_recorder("numba:compile")
    t0 = time.perf_counter()
    with recorder as events:
        run()
    seconds = time.perf_counter() - t0
    return seconds, None if events is None else sum(1 for _, ev in events.buffer if ev.is_start)


def warm_up_line(backend: str, seconds: float, compiled: Optional[int], routed: bool = False) -> str:
    """What the demo's first (untimed) run of the chain did: compile the CPU kernels, load them from the cache,
    (``routed``) run NumPy's reference paths while they are cold (:mod:`rnstensor.backends.cpu.warm`), or both."""
    if backend != "cpu":
        return f"first run on the '{backend}' backend (kernels loaded or built; not in the time below): {seconds:.1f} s"
    if routed:  # (a call this small does not compile the kernels; a large one, or small ones adding up, would)
        also = f", {compiled} numba compilations" if compiled else ""
        return (f"first run on NumPy's reference paths where the CPU kernels are not compiled (the same bits{also}): "
                f"{seconds:.1f} s\n  ('rnstensor demo --compile' compiles them all, once: about 15 s on 2 cores)")
    if compiled or (compiled is None and seconds > 2.0):
        return f"compiling the CPU kernels (first run only, cached afterwards): {seconds:.1f} s"
    return f"CPU kernels loaded from the cache: {seconds:.1f} s"


def timed_line(backend: str, seconds: float, compiled: Optional[int], routed: bool) -> str:
    """What the demo's timed run of the chain took, and what ran: loaded kernels, NumPy's reference paths where
    the kernels are not compiled (``routed``), and any compile that happened inside it (``compiled``)."""
    how = ["NumPy's reference paths where the kernels are not compiled" if routed else "kernels already loaded"]
    if compiled:
        how.append(f"{compiled} numba compilations included")
    return f"residue chain took {seconds * 1e3:.1f} ms on the '{backend}' backend ({'; '.join(how)})"


def chain_report(X, ops, axes, basis, bits: int, backend: str) -> dict:
    """The demo's timed chain: its steps printed as they run (moduli, log2 bound and range), its time and what ran,
    and its errors beside numpy's float64 chain against the exact value; returns them as the demo's record."""
    from .backends.cpu import warm  # noqa: PLC0415
    from .reference import exact_mode_chain, round_exact  # noqa: PLC0415

    steps: list[dict] = []
    print(f"  {'step':<46} {'moduli':>6} {'log2 bound':>11} {'log2 range':>11}")

    def row(label, T):
        steps.append({"step": label, "moduli": len(T.active), "log2_bound": T.log2_bound, "log2_range": T.log2_range})
        print(f"  {label:<46} {len(T.active):>6} {T.log2_bound:>11.1f} {T.log2_range:>11.1f}")

    decoded = {}

    def timed_chain():
        decoded["fp64"], decoded["exact"] = residue_chain(X, ops, axes, basis, bits, step=row)

    routed = warm.routed()
    elapsed, compiled_while_timed = timed_compiles(timed_chain)
    on_reference = warm.routed() > routed
    Y64 = X
    for A, ax in zip(ops, axes):
        Y64 = np.moveaxis(np.tensordot(A, Y64, axes=([1], [ax])), 0, ax)
    Yex = round_exact(*exact_mode_chain(X, ops, axes))

    print(f"\n  {timed_line(backend, elapsed, compiled_while_timed, on_reference)}\n")
    print(f"  {'result vs the exact value':<46} {'normwise':>11} {'max elementwise':>16}")
    errors = []
    for label, Z in (("rnstensor, decode='fp64'", decoded["fp64"]), ("rnstensor, decode='exact'", decoded["exact"]),
                     ("numpy float64 tensordot chain", Y64)):
        nw = float(np.linalg.norm(Z - Yex) / np.linalg.norm(Yex))
        mx = float(np.max(np.abs(Z - Yex) / np.abs(Yex)))
        errors.append({"result": label, "normwise": nw, "max": mx})
        print(f"  {label:<46} {nw:11.2e} {mx:16.2e}")
    print(
        "\n  The residue chain rounds only at the encode, at each drop (by design, ~2^-53 of the bound)"
        "\n  and at the decode; every product in between is exact integer arithmetic."
    )
    return {"steps": steps, "errors": errors, "seconds": elapsed, "accuracy": None, "default_accuracy": None,
            "compiled_while_timed": compiled_while_timed, "reference_paths": on_reference}


def default_plan_errors(result) -> list[dict]:
    """The default plan's errors on the data of ``result`` (a :func:`rnstensor.accuracy.run_accuracy` run), beside numpy's.

    The same operators and tensors (the same seeds), planned as a user's
    ``rt.plan_chain(ops, axes)`` is: ``moduli=None``, every result certified
    to the classical float64 bound. One record per depth and dataset:
    ``depth``, ``dataset``, ``default`` and ``numpy`` (the error metrics of
    :func:`rnstensor.reference.error_metrics`) and ``ran_as`` (the plan's
    ``last_evaluation``).
    """
    from .accuracy import dataset_seed, operator_seed
    from .chain import plan_chain
    from .reference import chain_operators, cycling_axes, dataset, error_metrics, exact_mode_chain, round_exact

    cfg = result.config
    n, count, seed = cfg["n"], cfg["count"], cfg["seed"]
    inputs = {name: dataset(name, count, n, np.random.default_rng(dataset_seed(seed, name))) for name in cfg["datasets"]}
    rows = []
    for d in cfg["depths"]:
        ops = chain_operators(d, n, np.random.default_rng(operator_seed(seed)))
        axes = cycling_axes(d)
        plan = plan_chain(ops, axes, ndim=3)  # no moduli=: the default, as a user writes it
        for name, X in inputs.items():
            ref = round_exact(*exact_mode_chain(X, ops, axes, ndim=3))
            errors = error_metrics(plan(X), ref)
            rows.append({"depth": d, "dataset": name, "default": errors, "ran_as": plan.last_evaluation,
                         "numpy": dict(result.errors[("einsum", name, d)])})
    return rows


def format_default_errors(rows: Sequence[dict]) -> str:
    """The default plan's errors beside numpy's float64 chain, a line per depth and dataset."""
    lines = [
        "The default, rt.plan_chain(ops, axes) (moduli=None: every result certified to the classical float64 bound),",
        "on the same operators and tensors, against the same exact reference:",
        f"  {'':<16}{'normwise error':^21}   {'max elementwise error':^21}",
        f"  {'dataset':<9}{'depth':<7}{'default':>10} {'numpy':>10}   {'default':>10} {'numpy':>10}   ran as",
    ]
    for r in rows:
        de, ne = r["default"], r["numpy"]
        lines.append(
            f"  {r['dataset']:<9}{'d=' + str(r['depth']):<7}{de['normwise']:>10.2e} {ne['normwise']:>10.2e}   "
            f"{de['max']:>10.2e} {ne['max']:>10.2e}   {r['ran_as']}"
        )
    lines.append(
        "\n  The default holds every entry within the classical float64 error bound, the bound numpy's float64 chain"
        "\n  is held to; the greedy drops above are not held to it and lose digits as the chain deepens."
    )
    return "\n".join(lines)
