"""The figure of each ``--json`` result (``rnstensor plot``): matplotlib's Agg canvas, one drawing function per kind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Union

__all__ = ["FIGURES", "plot_result", "figure_of"]

#: The one message for a missing matplotlib.
_NEEDS = "rnstensor plot needs matplotlib: pip install 'rnstensor[plot]'"


def _new_figure(ncols: int, width: float = 5.0, height: float = 4.0, **kw):
    """A figure on the Agg canvas (no pyplot, no GUI backend, nothing global changed) with ``ncols`` axes."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(_NEEDS) from exc
    fig = Figure(figsize=(width * ncols, height))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False, **kw)[0]
    return fig, list(axes)


def _moduli_axis(ax) -> None:
    """An x axis of moduli counts: integer ticks only."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("moduli s")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _axes(ax, xlabel: str, ylabel: str, title: str = "", logx: bool = True, logy: bool = True) -> None:
    """The usual log-log axes of a timing against a size: labels, a small title, the legend."""
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend()


def _log(v: float) -> float:
    """``v`` where a log axis can show it; NaN (not drawn) for an exact 0, which would squash the axis to 1e-300."""
    return v if v > 0 else float("nan")


def _bars(ax, labels: list, series: dict, ylabel: str, title: str = "", logy: bool = True, rotation: int = 0) -> None:
    """Grouped bars: a group per label, in it a bar per series (``name -> values``), and the legend."""
    import numpy as np

    x = np.arange(len(labels))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, [_log(v) if logy else v for v in values], width, label=name)
    if rotation:
        ax.set_xticks(x, labels, rotation=rotation, ha="right", fontsize=7)
    else:
        ax.set_xticks(x, labels)
    _axes(ax, "", ylabel, title, logx=False, logy=logy)


def _machine(record: dict) -> str:
    m = record.get("machine") or {}
    return f"{m.get('cpu', '?')}, {m.get('cpus', '?')} cores, {m.get('date', '?')[:10]}"


# ----- the figures, one per kind ----------------------------------------------------------------------


def _chain_accuracy(record: dict):
    """[2610.05059] Fig. 6: normwise error against chain depth, one panel per dataset, one line per method."""
    from .accuracy import METHOD_LABELS

    cfg = record["config"]
    fig, axes = _new_figure(len(cfg["datasets"]), sharey=True)
    for ax, ds in zip(axes, cfg["datasets"]):
        for m in cfg["methods"]:
            pts = sorted((e["depth"], e["normwise"]) for e in record["errors"]
                         if e["method"] == m and e["dataset"] == ds)
            ax.plot([d for d, _ in pts], [_log(v) for _, v in pts], "o-", label=METHOD_LABELS.get(m, m))
        ax.axhline(2.0**-53, color="gray", ls=":", lw=1, label="u = 2^-53")
        ax.set_yscale("log")
        ax.set_xticks(cfg["depths"])
        ax.set_xlabel("chain depth d")
        ax.set_title(f"{ds} (n = {cfg['n']}, s = {cfg['moduli']}, {cfg['count']} tensors)")
    axes[0].set_ylabel("normwise relative error")
    axes[0].legend(fontsize=8)
    return fig


def _demo(record: dict):
    """The demo's steps: log2 of the bound and of the range at each step, and the moduli held."""
    steps = record["steps"]
    fig, (a1, a2) = _new_figure(2, width=6.0)
    x = list(range(len(steps)))
    a1.plot(x, [s["log2_bound"] for s in steps], "o-", label="log2 bound")
    a1.plot(x, [s["log2_range"] for s in steps], "s-", label="log2 range")
    a1.set_xticks(x, [s["step"].split(" (")[0] for s in steps], rotation=60, ha="right", fontsize=7)
    a1.set_ylabel("bits")
    a1.legend()
    a1.set_title("encode -> products -> drops -> base extensions")
    a2.bar(x, [s["moduli"] for s in steps])
    a2.set_xticks(x, [str(i) for i in x])
    a2.set_xlabel("step")
    a2.set_ylabel("active moduli")
    return fig


def _info(record: dict):
    """The INT8 bases: log2 of the moduli product against the number of moduli s."""
    fig, (ax,) = _new_figure(1)
    ax.plot([b["s"] for b in record["bases"]], [b["log2_product"] for b in record["bases"]], "o-")
    _moduli_axis(ax)
    ax.set_ylabel("log2 P")
    ax.set_title(f"rnstensor {record.get('version', '')}: INT8 basis ranges")
    return fig


