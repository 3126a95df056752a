"""The ``rnstensor`` command: ``info``, ``demo``, ``accuracy``, ``plot``; ``--json`` results, bars on stderr."""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Optional, Sequence

import numpy as np

from . import demo
from .results import output_path as _writable

__all__ = ["main"]


def package_version() -> str:
    """The installed rnstensor's version: its package metadata, else ``rnstensor.__version__``, else ``'unknown'``.

    The metadata is what pip installed (and what ``pip show rnstensor`` says);
    ``__version__`` covers a source tree imported without installing it.
    """
    from importlib import metadata

    try:
        return metadata.version("rnstensor")
    except metadata.PackageNotFoundError:
        package = sys.modules[__package__]  # rnstensor itself, imported before its cli
        return str(getattr(package, "__version__", "unknown"))


def _plain_role(match: "re.Match") -> str:
    """The text Sphinx shows for a role: ``:doc:`title <page>``` its title, ``:func:`~a.b``` its last name ``b``."""
    target = match.group(1)
    titled = re.fullmatch(r"(.*?)\s*<[^>]*>", target, flags=re.S)
    if titled:
        return titled.group(1)
    return target[1:].rsplit(".", 1)[-1] if target.startswith("~") else target


def _plain(text: str) -> str:
    """Docstring RST as the plain text ``--help`` prints: ``x``, :role:`x`, `x` and *x* / **x** all become x."""
    text = re.sub(r":[\w:+.-]+:`([^`]+)`", _plain_role, text)
    text = re.sub(r"``(.+?)``", r"\1", text, flags=re.S)
    text = re.sub(r"`([^`]+)`_{0,2}", r"\1", text)  # the default role and hyperlink references
    return re.sub(r"(?<![\w*])(\*{1,2})(?=\S)(.+?)(?<=\S)\1(?![\w*])", r"\2", text, flags=re.S)


def _info(args) -> int:
    from .backends import available_backends, get_backend
    from .backends.cuda import describe
    from .basis import Basis, int8_pool

    pool = int8_pool()
    bases = [Basis.int8(s) for s in range(1, len(pool) + 1)]
    parts = optional_parts()
    if args.json:
        record = {
            "version": package_version(),
            "backend": get_backend().name,
            "available_backends": list(available_backends()),
            "int8_pool": [int(p) for p in pool],
            "bases": [{"s": len(B), "log2_product": B.log2_product, "largest": int(max(B.moduli)),
                       "smallest": int(min(B.moduli))} for B in bases],
            "cuda": describe(),
            "optional": parts,
        }
        _write_json(args, "info", record)
        return 0
    print(f"rnstensor {package_version()}")
    print(f"backend in use: {get_backend().name} (available: {', '.join(available_backends())})")
    print(f"INT8 moduli pool: {len(pool)} moduli, greedy descending pairwise coprime from 256")
    for i in range(0, len(pool), 12):
        print("  " + " ".join(f"{p:3d}" for p in pool[i : i + 12]))
    print("\n  s  log2 P   log2(P/2)  largest p   smallest p")
    for B in bases:
        print(f" {len(B):2d}  {B.log2_product:7.2f}  {B.log2_product - 1:8.2f}  {max(B.moduli):9d}  {min(B.moduli):10d}")
    print()
    kernels = _kernel_lines(describe())  # the built kernels; never compiles, never fails
    for part in parts:
        print(part["line"])
        if part["part"] == "nvrtc":  # what NVRTC has built so far, under the line that says whether it works
            for line in kernels:
                print("  " + line)
    return 0


#: The lines of :func:`rnstensor.backends.cuda.describe` about a part that :func:`optional_parts` reports too, by
#: their start: the device (``gpu``) and NVRTC, each said once, by the line that tried it.
_DESCRIBED_PARTS = ("cuda device:", "nvrtc:")


def _kernel_lines(described: Sequence[str]) -> list[str]:
    """The lines of ``cuda.describe()`` that no part line says already: which kernel modules are built, per arch."""
    return [line for line in described if not line.startswith(_DESCRIBED_PARTS)]


