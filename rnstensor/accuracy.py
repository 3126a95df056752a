"""The accuracy experiment of [2610.05059] Sec. 6.2: Table 2 (plans) and Table 3 / Fig. 6 (errors vs the exact value)."""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from .chain import plan_chain
from .encode import as_basis
from .planner.methods import PLANNERS
from .primitives import DECODE_MODES
from .reference import DATASETS, chain_operators, cycling_axes, dataset, error_metrics, exact_mode_chain, round_exact

__all__ = [
    "DATASETS",
    "METHODS",
    "METHOD_LABELS",
    "DEPTHS",
    "AccuracyResult",
    "run_accuracy",
    "operator_seed",
    "dataset_seed",
    "einsum_chain",
]

#: Every row of the experiment: numpy float64 einsum, then the four residue methods.
METHODS = ("einsum", "composed", "norescale", "rescale", "rescale_be")
#: Printed names, as in the paper (``'einsum'`` is the float64 baseline).
METHOD_LABELS = {
    "einsum": "float64 einsum",
    "composed": "Composed",
    "norescale": "NoRescale",
    "rescale": "Rescale",
    "rescale_be": "RescaleBE",
}
#: The chain depths of [2610.05059] Sec. 6.2.
DEPTHS = (3, 4, 5, 6, 7, 8)
METRICS = ("normwise", "max", "median")
_METRIC_TITLES = {
    "normwise": "normwise relative error  max|Y - Yref| / max|Yref|  (Eq. 30, Fig. 6)",
    "max": "maximum elementwise error  max_i eps_i  (Eq. 31-32, Table 3)",
    "median": "median elementwise error  median_i eps_i  (Eq. 31-32, Table 3)",
}


def operator_seed(seed: int) -> np.random.SeedSequence:
    """The seed of the operators at every depth: ``default_rng(seed)``, restarted per depth.

    So the depth-``d`` operators are the first ``d`` of the depth-8 ones, and
    with ``seed = 0`` they are the operators on which the planner reproduces
    [2610.05059] Table 2.
    """
    return np.random.SeedSequence(seed)


def dataset_seed(seed: int, name: str) -> np.random.SeedSequence:
    """The seed of dataset ``name``: ``SeedSequence([seed, 1 + DATASETS.index(name)])``.

    A stream apart from the operators'; the same tensors at every depth.
    """
    return np.random.SeedSequence([seed, 1 + DATASETS.index(name)])