def _gemm_accuracy(record: dict):
    """[2610.26945] Tables 6 / 8: componentwise error and CR % against s, one line per data set, numpy dashed."""
    rows = record["rows"]
    fig, (a1, a2) = _new_figure(2)

    def val(r, key):
        return r[key] if key == "cr_percent" else _log(r[key])

    names = list(dict.fromkeys(r["data"] for r in rows))
    for i, name in enumerate(names):
        color = f"C{i}"
        mine = [r for r in rows if r["data"] == name]
        swept = sorted((r for r in mine if r["method"] != "numpy" and str(r["moduli"]).isdigit()), key=lambda r: r["s"])
        named = [r for r in mine if r["method"] != "numpy" and not str(r["moduli"]).isdigit()]
        for ax, key in ((a1, "componentwise"), (a2, "cr_percent")):
            ax.plot([r["s"] for r in swept], [val(r, key) for r in swept], "o-", color=color, label=name)
            at: dict = {}  # 'auto', 'default', 'fast': a marker at the s each chose, one label where they coincide
            for r in named:
                at.setdefault(r["s"], (val(r, key), []))[1].append(str(r["moduli"]))
            for s_, (v, names_) in at.items():
                ax.plot([s_], [v], "D", color=color, mfc="none")
                ax.annotate("/".join(names_), (s_, v), fontsize=7)
            for r in mine:
                if r["method"] == "numpy":
                    ax.axhline(val(r, key), color=color, ls="--", lw=1)
    method = next((r["method"] for r in rows if r["method"] != "numpy"), "dgemm")
    a1.set_yscale("log")
    a1.set_ylabel("max componentwise error")
    a2.set_ylabel("correctly rounded %")
    for ax in (a1, a2):
        _moduli_axis(ax)
    p = record.get("params", {})
    size = " x ".join(str(v) for v in p.get("size", ()))
    a1.set_title(f"{method} (dashed: numpy float64) {size}")
    a1.legend(fontsize=8)
    return fig


def _gemm_thresholds(record: dict):
    """[2610.26945] Table 7: the scans, componentwise error and CR % against s per data set and k."""
    fig, (a1, a2) = _new_figure(2)
    for i, r in enumerate(record["rows"]):
        color, scan = f"C{i % 10}", r["scan"]
        label = f"{r['data']} k={r['k']}"
        a1.plot([p["s"] for p in scan], [_log(p["componentwise"]) for p in scan], "o-", color=color, label=label)
        a1.axhline(_log(r["numpy"]["componentwise"]), color=color, ls="--", lw=1)
        a2.plot([p["s"] for p in scan], [p["cr_percent"] for p in scan], "o-", color=color, label=label)
    a1.axhline(2.0**-53, color="gray", ls=":", lw=1)
    a1.set_yscale("log")
    a1.set_ylabel("max componentwise error (dashed: numpy)")
    a2.set_ylabel("correctly rounded %")
    for ax in (a1, a2):
        _moduli_axis(ax)
    a1.set_title("dgemm: smallest s per accuracy level")
    a1.legend(fontsize=8)
    return fig


_CHAIN_METHODS = (
    ("einsum", "numpy float64 einsum"), ("rescale_be", "RescaleBE (residue)"), ("composed", "Composed (residue)")
)


def _chain_throughput(record: dict):
    """benchmarks/bench_chain.py: GDoF/s against n per method, and RescaleBE's time split into phases."""
    import numpy as np

    rows = record["rows"]
    fig, (a1, a2) = _new_figure(2)
    ns = [r["n"] for r in rows]
    for key, label in _CHAIN_METHODS:
        a1.plot(ns, [r["gdofs"][key] for r in rows], "o-", label=label)
    _axes(a1, "mode size n", "GDoF/s", f"d = 3, s = {record['params'].get('s')}; {_machine(record)}", logy=False)
    bottom = np.zeros(len(rows))
    for key in ("encode", "products", "drop_extend", "decode"):
        vals = np.array([r["phases"][key] / sum(r["phases"].values()) for r in rows])
        a2.bar([str(n) for n in ns], vals, bottom=bottom, label=key)
        bottom += vals
    a2.set_xlabel("mode size n")
    a2.set_ylabel("share of RescaleBE time")
    a2.legend()
    return fig