#: The optional parts ``rnstensor info`` reports: module, what it is for, the extra that installs it.
OPTIONAL_PARTS = (
    ("dask", "Dask arrays of tensors (rnstensor.dask)", "dask"),
    ("distributed", "Dask's distributed scheduler", "dask"),
    ("scipy", "SciPy (the FEM solver examples)", "test"),
    ("meshio", "mesh files for the FEM operators", "fem"),
    ("skfem", "scikit-fem (the FEM tests' assembler)", "fem"),
    ("tqdm", "progress bars", "cli"),
    ("matplotlib", "rnstensor plot", "plot"),
)


def _try_dask(mod) -> str:
    import dask.array as da

    got = int(da.ones(6, chunks=2).sum().compute(scheduler="synchronous"))
    assert got == 6, got
    return "a 3-chunk sum computed"


def _try_scipy(mod) -> str:
    import numpy as np
    from scipy.sparse.linalg import LinearOperator, cg

    A = LinearOperator((2, 2), matvec=lambda v: np.array([2.0, 3.0]) * v)
    x, info = cg(A, np.array([2.0, 3.0]))
    assert info == 0 and np.allclose(x, 1.0), (x, info)
    return "cg solves through a LinearOperator"


def _try_meshio(mod) -> str:
    import os
    import tempfile

    import numpy as np

    pts = np.array([[i & 1, (i >> 1) & 1, i >> 2] for i in (0, 1, 3, 2, 4, 5, 7, 6)], np.float64)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cube.vtu")
        mod.write_points_cells(path, pts, [("hexahedron", np.arange(8)[None])])
        back = mod.read(path)
    assert np.array_equal(back.points, pts) and back.cells[0].type == "hexahedron"
    return "a hexahedron written and read back as .vtu"


def _try_skfem(mod) -> str:
    from skfem import Basis, BilinearForm, ElementHex1, MeshHex

    @BilinearForm
    def mass(u, v, _):
        return u * v

    M = mass.assemble(Basis(MeshHex(), ElementHex1()))
    assert abs(M.sum() - 1.0) < 1e-12, M.sum()
    return "a Q1 mass matrix assembled"


def _try_tqdm(mod) -> str:
    import io

    with mod.tqdm(total=2, file=io.StringIO()) as bar:
        bar.update(2)
    return "a bar drawn"


def _try_matplotlib(mod) -> str:
    import io

    from matplotlib.figure import Figure  # no pyplot: PNG through Agg, the user's backend untouched

    buf = io.BytesIO()
    fig = Figure(figsize=(1, 1))
    fig.add_subplot().plot([0, 1], [1, 0])
    fig.savefig(buf, format="png")
    assert buf.getvalue().startswith(b"\x89PNG"), "not a PNG"
    return "a figure rendered to PNG"


#: What ``rnstensor info`` does with each optional module to say it works (importing is not working).
_TRIES = {"dask": _try_dask, "scipy": _try_scipy, "meshio": _try_meshio, "skfem": _try_skfem, "tqdm": _try_tqdm,
          "matplotlib": _try_matplotlib}


def optional_parts() -> list[dict]:
    """What ``rnstensor info`` says of numba (threads, whether its JIT runs), NVRTC, the GPU and each optional module.

    One record per part: ``part``, ``working`` (bool), ``version`` (or None) and
    ``line``, the sentence printed. "Working" is tried, not assumed: numba
    compiles a function, NVRTC compiles a kernel to a cubin, the GPU runs a
    CuPy reduction, and each module does one small real job (Dask computes a
    chunked sum, SciPy's ``cg`` solves through a ``LinearOperator``, meshio
    writes and reads a hexahedron, scikit-fem assembles a mass matrix, tqdm
    draws a bar, matplotlib renders a PNG; distributed imports). Never fails:
    a part that is missing or broken is said in its line, with the extra that
    installs it.
    """
    import importlib

    out = []
    try:
        import numba

        @numba.njit(cache=False)
        def _twice(x):  # a one-line JIT compile: numba present is not numba working
            return 2 * x

        ok = _twice(21) == 42
        out.append({"part": "numba", "working": ok, "version": numba.__version__, "threads": numba.get_num_threads(),
                    "line": f"numba {numba.__version__}: {numba.get_num_threads()} threads "
                            f"(NUMBA_NUM_THREADS={numba.config.NUMBA_NUM_THREADS}), "
                            f"JIT {'works' if ok else 'gives wrong results'}"})
    except Exception as exc:  # noqa: BLE001 - info reports whatever stops numba
        out.append({"part": "numba", "working": False, "version": None,
                    "line": f"numba: not working ({type(exc).__name__}: {exc}); the 'numpy' backend still runs"})
    out.append(_nvrtc_part())
    out.append(_gpu_part())
    for module, what, extra in OPTIONAL_PARTS:
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - an import that fails in any way is "not available"
            why = "not installed" if isinstance(exc, ModuleNotFoundError) else f"fails to import ({type(exc).__name__})"
            out.append({"part": module, "working": False, "version": None,
                        "line": f"{module}: {why} ({what}; pip install 'rnstensor[{extra}]')"})
            continue
        version = str(getattr(mod, "__version__", "(version unknown)"))
        try:
            did = _TRIES[module](mod) if module in _TRIES else "imports"
        except Exception as exc:  # noqa: BLE001 - info reports whatever stops the part
            out.append({"part": module, "working": False, "version": version,
                        "line": f"{module} {version}: not working ({type(exc).__name__}: {exc}; {what})"})
            continue
        out.append({"part": module, "working": True, "version": version, "line": f"{module} {version}: {what}; {did}"})
    return out