@dataclass
class AccuracyResult:
    """What :func:`run_accuracy` measured.

    Attributes
    ----------
    config : dict
        ``n``, ``moduli`` (the count ``s``), ``count``, ``seed``, ``depths``,
        ``datasets``, ``methods``, ``decode``, ``backend`` and the seeding rule.
    plans : dict
        ``plans[d][method]`` for every residue method: ``bits`` (the selected
        ``b``, Table 2), ``drops`` (moduli dropped after each product) and
        ``final_moduli`` (moduli held at the end: ``s - sum(drops)`` for
        Rescale, ``s`` for the others, which restore or never drop).
    errors : dict
        ``errors[(method, dataset, d)] = {'normwise', 'max', 'median'}``
        against the exact chain rounded once.
    """

    config: dict
    plans: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)

    def error(self, method: str, dataset: str, depth: int, metric: str = "normwise") -> float:
        """One measured number, e.g. ``result.error('rescale_be', 'uniform', 8)``."""
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}; got {metric!r}")
        key = (method, dataset, int(depth))
        if key not in self.errors:
            raise KeyError(f"no result for method={method!r}, dataset={dataset!r}, depth={depth}")
        return self.errors[key][metric]

    def to_dict(self) -> dict:
        """A JSON-ready dict: ``config``, ``table2`` (per depth and method) and ``errors`` (a list of records)."""
        table2 = {
            str(d): {m: {k: (list(v) if isinstance(v, tuple) else v) for k, v in rec.items()} for m, rec in per.items()}
            for d, per in self.plans.items()
        }
        errors = [
            {"method": m, "dataset": ds, "depth": d, **vals} for (m, ds, d), vals in sorted(
                self.errors.items(), key=lambda kv: (kv[0][2], DATASETS.index(kv[0][1]), METHODS.index(kv[0][0]))
            )
        ]
        return {"config": dict(self.config), "table2": table2, "errors": errors}

    def to_json(self, path: Optional[str] = None, indent: int = 1) -> str:
        """The :meth:`to_dict` data as JSON text; written to ``path`` too when given."""
        text = json.dumps(self.to_dict(), indent=indent)
        if path is not None:
            with open(path, "w") as f:
                f.write(text + "\n")
        return text

    # ----- printing -----------------------------------------------------------------------

    def format_table2(self) -> str:
        """Table 2 of [2610.05059]: the selected ``b`` per method and depth, drop schedules, final modulus counts."""
        cfg = self.config
        depths = list(self.plans)
        methods = [m for m in cfg["methods"] if m != "einsum"]
        head = f"  {'method':<16}" + "".join(f"{'d=' + str(d):>6}" for d in depths)
        lines = [f"Table 2: selected encoding bits b (n = {cfg['n']}, s = {cfg['moduli']})", head]
        if "einsum" in cfg["methods"]:
            lines.append(f"  {METHOD_LABELS['einsum']:<16}" + "".join(f"{'-':>6}" for _ in depths))
        for m in methods:
            lines.append(f"  {METHOD_LABELS[m]:<16}" + "".join(f"{self.plans[d][m]['bits']:>6}" for d in depths))
        if cfg.get("input_bits") is not None:
            for m in methods:
                if m != "composed":
                    lines.append(
                        f"  {METHOD_LABELS[m] + ' input b':<16}"
                        + "".join(f"{self.plans[d][m]['input_bits']:>6}" for d in depths)
                    )
        if "rescale" in methods:
            lines.append(
                f"  {'Rescale moduli':<16}"
                + "".join(f"{str(cfg['moduli']) + '>' + str(self.plans[d]['rescale']['final_moduli']):>6}" for d in depths)
                + "   (initial > final)"
            )
        for m in ("rescale_be", "rescale"):
            if m in methods:
                lines.append(f"  {METHOD_LABELS[m]} drops after each product:")
                for d in depths:
                    lines.append(f"    d={d}: {' '.join(str(g) for g in self.plans[d][m]['drops'])}")
        return "\n".join(lines)

    def format_errors(self, metrics: Sequence[str] = METRICS) -> str:
        """One block per metric: rows = dataset × method, columns = depths."""
        cfg = self.config
        depths = list(cfg["depths"])
        out = []
        for metric in metrics:
            lines = [
                f"{metric}: {_METRIC_TITLES[metric]}",
                f"  {'dataset':<9}{'method':<16}" + "".join(f"{'d=' + str(d):>10}" for d in depths),
            ]
            for ds in cfg["datasets"]:
                for i, m in enumerate(cfg["methods"]):
                    row = f"  {ds if i == 0 else '':<9}{METHOD_LABELS[m]:<16}"
                    row += "".join(f"{self.errors[(m, ds, d)][metric]:>10.2e}" for d in depths)
                    lines.append(row)
            out.append("\n".join(lines))
        return "\n\n".join(out)

    def format(self) -> str:
        """Table 2 and every error table, as :command:`rnstensor accuracy` prints them."""
        cfg = self.config
        head = (
            f"[2610.05059] accuracy experiment: n = {cfg['n']}, s = {cfg['moduli']}, {cfg['count']} tensors per dataset, "
            f"axes {', '.join(str(a) for a in cycling_axes(max(cfg['depths'])))} (the paper's modes 1, 2, 3, ...), "
            f"seed {cfg['seed']}, "
            f"decode '{cfg['decode']}', planner '{cfg['planner']}', backend '{cfg['backend']}'\n"
            f"reference: the exact chain on the float64 inputs (Python ints), rounded once to float64"
        )
        return "\n\n".join([head, self.format_table2(), self.format_errors()])


# ----- running ----------------------------------------------------------------------------------


def einsum_chain(X: np.ndarray, operators: Sequence[np.ndarray], axes: Sequence[int], ndim: int = 3) -> np.ndarray:
    """The float64 baseline: one ``numpy.einsum`` per mode product (batch axes leading), rounded at every product.

    ``optimize=True`` lets numpy hand each product to BLAS (about 2.5x faster
    than its plain loops at n = 8): the fastest float64 einsum, the honest yardstick.
    """
    letters = "abcdefghijklmnopqrstuvwxyz"
    Y = np.asarray(X, dtype=np.float64)
    batch = Y.ndim - ndim
    for A, ax in zip(operators, axes):
        src = list(letters[: Y.ndim])
        dst = list(src)
        dst[batch + ax] = "Z"
        Y = np.einsum(f"Z{src[batch + ax]},{''.join(src)}->{''.join(dst)}", A, Y, optimize=True)
    return Y


def _check_names(values, allowed: tuple, name: str) -> tuple:
    if isinstance(values, str):
        values = (values,)
    values = tuple(values)
    if not values:
        raise ValueError(f"{name} is empty; choose from {allowed}")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ValueError(f"{name} has unknown entries {bad}; choose from {allowed}")
    return values


def _check_int(value, name: str, low: int) -> int:
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer >= {low}; got {value!r}") from None
    if isinstance(value, bool) or v < low:
        raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
    return v