def _fem_throughput(record: dict):
    """benchmarks/bench_fem.py: GDoF/s against the degree p, mass and Poisson operators."""
    rows = record["rows"]
    fig, axes = _new_figure(2, sharey=True)
    for ax, kind in zip(axes, ("mass", "poisson")):
        sel = [r for r in rows if r["kind"] == kind]
        for key, label in _CHAIN_METHODS:
            ax.plot([r["p"] for r in sel], [r["gdofs"][key] for r in sel], "o-", label=label)
        ax.set_yscale("log")
        ax.set_xlabel("polynomial degree p")
        ax.set_title(f"{kind} operator, 3-D, s = {record['params'].get('s')}", fontsize=9)
    axes[0].set_ylabel(f"GDoF/s (global nodes); {_machine(record)}", fontsize=8)
    axes[0].legend()
    return fig


def _gemm_throughput(record: dict):
    """benchmarks/bench_gemm.py: effective GFLOP/s against N per s, numpy float64 dashed."""
    rows = record["rows"]
    fig, (ax,) = _new_figure(1, width=6.0)
    for i, s in enumerate(sorted({r["s"] for r in rows})):
        sel = sorted((r for r in rows if r["s"] == s), key=lambda r: r["N"])
        ax.plot([r["N"] for r in sel], [r["gflops"] for r in sel], "o-", color=f"C{i}", label=f"s = {s}")
    by_n: dict = {}
    for r in rows:  # numpy's rate was measured before each s: its best per N
        by_n[r["N"]] = max(by_n.get(r["N"], 0.0), r["numpy_gflops"])
    ax.plot(sorted(by_n), [by_n[n] for n in sorted(by_n)], "k--", label="numpy float64")
    _axes(ax, "N (N x N x N)", "GFLOP/s", f"{'zgemm' if record['params'].get('complex') else 'dgemm'}; {_machine(record)}")
    return fig


def _gemm_exact(record: dict):
    """benchmarks/bench_gemm_exact.py: time of the correctly rounded GEMM against N per engine (best round)."""
    rows = record["rows"]
    fig, (ax,) = _new_figure(1, width=6.0)
    engines = list(dict.fromkeys(k for r in rows for k in r["ms"]))
    for key in engines:
        best: dict = {}
        for r in rows:
            if key in r["ms"]:
                best[r["N"]] = min(best.get(r["N"], float("inf")), r["ms"][key])
        ax.plot(sorted(best), [best[n] for n in sorted(best)], "o-", label=key)
    _axes(ax, "N (N x N x N)", "ms (best round)", f"moduli='auto' GEMM; {_machine(record)}")
    return fig


def _einsum_overhead(record: dict):
    """benchmarks/bench_einsum.py: time of the chain expression against n, per entry point."""
    rows = record["chain"]
    fig, (ax,) = _new_figure(1, width=6.0)
    for key in rows[0]["times"]:
        ax.plot([r["n"] for r in rows], [r["times"][key] * 1e3 for r in rows], "o-", label=key)
    _axes(ax, "mode size n", "ms per call", f"{rows[0]['expr']}; {_machine(record)}")
    return fig


def _einsum_default(record: dict):
    """benchmarks/bench_einsum_default.py: time of moduli=None and of s = 15 over numpy's, per expression and data."""
    rows = record["rows"]
    fig, (ax,) = _new_figure(1, width=10.0, height=4.5)
    _bars(ax, [f"{r['expression'].split(' (')[0]} {r['data']}" for r in rows],
          {"s = 15 / numpy": [r["fast_s"] / r["numpy_s"] for r in rows],
           "default / numpy": [r["default_over_numpy"] for r in rows]},
          "time / numpy einsum", f"einsum's classical default; {_machine(record)}", rotation=70)
    return fig


def _planners(record: dict):
    """benchmarks/bench_planners.py: apply time per planner against n, and RescaleBE's max error per planner."""
    fig, (a1, a2) = _new_figure(2)
    for planner in ("greedy", "optimal"):
        sel = [r for r in record["timings"] if r["planner"] == planner]
        a1.plot([r["n"] for r in sel], [r["apply_s"] * 1e3 for r in sel], "o-", label=planner)
    _axes(a1, "mode size n", f"apply ms (2^{record['params'].get('log2dofs', 18)} DoFs)", logy=False)
    acc = record["accuracy"]
    _bars(a2, [f"d={a['depth']} {a['dataset']}" for a in acc], {p: [a[p] for a in acc] for p in ("greedy", "optimal")},
          "RescaleBE max elementwise error", rotation=60)
    return fig