def _nvrtc_part() -> dict:
    """Whether NVRTC compiles a one-line kernel to a cubin (needs no GPU)."""
    from .kernels import build

    arch = build.ARCHS[0]
    try:
        major, minor = build.nvrtc_version()
        t0 = time.perf_counter()
        size = build.probe(arch)
        ms = (time.perf_counter() - t0) * 1e3
        cache = build.cache_dir()
        return {"part": "nvrtc", "working": size > 0, "version": f"{major}.{minor}", "kernel_cache": str(cache),
                "line": f"nvrtc {major}.{minor}: compiles a test kernel for {arch} ({size} bytes, {ms:.0f} ms); "
                        f"kernel cache: {cache}"}
    except Exception as exc:  # noqa: BLE001 - info reports whatever stops NVRTC
        return {"part": "nvrtc", "working": False, "version": None,
                "line": f"nvrtc: not working ({exc}); the GPU kernels cannot be built (pip install 'rnstensor[gpu]')"}


def _gpu_part() -> dict:
    """Whether a CUDA GPU is visible and runs a CuPy reduction; "no GPU" otherwise, never an error."""
    from .arrays import device_module
    from .backends import cuda

    try:
        info = cuda.device_info()
    except Exception as exc:  # noqa: BLE001 - a broken driver is reported, not raised
        return {"part": "gpu", "working": False, "version": None,
                "line": f"gpu: no GPU usable ({type(exc).__name__}: {exc}); the CPU backend runs everything"}
    if not info:
        try:
            device_module()
            why = "CuPy imports, no device visible"
        except RuntimeError:
            why = "CuPy not installed: pip install 'rnstensor[gpu]'"
        return {"part": "gpu", "working": False, "version": None,
                "line": f"gpu: no GPU ({why}); the CPU backend runs everything"}
    try:
        cp = device_module()
        ok = int(cp.arange(1, 101, dtype=cp.int64).sum()) == 5050  # the device runs a kernel and returns its result
        state = "runs a test reduction" if ok else "gives a wrong test reduction"
    except Exception as exc:  # noqa: BLE001
        ok, state = False, f"fails a test reduction ({type(exc).__name__}: {exc})"
    return {"part": "gpu", "working": ok, "version": info["capability"], "device": info["name"],
            "line": f"gpu: {info['name']} (compute capability {info['capability']}, kernels for {info['arch']}) "
                    f"{state}"}