def run_accuracy(
    depths: Sequence[int] = DEPTHS,
    count: int = 32,
    *,
    n: int = 8,
    moduli: int = 15,
    seed: int = 0,
    datasets: Sequence[str] = DATASETS,
    methods: Sequence[str] = METHODS,
    decode: str = "fp64",
    planner: str = "greedy",
    input_bits: Optional[object] = None,
    backend: Optional[str] = None,
    progress: Optional[Callable[[str], None]] = None,
) -> AccuracyResult:
    """Run the accuracy experiment of [2610.05059] Sec. 6.2 (Table 2, Table 3 and Fig. 6).

    For every depth ``d``: ``d`` operators ``n × n`` U[-1, 1) from
    ``default_rng(seed)`` (the same for every dataset; see
    :func:`operator_seed`), modes cycling ``0, 1, 2, 0, ...``, one plan per
    residue method on ``Basis.int8(moduli)``. For every dataset: ``count``
    tensors from :func:`rnstensor.reference.dataset` seeded by
    :func:`dataset_seed` (the same tensors at every depth). Every method's
    result is compared with the exact chain (Python ints) rounded once to
    float64, by the metrics of Sec. 6.2.2.

    The persistent methods encode each tensor with its own exponent (one
    scale per tensor, as in the paper), so the results do not depend on how
    many tensors share a batch; Composed encodes per fiber at every product.

    Parameters
    ----------
    depths : sequence of int
        Chain depths (default 3..8).
    count : int
        Tensors per dataset (the paper: 32).
    n : int
        Mode size (the paper: 8).
    moduli : int
        Number of INT8 moduli ``s`` (the paper: 15).
    seed : int
        Master seed (default 0: the seed on which Table 2 is reproduced).
    datasets : sequence of str
        Subset of ``('uniform', 'smooth', 'wide160')``.
    methods : sequence of str
        Subset of :data:`METHODS`.
    decode : {'fp64', 'exact'}
        Decode of the residue methods (the paper measures ``'fp64'``).
    planner : {'greedy', 'optimal'}
        Drop planner of Rescale and RescaleBE (the paper: ``'greedy'``, Alg. 2).
    input_bits : int or 'max', optional
        Input encoding width of the persistent methods (default: their ``b``);
        ``'max'`` is the widest each plan's range checks allow.
    backend : str, optional
        Residue backend (default: the current one).
    progress : callable, optional
        Called with a short line after each depth and dataset.

    Returns
    -------
    AccuracyResult

    Examples
    --------
    >>> r = run_accuracy(depths=[3], count=2, datasets=["uniform"])
    >>> r.plans[3]["rescale_be"]["bits"], r.plans[3]["rescale_be"]["drops"]
    (53, (7, 7, 0))
    >>> r.error("rescale_be", "uniform", 3) < 1e-15
    True
    """
    if isinstance(depths, (int, np.integer)):
        depths = [depths]
    depths = [_check_int(d, "depths", 1) for d in depths]
    if not depths:
        raise ValueError("depths is empty; give at least one chain depth (e.g. 3..8)")
    if len(set(depths)) != len(depths):
        raise ValueError(f"depths has repeated entries: {depths}")
    count = _check_int(count, "count", 1)
    n = _check_int(n, "n", 1)
    seed = _check_int(seed, "seed", 0)
    basis = as_basis(_check_int(moduli, "moduli", 1), "moduli")
    datasets = _check_names(datasets, DATASETS, "datasets")
    methods = _check_names(methods, METHODS, "methods")
    if decode not in DECODE_MODES:
        raise ValueError(f"decode must be one of {DECODE_MODES}; got {decode!r}")
    if planner not in PLANNERS:
        raise ValueError(f"planner must be one of {PLANNERS}; got {planner!r}")
    from .backends import get_backend

    config = {
        "n": n,
        "moduli": len(basis),
        "count": count,
        "seed": seed,
        "depths": depths,
        "datasets": list(datasets),
        "methods": list(methods),
        "decode": decode,
        "planner": planner,
        "input_bits": input_bits,
        "backend": get_backend(backend).name,
        "seeding": "operators at depth d: numpy default_rng(seed), d draws of uniform(-1, 1, (n, n)); "
        "dataset k (0 uniform, 1 smooth, 2 wide160): default_rng(SeedSequence([seed, 1 + k])), same tensors at every depth",
    }
    result = AccuracyResult(config)
    inputs = {name: dataset(name, count, n, np.random.default_rng(dataset_seed(seed, name))) for name in datasets}
    residue_methods = [m for m in methods if m != "einsum"]
    for d in depths:
        ops = chain_operators(d, n, np.random.default_rng(operator_seed(seed)))
        axes = cycling_axes(d)
        plans = {
            m: plan_chain(
                ops, axes, moduli=basis, method=m, planner=planner, ndim=3,
                input_bits=None if m == "composed" else input_bits,
                min_bits=0,  # the experiment reports every method's plan, however few bits it keeps
            )
            for m in residue_methods
        }
        result.plans[d] = {
            m: {
                "bits": p.bits,
                "input_bits": p.input_bits,
                "drops": tuple(p.drops),
                "final_moduli": len(basis) - (sum(p.drops) if m == "rescale" else 0),
            }
            for m, p in plans.items()
        }
        for name in datasets:
            X = inputs[name]
            ints, k = exact_mode_chain(X, ops, axes, ndim=3)
            ref = round_exact(ints, k)
            for m in methods:
                Y = einsum_chain(X, ops, axes) if m == "einsum" else plans[m].run(X, decode=decode, backend=backend)
                result.errors[(m, name, d)] = error_metrics(Y, ref)
            if progress is not None:
                nw = ", ".join(f"{METHOD_LABELS[m]} {result.errors[(m, name, d)]['normwise']:.1e}" for m in methods)
                progress(f"d={d} {name}: {nw}")
    return result