def _dask_scaling(record: dict):
    """benchmarks/bench_dask.py: seconds per workload in memory and on 1 and 2 Dask workers."""
    rows = record["rows"]
    fig, (ax,) = _new_figure(1, width=6.0)
    loads = list(dict.fromkeys(r["workload"] for r in rows))
    series = {}
    for w in sorted({r["workers"] for r in rows}):
        t = {r["workload"]: r["seconds"] for r in rows if r["workers"] == w}
        series["in memory" if w == 0 else f"{w} worker{'s' if w > 1 else ''}"] = [t[name] for name in loads]
    _bars(ax, loads, series, "seconds", f"rnstensor.dask strong scaling; {_machine(record)}", logy=False)
    return fig


def _floor(record: dict):
    """benchmarks/bench_floor.py: the chain's time over numpy's against n, and the fused chain's share of its floor."""
    rows = record["rows"]
    fig, (a1, a2) = _new_figure(2)
    ns = [r["n"] for r in rows]
    for key in ("steps", "fused", "default"):
        a1.plot(ns, [r["seconds"][key] / r["seconds"]["numpy"] for r in rows], "o-", label=key)
    a1.axhline(1.0, color="k", ls="--", lw=1, label="numpy einsum")
    _axes(a1, "mode size n", "time / numpy einsum", f"d = 3, s = 15; {_machine(record)}", logy=False)
    a2.plot(ns, [r["arith_floor"] / r["seconds"]["fused"] for r in rows], "o-", label="arithmetic floor / fused")
    a2.plot(ns, [r["memory_floor"] / r["seconds"]["fused"] for r in rows], "s-", label="memory floor / fused")
    _axes(a2, "mode size n", "share of the fused chain's time", logy=False)
    return fig


def _gemm_default(record: dict):
    """benchmarks/bench_gemm_default.py: the default's time over 'fast' against N per data set, and its errors."""
    fig, (a1, a2) = _new_figure(2)
    rows = record["speed"]
    for name in dict.fromkeys(r["data"] for r in rows):
        sel = sorted((r for r in rows if r["data"] == name), key=lambda r: r["N"])
        a1.plot([r["N"] for r in sel], [r["default_vs_fast"] for r in sel], "o-", label=name)
    _axes(a1, "N (N x N x N)", "time of moduli=None / moduli='fast'", f"dgemm's classical default; {_machine(record)}",
          logy=False)
    acc = record["accuracy"]
    _bars(a2, [a["data"] for a in acc], {k: [a[k] for a in acc] for k in ("numpy", "fast", "default")},
          "max componentwise error / (gamma_k |A||B|)")
    return fig


def _primitives(record: dict):
    """benchmarks/bench_primitives.py: ms per primitive, numpy reference against the CPU backend."""
    rows = record["rows"]
    fig, (ax,) = _new_figure(1, width=8.0, height=4.5)
    ops = list(dict.fromkeys(r["op"] for r in rows))
    series = {}
    for be in dict.fromkeys(r["backend"] for r in rows):
        t = {r["op"]: r["seconds"] * 1e3 for r in rows if r["backend"] == be}
        series[be] = [t.get(op, float("nan")) for op in ops]  # the yardstick has no CPU-backend bar
    _bars(ax, ops, series, f"ms ({record.get('entries', '?')} entries)", f"residue primitives; {_machine(record)}",
          rotation=30)
    return fig