def _demo(args) -> int:
    from .basis import Basis

    rng = np.random.default_rng(args.seed)
    s, bits, n = args.moduli, 53, args.n
    basis = Basis.int8(s)
    axes = (1, 2, 3, 1)
    X = rng.uniform(-1, 1, size=(args.batch, n, n, n))
    ops = [rng.uniform(-1, 1, size=(n, n)) for _ in axes]

    print("rnstensor demo: a chain of mode products on a tensor encoded once and decoded once")
    print(f"  X: {X.shape} U[-1,1), operators {n}x{n} U[-1,1), axes {axes}, {basis!r}\n")
    # the first call loads numba's kernels from its cache, or runs NumPy's reference paths while they are cold (as a
    # user's first call does: backends/cpu/warm.py; on the whole batch, so that a call large enough to compile does
    # it here), or with --compile compiles them (on one tensor): not in the time below
    from .backends.cpu import warm

    routing = warm.enabled()
    try:
        if args.compile:
            warm.enabled(False)
        routed = warm.routed()
        first = X[:1] if args.compile else X
        warm_seconds, warm_compiled = demo.timed_compiles(lambda: demo.residue_chain(first, ops, axes, basis, bits))
        print(f"  {demo.warm_up_line(_backend_name(), warm_seconds, warm_compiled, warm.routed() > routed)}\n")
        record = demo.chain_report(X, ops, axes, basis, bits, _backend_name())
    finally:
        warm.enabled(routing)  # the accuracy runs below compile only what pays, as any first call
    record["warm_up"] = {"seconds": warm_seconds, "compiled": warm_compiled}
    if args.accuracy_count > 0:
        print(
            "\n\nThe paper's setting ([2610.05059] Table 3: greedy drops, 15 moduli), not what the defaults do:\n"
            f"a short accuracy experiment (n = 8, s = 15, d = 3 and 8, {args.accuracy_count} tensors per dataset; "
            "the full one: rnstensor accuracy)\n"
        )
        runs = {}

        def accuracy_runs():
            # the paper's n = 8, s = 15; then the default plan on the same data
            runs["paper"] = _run_accuracy_with_bar(dict(depths=(3, 8), count=args.accuracy_count, seed=args.seed),
                                                   verbose=False)
            runs["default"] = demo.default_plan_errors(runs["paper"])

        seconds, compiled = demo.timed_compiles(accuracy_runs)
        print(runs["paper"].format())
        print("\n" + demo.format_default_errors(runs["default"]))
        # kernels these runs use compile on their first use where that pays (backends/cpu/warm.py)
        print(f"\n  ({seconds:.1f} s{', first-use compiles of CPU kernels included' if compiled else ''})")
        record["accuracy"] = runs["paper"].to_dict()
        record["default_accuracy"] = runs["default"]
    _write_json(args, "demo", record)
    return 0


#: Options of ``rnstensor accuracy`` that only one of its targets reads: not in the other's ``params``.
_TARGET_OPTIONS = {
    "chain": ("depths", "count", "n", "moduli", "decode", "planner", "input_bits"),
    "gemm": ("table", "data", "gemm_moduli", "complex", "ks", "size"),
}


def _params(args) -> dict:
    """The options that shaped a result, as its ``params`` (not ``--json`` and ``-v``, nor the other target's)."""
    skip = {"json", "verbose"}
    target = getattr(args, "target", None)
    for other, names in _TARGET_OPTIONS.items():
        if target is not None and other != target:
            skip.update(names)
    return {k: v for k, v in vars(args).items() if k not in skip}


def _write_json(args, kind: str, data: dict) -> None:
    """``--json PATH``: the result of kind ``kind`` with the options and the machine (:func:`rnstensor.results.write_result`)."""
    if args.json:
        from .results import write_result

        write_result(args.json, kind, data, _params(args))
        if args.json != "-":
            print(f"JSON written to {args.json}")