def _revisions(record: dict):
    """benchmarks/bench_revisions.py: time of the new checkout over the old one, case by case."""
    rows = record["rows"]
    fig, (ax,) = _new_figure(1, width=8.0, height=4.5)
    ax.barh(range(len(rows)), [r["ratio"] for r in rows])
    ax.axvline(1.0, color="k", lw=1)
    ax.set_yticks(range(len(rows)), [r["case"] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("new / old time")
    ax.set_title(f"{record['params'].get('new')} vs {record['params'].get('old')}; {_machine(record)}", fontsize=9)
    return fig


def _chain_sass(record: dict):
    """benchmarks/chain_sass.py: instructions per DoF of each specialized build, and its H200 issue and pipe bounds."""
    rows = record["rows"]
    fig, (a1, a2) = _new_figure(2)
    labels = [r["program"] for r in rows]
    _bars(a1, labels, {"instructions per DoF": [r["instructions_per_dof"] for r in rows]}, "SASS instructions per DoF",
          "fused kernel, specialized build (static count)", logy=False, rotation=30)
    _bars(a2, labels, {"issue bound": [r["issue_bound_gdofs"] for r in rows],
                       "pipe bound": [r["pipe_bound_gdofs"] for r in rows]},
          "GDoF/s on an H200 (bounds)", logy=False, rotation=30)
    return fig


#: ``kind -> (what the figure shows, the function drawing it)``; the ``kind`` field of every ``--json`` result.
FIGURES: dict[str, tuple[str, Callable[[dict], object]]] = {
    "chain_accuracy": ("rnstensor accuracy: error against chain depth", _chain_accuracy),
    "demo": ("rnstensor demo: bound, range and moduli per step", _demo),
    "info": ("rnstensor info: basis range against s", _info),
    "gemm_accuracy": ("rnstensor accuracy gemm (tables 6, 8): DGEMM/ZGEMM accuracy against s", _gemm_accuracy),
    "gemm_thresholds": ("rnstensor accuracy gemm --table 7: accuracy scans against s", _gemm_thresholds),
    "chain_throughput": ("benchmarks/bench_chain.py: throughput against n", _chain_throughput),
    "fem_throughput": ("benchmarks/bench_fem.py: throughput against the degree", _fem_throughput),
    "gemm_throughput": ("benchmarks/bench_gemm.py: GFLOP/s against N", _gemm_throughput),
    "gemm_exact": ("benchmarks/bench_gemm_exact.py: time against N per engine", _gemm_exact),
    "einsum_overhead": ("benchmarks/bench_einsum.py: time against n per entry point", _einsum_overhead),
    "einsum_default": ("benchmarks/bench_einsum_default.py: the default's cost per expression", _einsum_default),
    "planners": ("benchmarks/bench_planners.py: apply time and error per planner", _planners),
    "dask_scaling": ("benchmarks/bench_dask.py: seconds per workload and workers", _dask_scaling),
    "floor": ("benchmarks/bench_floor.py: time over numpy and over the floors against n", _floor),
    "gemm_default": ("benchmarks/bench_gemm_default.py: the default's cost and errors", _gemm_default),
    "primitives": ("benchmarks/bench_primitives.py: ms per primitive and backend", _primitives),
    "revisions": ("benchmarks/bench_revisions.py: new / old time per case", _revisions),
    "chain_sass": ("benchmarks/chain_sass.py: instructions per DoF and bounds per program", _chain_sass),
}


def figure_of(record: dict):
    """The matplotlib ``Figure`` of a result record (a dict as :func:`rnstensor.results.write_result` writes it).

    Raises
    ------
    ValueError
        If its ``kind`` is not one of :data:`FIGURES` (the message lists them).
    ImportError
        If matplotlib is not installed (the message names ``pip install 'rnstensor[plot]'``).
    """
    kind = record.get("kind")
    if kind not in FIGURES:
        known = ", ".join(sorted(FIGURES))
        raise ValueError(f"result kind {kind!r} has no figure; known kinds: {known}")
    fig = FIGURES[kind][1](record)
    fig.tight_layout()
    return fig


def plot_result(result: Union[str, os.PathLike, dict], out: Union[str, os.PathLike, None] = None) -> Path:
    """Draw the figure of a ``--json`` result and save it (PNG, or whatever ``out``'s suffix names).

    Parameters
    ----------
    result : path or dict
        A file written by ``--json`` (:mod:`rnstensor.cli` or a benchmark), or its record.
    out : path, optional
        The image; default: the JSON file's name with ``.png`` (required when ``result`` is a dict).

    Returns
    -------
    pathlib.Path
        Where the figure was written.

    Raises
    ------
    FileNotFoundError
        If the result file does not exist.
    ValueError
        If it is not a result (no ``kind``), its kind is unknown, or ``out`` is missing for a dict.
    ImportError
        If matplotlib is not installed: ``pip install 'rnstensor[plot]'``.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "info.png"
    >>> rec = {"kind": "info", "bases": [{"s": 1, "log2_product": 8.0}, {"s": 2, "log2_product": 15.99}]}
    >>> plot_result(rec, out).read_bytes()[:4]
    b'\\x89PNG'
    """
    from .results import read_result

    if isinstance(result, dict):
        if out is None:
            raise ValueError("out: give the image's path when result is a record, not a file")
        record = result
    else:
        record = read_result(result)
    target = Path(out) if out is not None else Path(result).with_suffix(".png")
    figure_of(record).savefig(target, dpi=110)
    return target