def _parse_depths(text: str) -> list[int]:
    """``'3,4,8'`` or ``'3-8'`` (or a mix) as a list of ints."""
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = (int(v) for v in part.split("-", 1))
                if hi < lo:
                    raise argparse.ArgumentTypeError(f"--depths range {part!r} runs backwards; write it low-high, "
                                                     f"e.g. '{hi}-{lo}'")
                out.extend(range(lo, hi + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--depths must look like '3-8' or '3,4,8'; got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"--depths needs chain depths >= 1; got {text!r}")
    return out


_GEMM_TABLE_DATA = {"6": ["uniform", "phi2", "sincos"], "7": None, "8": ["spike", "cancel", "boundary"]}
_GEMM_TABLE_MODULI = {"6": [12, 14, 16, 18, 20, 24], "8": ["default", "fast", "auto", 12, 16, 20, 24]}


def _gemm_moduli_arg(v: str):
    if v in ("auto", "default", "fast"):
        return v
    try:
        return int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gemm-moduli takes integers, 'auto', 'fast' or 'default'; got {v!r}") from None


def _accuracy_gemm_table7(args) -> int:
    from .gemm_accuracy import EXTENDED_WIDTH, TABLE7_DATASETS, gemm_thresholds
    from .progress import progress

    m, _, n = args.size
    data = args.data or list(TABLE7_DATASETS)
    print(f"[2610.26945] Table 7: smallest s per accuracy level, {m} x k x {n}, seed {args.seed}")
    print("  (a) max componentwise error <= numpy float64 matmul's; (u) <= 2^-53; (b) >= 99.9 % CR; (c) 100 % CR")
    print(f"  s[t]: moduli and width; noext: smallest s with t <= {EXTENDED_WIDTH} ('-': needs the extended width)")
    print("  paper: [2610.26945] Table 7 (a, b, c); auto/def: the s of moduli='auto' / None")
    head = f"{'data':<8} {'k':>5} {'numpy comp':>10} {'np CR%':>7}  {'(a)':>7} {'(u)':>7} {'(b)':>7} {'(c)':>7}  {'noext a/b/c':>11}  {'auto':>4} {'def':>3}  {'paper':>8}"
    print(head)

    def sv(r, c):
        return "-" if r[c] is None else f"{r[c]}[{r[c + '_t']}]"

    with progress(total=len(data) * len(args.ks), desc="table 7", unit="row") as bar:

        def show(r):
            ne = "/".join("-" if r[c + "_noext"] is None else str(r[c + "_noext"]) for c in ("float64", "cr99.9", "cr100"))
            pp = "/".join("-" if v is None else str(v) for v in r["paper"]) if r["paper"] else ""
            bar.write(
                f"{r['data']:<8} {r['k']:>5} {r['numpy']['componentwise']:>10.2e} {r['numpy']['cr_percent']:>7.2f}  "
                f"{sv(r, 'float64'):>7} {sv(r, 'unit'):>7} {sv(r, 'cr99.9'):>7} {sv(r, 'cr100'):>7}  {ne:>11}  "
                f"{r['auto']:>4} {r['default']:>3}  {pp:>8}"
            )
            bar.update()
            bar.set_postfix_str(f"{r['data']} k={r['k']} done")  # and redraw now

        def scanned(st):
            bar.set_postfix_str(f"{st['data']} k={st['k']} s={st['s']}")

        rows = gemm_thresholds(datasets=data, ks=args.ks, m=m, n=n, seed=args.seed, progress=show, step=scanned)
    _write_json(args, "gemm_thresholds", {"rows": rows})
    return 0


def _accuracy_gemm(args) -> int:
    from .gemm_accuracy import gemm_accuracy
    from .progress import progress

    t0 = time.perf_counter()
    table = args.table
    try:
        if table == "7":
            if args.complex or args.gemm_moduli:
                raise ValueError("--table 7 scans s itself for DGEMM; --complex and --gemm-moduli apply to tables 6 and 8")
            code = _accuracy_gemm_table7(args)
            print(f"\n({time.perf_counter() - t0:.1f} s)")
            return code
        m, k, n = args.size
        data = args.data or _GEMM_TABLE_DATA[table]
        moduli = args.gemm_moduli or _GEMM_TABLE_MODULI[table]
        kind = "ZGEMM (3M)" if args.complex else "DGEMM"
        print(f"[2610.26945] Table {table}: emulated {kind} vs the exact product, {m} x {k} x {n}, seed {args.seed}")
        print(
            f"{'data':<10} {'method':<7} {'moduli':>7} {'s':>3} {'t':>4} {'max ulp':>10} {'CR %':>8} "
            f"{'componentwise':>14} {'normwise':>10}"
        )
        with progress(total=len(data) * (1 + len(moduli)), desc=f"table {table}", unit="row") as bar:

            def show(r):
                s_, t_ = r.get("s"), r.get("t")
                bar.write(
                    f"{r['data']:<10} {r['method']:<7} {r['moduli'] or '':>7} {'' if s_ is None else s_:>3} "
                    f"{'' if t_ is None else t_:>4} {r['max_ulp']:>10.3g} {r['cr_percent']:>8.3f} "
                    f"{r['componentwise']:>14.2e} {r['normwise']:>10.2e}"
                )
                bar.update()
                bar.set_postfix_str(f"{r['data']} {r['method']} {r['moduli'] or ''}")

            def reference(st):
                bar.set_postfix_str(f"{st['data']}: the exact product")

            rows = gemm_accuracy(
                datasets=data, moduli=moduli, m=m, k=k, n=n, seed=args.seed, progress=show, complex=args.complex,
                step=reference,
            )
    except ValueError as exc:
        print(f"rnstensor accuracy gemm: error: {exc}", file=sys.stderr)
        return 2
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    _write_json(args, "gemm_accuracy", {"rows": rows})
    return 0


def _run_accuracy_with_bar(options: dict, verbose: bool):
    """:func:`rnstensor.accuracy.run_accuracy` with a bar over its depth x dataset steps (``-v``: their lines too)."""
    from .accuracy import DATASETS, run_accuracy
    from .progress import progress

    total = len(options["depths"]) * len(options.get("datasets", DATASETS))  # run_accuracy reports each depth x dataset
    with progress(total=total, desc="accuracy", unit="step") as bar:

        def step(line: str) -> None:
            bar.update()
            bar.set_postfix_str(line.split(":", 1)[0])
            if verbose:
                bar.write("  " + line, file=sys.stderr)

        return run_accuracy(**options, progress=step)


def _accuracy(args) -> int:
    if args.target == "gemm":
        return _accuracy_gemm(args)
    t0 = time.perf_counter()
    try:
        result = _run_accuracy_with_bar(
            dict(
                depths=args.depths,
                count=args.count,
                n=args.n,
                moduli=args.moduli,
                seed=args.seed,
                decode=args.decode,
                planner=args.planner,
                input_bits=args.input_bits,
            ),
            verbose=args.verbose,
        )
    except ValueError as exc:  # bad options and PlanError (too few moduli for a depth): a message, no traceback
        print(f"rnstensor accuracy: error: {exc}", file=sys.stderr)
        return 2
    print(result.format())
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    _write_json(args, "chain_accuracy", result.to_dict())
    return 0


def _plot(args) -> int:
    from .plot import plot_result

    try:
        out = plot_result(args.result, args.output)
    except (OSError, ValueError, ImportError) as exc:  # a missing file, an unknown kind, no matplotlib: said, no traceback
        print(f"rnstensor plot: error: {exc}", file=sys.stderr)
        return 2
    print(f"figure written to {out}")
    return 0


def _backend_name() -> str:
    from .backends import get_backend

    return get_backend().name


def _command(subparsers, name: str, summary: str) -> argparse.ArgumentParser:
    """A subcommand whose one-line summary shows in ``rnstensor --help`` and heads its own ``--help``, as plain text."""
    summary = _plain(summary)
    return subparsers.add_parser(name, help=summary, description=summary)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``rnstensor`` console script."""
    parser = argparse.ArgumentParser(prog="rnstensor", description=_plain(__doc__))
    parser.add_argument("--version", action="version", version=f"rnstensor {package_version()}",
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    info = _command(sub, "info", "moduli pool, basis ranges, backend in use, GPU and kernels, optional parts")
    info.add_argument("--json", metavar="PATH", type=_writable, default=None, help="write the report as JSON to PATH")
    demo_parser = _command(sub, "demo", "encode -> mode products -> drop -> base extension -> decode, checked")
    demo_parser.add_argument("--n", type=int, default=8, help="mode size (default 8)")
    demo_parser.add_argument("--batch", type=int, default=4, help="number of n^3 tensors (default 4)")
    demo_parser.add_argument("--moduli", type=int, default=15, help="INT8 moduli in the basis (default 15)")
    demo_parser.add_argument("--seed", type=int, default=0)
    demo_parser.add_argument(
        "--accuracy-count",
        type=int,
        default=4,
        help="tensors per dataset in the short accuracy run at d = 3 and 8 (default 4; 0 skips it)",
    )
    demo_parser.add_argument("--compile", action="store_true",
                      help="compile the CPU kernels first (once, cached) and time the compiled chain; without it, "
                           "kernels not yet compiled are not compiled for the demo's small calls")
    demo_parser.add_argument("--json", metavar="PATH", type=_writable, default=None, help="also write the tables as JSON to PATH")
    acc = _command(
        sub, "accuracy",
        "[2610.05059] Sec. 6.2: Table 2 and the Table 3 / Fig. 6 errors of every method against the exact value",
    )
    acc.add_argument(
        "target", nargs="?", choices=("chain", "gemm"), default="chain",
        help="chain: [2610.05059] Sec. 6.2 (default); gemm: [2610.26945] Tables 6-8 for emulated DGEMM / ZGEMM",
    )
    acc.add_argument(
        "--table", choices=("6", "7", "8"), default="6",
        help="gemm: [2610.26945] Table 6 (accuracy per s, default), 7 (smallest s per accuracy level) or 8 (worst cases)",
    )
    acc.add_argument(
        "--data", nargs="+", default=None,
        help="gemm: data sets (default: table 6 uniform phi2 sincos; 7 uniform phi0.5 phi1 phi2 phi4 sincos; "
        "8 spike cancel boundary)",
    )
    acc.add_argument(
        "--gemm-moduli", nargs="+", default=None, type=_gemm_moduli_arg,
        help="gemm tables 6/8: moduli counts, 'auto', 'fast' or 'default' "
        "(default: 6: 12 14 16 18 20 24; 8: default fast auto 12 16 20 24)",
    )
    acc.add_argument("--complex", action="store_true", help="gemm tables 6/8: ZGEMM (3M) on complex data sets")
    acc.add_argument(
        "--ks", nargs="+", type=int, default=[256, 4096], help="gemm table 7: contraction lengths (default 256 4096)"
    )
    acc.add_argument(
        "--size", nargs=3, type=int, default=[512, 4096, 512], metavar=("M", "K", "N"),
        help="gemm: shape M K N (default 512 4096 512; table 7 reads M and N only, its k values come from --ks)",
    )
    acc.add_argument("--depths", type=_parse_depths, default=[3, 4, 5, 6, 7, 8], help="chain depths (default 3-8)")
    acc.add_argument("--count", type=int, default=32, help="tensors per dataset (default 32, as in the paper)")
    acc.add_argument("--seed", type=int, default=0, help="master seed (default 0)")
    acc.add_argument("--n", type=int, default=8, help="mode size (default 8)")
    acc.add_argument("--moduli", type=int, default=15, help="INT8 moduli in the basis (default 15)")
    acc.add_argument("--decode", choices=("fp64", "exact"), default="fp64", help="decode of the residue methods")
    acc.add_argument(
        "--planner", choices=("greedy", "optimal"), default="greedy", help="drop planner (default greedy, Alg. 2)"
    )
    acc.add_argument(
        "--input-bits",
        type=lambda v: v if v == "max" else int(v),
        default=None,
        help="input encoding width of the persistent methods: an integer or 'max' (default: their b)",
    )
    acc.add_argument("--json", metavar="PATH", type=_writable, help="also write the results as JSON to PATH")
    acc.add_argument("-v", "--verbose", action="store_true", help="a line per depth and dataset on stderr")
    plot = _command(
        sub, "plot", "draw the figure of a --json result (accuracy vs depth, throughput vs n, DGEMM accuracy vs s, ...)"
    )
    plot.add_argument("result", metavar="RESULT.json", help="a file written by --json (rnstensor or a benchmark)")
    plot.add_argument(
        "-o", "--output", metavar="OUT.png", type=_writable, default=None,
        help="the image (default: RESULT.png beside the JSON)"
    )
    args = parser.parse_args(argv)
    if args.command == "accuracy" and args.count < 1:
        acc.error(f"--count must be at least 1; got {args.count}")
    try:
        from .results import json_on_stdout

        with json_on_stdout(getattr(args, "json", None)):  # --json -: the record alone on stdout, the tables on stderr
            return {"info": _info, "demo": _demo, "accuracy": _accuracy, "plot": _plot}[args.command](args)
    except BrokenPipeError:  # `rnstensor info | head`: the reader left; say nothing more, as Unix tools do
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's final flush fails quietly
        return 0


if __name__ == "__main__":
    sys.exit(main())
