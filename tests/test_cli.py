"""The command line: ``info`` says what works, ``--json`` holds the tables, ``plot`` draws them, bars only in a terminal."""

import argparse
import contextlib
import importlib.util
import io
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import rnstensor as rt
from rnstensor import cli, demo
from rnstensor import progress as progress_mod
from rnstensor.accuracy import DATASETS, METHOD_LABELS, run_accuracy
from rnstensor.gemm_accuracy import gemm_accuracy, gemm_thresholds

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


class FakeTTY(io.StringIO):
    """A stream that says it is a terminal: where a bar must appear."""

    def isatty(self):
        return True


def _cli(argv):
    """``cli.main(argv)`` with its stdout captured: ``(code, stdout)``."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(argv)
    return code, out.getvalue()


def _bench(name, argv, patch=None):
    """Run ``benchmarks/<name>.py``'s ``main`` in this process with ``argv``; its stdout."""
    spec = importlib.util.spec_from_file_location(f"_test_{name}", BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCHMARKS))  # the scripts import their _timing helpers
        spec.loader.exec_module(mod)
        for key, value in (patch or {}).items():
            mp.setattr(mod, key, value)
        mp.setattr(sys, "argv", [name, *argv])
        with contextlib.redirect_stdout(out):
            mod.main()
    return out.getvalue()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """One small result of every kind: ``kind -> (record, printed stdout, path)``."""
    d = tmp_path_factory.mktemp("results")
    runs = {
        "info": ["info"],
        "chain_accuracy": ["accuracy", "--depths", "3,4", "--count", "1"],
        "demo": ["demo", "--batch", "1", "--accuracy-count", "0"],
        "gemm_accuracy": ["accuracy", "gemm", "--size", "6", "48", "5", "--gemm-moduli", "14", "16", "auto",
                          "--data", "uniform", "phi2"],
        "gemm_thresholds": ["accuracy", "gemm", "--table", "7", "--size", "4", "0", "3", "--ks", "32", "--data",
                            "uniform"],
    }
    out = {}
    for kind, argv in runs.items():
        path = d / f"{kind}.json"
        code, text = _cli([*argv, "--json", str(path)])
        assert code == 0, text
        out[kind] = (json.loads(path.read_text()), text, path)
    if BENCHMARKS.is_dir():
        benches = {
            "chain_throughput": ("bench_chain", ["--sizes", "4", "8", "--log2dofs", "10", "--repeat", "1"], None),
            "fem_throughput": ("bench_fem", ["--degrees", "1", "2", "--log2dofs", "8", "--repeat", "1"], None),
            "gemm_throughput": ("bench_gemm", ["--sizes", "32", "64", "--moduli", "8", "14", "--repeat", "1"], None),
            "gemm_exact": ("bench_gemm_exact", ["--sizes", "32", "--repeat", "1", "--rounds", "1"], None),
            "einsum_overhead": ("bench_einsum", ["--sizes", "4", "--batch", "8", "--repeat", "1"], None),
            "einsum_default": ("bench_einsum_default", ["--repeat", "1"],
                               {"CASES": {"gemm 16 (ij,jk->ik)": ("ij,jk->ik", [(16, 16), (16, 16)])},
                                "DATA": ("uniform",)}),
            "planners": ("bench_planners", ["--repeat", "1", "--depths", "3", "--count", "1", "--sizes", "4",
                                            "--log2dofs", "8", "--wide-moduli", "16"], None),
            "floor": ("bench_floor", ["--sizes", "4", "--log2dofs", "8", "--repeat", "1"], None),
            "gemm_default": ("bench_gemm_default", ["--sizes", "16", "--data", "uniform", "wide", "--repeat", "1",
                                                    "--accuracy-n", "6", "--auto-sizes", "8"], None),
            "primitives": ("bench_primitives", ["--log2n", "10", "--repeat", "1"], None),
            # the same checkout twice, one case: the children's start-up is most of it
            "revisions": ("bench_revisions", [str(BENCHMARKS.parent)] * 2 + ["--rounds", "1", "--repeat", "1"],
                          {"CASES": [("sum", "x = np.arange(8.0)", "x.sum()")]}),
        }
        for kind, (name, argv, patch) in benches.items():
            path = d / f"{kind}.json"
            text = _bench(name, [*argv, "--json", str(path)], patch)
            out[kind] = (json.loads(path.read_text()), text, path)
        # chain_sass builds kernels with NVRTC (20 s each, cold): its measurement stood in by rows of its shape
        row = {"program": "chain n=4", "ops": 5, "instructions_per_dof": 1250.5, "registers": 40,
               "generic_registers": 128, "compile_s": 10.0, "issue_bound_gdofs": 26.8, "pipe_bound_gdofs": 26.8,
               "busiest_pipe": "issue", "stages": [["encode", 191, 64]], "pipe_cycles_per_dof": {"issue": 1250.5}}
        path = d / "chain_sass.json"
        _bench("chain_sass", ["--n", "4", "--fem", "--json", str(path)], {"measure": lambda n: dict(row)})
        out["chain_sass"] = (json.loads(path.read_text()), "", path)
        # bench_dask starts worker processes (half a minute): a record of the shape the script writes, for its figure
        from rnstensor.results import write_result

        rows = [{"workload": w, "workers": k, "seconds": 0.1 * (k + 1) + (w == "dgemm")}
                for w in ("chain n=8", "dgemm") for k in (0, 1, 2)]
        path = d / "dask_scaling.json"
        write_result(path, "dask_scaling", {"meta": {}, "rows": rows}, {"elements": 64})
        out["dask_scaling"] = (json.loads(path.read_text()), "", path)
    return out


# ----- info --------------------------------------------------------------------------------------------


def test_info_reports_every_optional_part(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    import numba

    assert f"numba {numba.__version__}: {numba.get_num_threads()} threads" in out and "JIT works" in out
    for module, _, extra in cli.OPTIONAL_PARTS:
        line = next(ln for ln in out.splitlines() if ln.startswith(module + ":") or ln.startswith(module + " "))
        installed = importlib.util.find_spec(module) is not None
        # an installed part names its version; a missing one the extra that installs it
        assert ("not installed" in line) == (not installed), line
        if not installed:
            assert f"pip install 'rnstensor[{extra}]'" in line


def test_info_says_whether_nvrtc_compiles_and_whether_there_is_a_gpu():
    from rnstensor.backends.cuda import cuda_available
    from rnstensor.kernels import build

    parts = {p["part"]: p for p in cli.optional_parts()}
    try:
        major, minor = build.nvrtc_version()
    except build.KernelBuildError:
        assert not parts["nvrtc"]["working"] and parts["nvrtc"]["line"].startswith("nvrtc: not working")
    else:
        assert parts["nvrtc"]["working"], parts["nvrtc"]["line"]
        assert parts["nvrtc"]["line"].startswith(f"nvrtc {major}.{minor}: compiles a test kernel for {build.ARCHS[0]}")
    gpu = parts["gpu"]
    if cuda_available():  # pragma: no cover - GPU machines
        assert gpu["working"] and gpu["device"] in gpu["line"]
    else:
        assert not gpu["working"] and gpu["line"].startswith("gpu: no GPU (") and "CPU backend" in gpu["line"]


def test_info_reports_nvrtc_that_does_not_compile(monkeypatch, capsys):
    from rnstensor.kernels import build

    def broken():
        raise build.KernelBuildError("NVRTC is not available: a test")

    monkeypatch.setattr(build, "_nvrtc", broken)
    assert cli.main(["info"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("nvrtc: not working"))
    assert "a test" in line and "pip install 'rnstensor[gpu]'" in line


def test_info_names_only_extras_that_exist():
    import tomllib

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    if not pyproject.exists():  # pragma: no cover - run from an installed wheel
        pytest.skip("pyproject.toml not beside the tests")
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    for module, _, extra in cli.OPTIONAL_PARTS:
        assert extra in extras, (module, extra)


def test_info_reports_a_broken_part(monkeypatch, tmp_path):
    # a module that fails to import (not merely missing) is said to fail, and info still succeeds
    (tmp_path / "rnstensor_broken_part.py").write_text("raise RuntimeError('broken on purpose')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "OPTIONAL_PARTS", (("rnstensor_broken_part", "a test part", "plot"),))
    parts = cli.optional_parts()
    broken = next(p for p in parts if p["part"] == "rnstensor_broken_part")
    assert not broken["working"] and broken["line"].startswith("rnstensor_broken_part: fails to import (RuntimeError)")


def test_info_says_a_part_that_imports_but_fails_its_job(monkeypatch):
    def broken(mod):
        raise RuntimeError("cannot draw")

    monkeypatch.setitem(cli._TRIES, "tqdm", broken)
    part = next(p for p in cli.optional_parts() if p["part"] == "tqdm")
    if importlib.util.find_spec("tqdm") is None:
        pytest.skip("tqdm not installed")
    assert not part["working"] and "not working (RuntimeError: cannot draw" in part["line"]


def test_info_tries_each_installed_part():
    parts = {p["part"]: p for p in cli.optional_parts()}
    for module, job in (("dask", "chunk sum computed"), ("scipy", "cg solves"), ("meshio", "read back"),
                        ("skfem", "mass matrix assembled"), ("tqdm", "bar drawn"), ("matplotlib", "rendered to PNG")):
        if importlib.util.find_spec(module) is not None:
            assert parts[module]["working"] and job in parts[module]["line"], parts[module]


def test_json_dash_writes_the_record_alone_to_stdout():
    for argv in (["info", "--json", "-"], ["demo", "--accuracy-count", "0", "--batch", "1", "--json", "-"]):
        done = subprocess.run([sys.executable, "-m", "rnstensor", *argv], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        record = json.loads(done.stdout)  # nothing else on stdout
        assert record["kind"] == argv[0] and record["machine"]
        assert "JSON written" not in done.stderr
        if argv[0] == "demo":
            assert "rnstensor demo: a chain of mode products" in done.stderr  # its tables went to stderr


def test_backwards_depth_range_is_named():
    with pytest.raises(SystemExit):
        cli.main(["accuracy", "--depths", "9-3"])
    with pytest.raises(argparse.ArgumentTypeError, match="runs backwards; write it low-high, e.g. '3-9'"):
        cli._parse_depths("9-3")


def test_info_json(results):
    from rnstensor.basis import Basis, int8_pool

    record, out, path = results["info"]
    assert record["kind"] == "info"
    assert record["int8_pool"] == [int(p) for p in int8_pool()]
    assert [b["s"] for b in record["bases"]] == list(range(1, len(int8_pool()) + 1))
    assert all(b["log2_product"] == Basis.int8(b["s"]).log2_product for b in record["bases"])
    parts = {p["part"]: p for p in record["optional"]}
    assert set(parts) == {"numba", "nvrtc", "gpu"} | {m for m, _, _ in cli.OPTIONAL_PARTS}
    for module, _, _ in cli.OPTIONAL_PARTS:
        assert parts[module]["working"] == (importlib.util.find_spec(module) is not None), module
    assert parts["numba"]["working"] is True
    assert str(path) in out


def test_info_runs_as_a_command():
    done = subprocess.run([sys.executable, "-m", "rnstensor", "info"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "numba" in done.stdout and "\nnvrtc" in done.stdout and "\ngpu: " in done.stdout
    _assert_each_part_said_once(done.stdout)


def _assert_each_part_said_once(out: str) -> None:
    """``rnstensor info``'s text names NVRTC and the GPU in one line each (cuda.describe() says them too)."""
    lines = out.splitlines()
    assert sum("nvrtc" in ln.lower() for ln in lines) == 1, out
    assert sum(ln.startswith(("gpu:", "cuda device:")) for ln in lines) == 1, out
    for part in ["numba"] + [m for m, _, _ in cli.OPTIONAL_PARTS]:
        assert sum(ln.startswith((part + ":", part + " ")) for ln in lines) == 1, part


def test_info_says_each_part_once(capsys, monkeypatch):
    from rnstensor.backends import cuda
    from rnstensor.kernels import build

    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    _assert_each_part_said_once(out)
    try:
        build.nvrtc_version()
    except build.KernelBuildError:  # pragma: no cover - without NVRTC there are no kernels to list
        pass
    else:  # the kernels built so far, under the NVRTC line, with the cache they are in
        nvrtc = next(ln for ln in out.splitlines() if ln.startswith("nvrtc"))
        assert f"kernel cache: {build.cache_dir()}" in nvrtc
        kernels = [ln for ln in cuda.describe() if ln.startswith("kernels ")]
        assert kernels and all(f"\n  {ln}\n" in out for ln in kernels)

    def broken():
        raise build.KernelBuildError("NVRTC is not available: a test")

    monkeypatch.setattr(build, "_nvrtc", broken)  # both describe() and the tried part say so: still one line
    assert cli.main(["info"]) == 0
    _assert_each_part_said_once(capsys.readouterr().out)


# ----- --version and --help ----------------------------------------------------------------------


def test_version_is_the_installed_one():
    from importlib import metadata

    want = f"rnstensor {metadata.version('rnstensor')}\n"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0 and out.getvalue() == want
    script = Path(sys.executable).parent / "rnstensor"  # the console script, where pip put it beside the interpreter
    for cmd in ([sys.executable, "-m", "rnstensor", "--version"], [str(script), "--version"]):
        if not Path(cmd[0]).exists():  # pragma: no cover - installed without its scripts
            continue
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and done.stdout == want, (cmd, done.stdout, done.stderr)


def test_version_without_package_metadata(monkeypatch):
    from importlib import metadata

    import rnstensor

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)  # a source tree on sys.path, never installed
    monkeypatch.setattr(rnstensor, "__version__", "9.8.7", raising=False)
    assert cli.package_version() == "9.8.7"
    monkeypatch.delattr(rnstensor, "__version__")
    assert cli.package_version() == "unknown"


def _help(argv) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as info:
        cli.main([*argv, "--help"])
    assert info.value.code == 0
    return out.getvalue()


def test_help_is_plain_text():
    import re

    for argv in ([], ["info"], ["demo"], ["accuracy"], ["plot"]):
        text = _help(argv)
        assert "`" not in text and not re.search(r":\w+:", text) and not re.search(r"\*\w", text), (argv, text)
        if argv:  # a subcommand's help says what it does under its usage, as the top-level list does
            summary = " ".join(text.split("\n\n")[1].split())
            assert summary and summary[:30] in " ".join(_help([]).split()), (argv, summary)
    assert "The rnstensor command: info, demo, accuracy, plot" in _help([])


def test_plain_turns_rst_into_text():
    assert cli._plain("The ``rnstensor`` command") == "The rnstensor command"
    assert cli._plain(":func:`rnstensor.results.write_result` and :mod:`~rnstensor.fem.mesh`") == (
        "rnstensor.results.write_result and mesh")
    assert cli._plain(":doc:`the GPU page <gpu>`, `x`, *emphasis*, **strong**") == "the GPU page, x, emphasis, strong"
    assert cli._plain("2 * 3 * 4, a*b, 2**53") == "2 * 3 * 4, a*b, 2**53"  # arithmetic is no markup


# ----- --json: the printed tables, the parameters, the machine --------------------------------------------


def test_every_json_names_its_kind_parameters_and_machine(results):
    import numba

    from rnstensor.plot import FIGURES

    assert set(results) <= set(FIGURES)
    for kind, (record, _, _) in results.items():
        assert record["kind"] == kind
        m = record["machine"]
        assert m["numpy"] == np.__version__ and m["numba"] == numba.__version__, kind
        assert m["cpus"] == os.cpu_count() and m["date"][:4].isdigit() and m["platform"], kind
        assert "json" not in record["params"] and "plot" not in record["params"], kind
    assert results["chain_accuracy"][0]["params"]["depths"] == [3, 4]
    assert "table" not in results["chain_accuracy"][0]["params"]  # the gemm target's options are not its parameters
    assert results["gemm_accuracy"][0]["params"]["size"] == [6, 48, 5]


def _error_table(out: str, metric: str) -> dict:
    """The printed block of ``metric``: ``(label, dataset) -> list of the printed numbers``."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"{metric}: "))
    table, ds = {}, None
    for ln in lines[start + 2:]:
        if not ln.startswith("  "):
            break
        ds = ln[2:11].strip() or ds
        table[(ln[11:27].strip(), ds)] = ln[27:].split()
    return table


def test_accuracy_json_is_the_printed_table_and_the_library_result(results):
    record, out, _ = results["chain_accuracy"]
    for metric in ("normwise", "max", "median"):
        table = _error_table(out, metric)
        assert len(table) == len(DATASETS) * len(METHOD_LABELS)
        for e in record["errors"]:
            printed = table[(METHOD_LABELS[e["method"]], e["dataset"])][record["config"]["depths"].index(e["depth"])]
            assert printed == f"{e[metric]:.2e}", (metric, e)
    # the bar's callback changes nothing: the same numbers as the library's own run, bit for bit
    again = run_accuracy(depths=[3, 4], count=1).to_dict()
    assert record["errors"] == again["errors"] and record["table2"] == json.loads(json.dumps(again["table2"]))


def test_demo_json_is_its_tables(results):
    record, out, _ = results["demo"]
    lines = out.splitlines()
    head = next(i for i, x in enumerate(lines) if x.split()[:2] == ["step", "moduli"])
    for ln, st in zip(lines[head + 1: head + 1 + len(record["steps"])], record["steps"]):
        assert ln[2:48].strip() == st["step"]
        assert ln[48:].split() == [str(st["moduli"]), f"{st['log2_bound']:.1f}", f"{st['log2_range']:.1f}"]
    assert lines[head + 1 + len(record["steps"])].strip() == ""  # and no printed step is missing from the JSON
    assert record["steps"][0]["step"].startswith("encode") and len(record["steps"]) == 1 + 4 + 3 * 2
    for e in record["errors"]:
        ln = next(x for x in lines if x[2:48].strip() == e["result"])
        assert ln[48:].split() == [f"{e['normwise']:.2e}", f"{e['max']:.2e}"]
    assert record["accuracy"] is None  # --accuracy-count 0


def test_demo_times_the_compilation_apart(results):
    record, out, _ = results["demo"]
    warm = record["warm_up"]
    line = demo.warm_up_line(cli._backend_name(), warm["seconds"], warm["compiled"])
    assert f"\n  {line}\n" in out and f"{warm['seconds']:.1f} s" in line
    if cli._backend_name() == "cpu":
        assert line.startswith("compiling the CPU kernels (first run only" if warm["compiled"] else
                               "CPU kernels loaded from the cache")
        assert record["compiled_while_timed"] == 0  # the warm-up on one tensor loaded every kernel the chain runs
        assert record["reference_paths"] is False  # (the tests compile every kernel: RNSTENSOR_COLD_START=0)
    assert f"residue chain took {record['seconds'] * 1e3:.1f} ms" in out


def test_demo_labels_the_papers_setting_and_shows_the_default(tmp_path):
    from rnstensor.accuracy import dataset_seed, operator_seed
    from rnstensor.reference import chain_operators, cycling_axes, dataset, error_metrics, exact_mode_chain, round_exact

    path = tmp_path / "demo.json"
    code, out = _cli(["demo", "--batch", "2", "--accuracy-count", "1", "--json", str(path)])
    assert code == 0, out
    record = json.loads(path.read_text())
    assert ("The paper's setting ([2610.05059] Table 3: greedy drops, 15 moduli), not what the defaults do" in out)
    assert out.index("not what the defaults do") < out.index("Table 2:") < out.index("The default, rt.plan_chain")
    rows = record["default_accuracy"]
    assert [(r["depth"], r["dataset"]) for r in rows] == [(d, ds) for d in (3, 8) for ds in DATASETS]
    numpy_errors = {(e["dataset"], e["depth"]): e for e in record["accuracy"]["errors"] if e["method"] == "einsum"}
    lines = out.splitlines()
    for r in rows:
        # the numpy column is the paper table's float64 einsum row; the default is a plain rt.plan_chain(ops, axes)
        assert r["numpy"]["normwise"] == numpy_errors[(r["dataset"], r["depth"])]["normwise"]
        ops = chain_operators(r["depth"], 8, np.random.default_rng(operator_seed(0)))
        axes = cycling_axes(r["depth"])
        X = dataset(r["dataset"], 1, 8, np.random.default_rng(dataset_seed(0, r["dataset"])))
        want = error_metrics(rt.plan_chain(ops, axes)(X), round_exact(*exact_mode_chain(X, ops, axes, ndim=3)))
        assert r["default"] == want, (r, want)
        printed = next(ln for ln in lines if ln.split()[:2] == [r["dataset"], f"d={r['depth']}"])
        assert printed.split()[2:6] == [f"{r['default']['normwise']:.2e}", f"{r['numpy']['normwise']:.2e}",
                                        f"{r['default']['max']:.2e}", f"{r['numpy']['max']:.2e}"], printed
        assert printed.endswith(r["ran_as"])


def test_gemm_json_is_the_printed_rows_and_the_library_rows(results):
    record, out, _ = results["gemm_accuracy"]
    printed = [ln.split() for ln in out.splitlines() if ln.split() and ln.split()[0] in ("uniform", "phi2")]
    assert len(printed) == len(record["rows"]) == 2 * 4
    for p, r in zip(printed, record["rows"]):
        assert p[:2] == [r["data"], r["method"]]
        assert p[-3:] == [f"{r['cr_percent']:.3f}", f"{r['componentwise']:.2e}", f"{r['normwise']:.2e}"]
    lib = gemm_accuracy(["uniform", "phi2"], [14, 16, "auto"], m=6, k=48, n=5)
    assert record["rows"] == json.loads(json.dumps(lib))


def test_table7_json_is_the_printed_row_and_the_library_row(results):
    record, out, _ = results["gemm_thresholds"]
    (row,) = record["rows"]
    line = next(ln.split() for ln in out.splitlines() if ln.startswith("uniform"))
    assert line[:4] == ["uniform", "32", f"{row['numpy']['componentwise']:.2e}", f"{row['numpy']['cr_percent']:.2f}"]
    assert line[4:8] == [f"{row[c]}[{row[c + '_t']}]" for c in ("float64", "unit", "cr99.9", "cr100")]
    assert row == json.loads(json.dumps(gemm_thresholds(["uniform"], [32], m=4, n=3)[0]))


def test_gemm_step_callback_sees_every_reference_and_changes_nothing():
    steps = []
    with_steps = gemm_accuracy(["uniform", "cancel"], [14, "auto"], m=3, k=32, n=2, step=steps.append)
    assert with_steps == gemm_accuracy(["uniform", "cancel"], [14, "auto"], m=3, k=32, n=2)
    assert steps == [{"data": "uniform", "stage": "reference"}, {"data": "cancel", "stage": "reference"}]


def test_table7_step_callback_sees_every_scanned_s_and_changes_nothing():
    steps = []
    with_steps = gemm_thresholds(["phi2"], [32], m=3, n=3, step=steps.append)
    plain = gemm_thresholds(["phi2"], [32], m=3, n=3)
    assert with_steps == plain
    assert steps == [dict(data="phi2", k=32, **e) for e in plain[0]["scan"]] and len(steps) > 1


def test_benchmark_json_is_the_printed_table(results):
    if "chain_throughput" not in results:  # pragma: no cover - run from an installed wheel
        pytest.skip("benchmarks/ not beside the tests")
    record, out, _ = results["chain_throughput"]
    assert [r["n"] for r in record["rows"]] == record["params"]["sizes"] == [4, 8]
    for r in record["rows"]:
        ln = next(x.split() for x in out.splitlines() if x.split()[:2] == [str(r["n"]), str(r["batch"])])
        g = r["gdofs"]
        assert ln[3:6] == [f"{g['einsum']:.3f}", f"{g['rescale_be']:.3f}", f"{g['composed']:.3f}"]
        assert r["batch"] * r["n"] ** 3 == r["dofs"] and g["einsum"] == r["dofs"] / r["seconds"]["einsum"] / 1e9
    fem = results["fem_throughput"][0]
    assert [(r["kind"], r["p"]) for r in fem["rows"]] == [(k, p) for p in (1, 2) for k in ("mass", "poisson")]
    gemm = results["gemm_throughput"][0]
    assert [(r["N"], r["s"]) for r in gemm["rows"]] == [(N, s) for N in (32, 64) for s in (8, 14)]
    assert all(r["gflops"] == 2 * r["N"] ** 3 / r["seconds"] / 1e9 for r in gemm["rows"])
    assert [r["N"] for r in results["gemm_exact"][0]["rows"]] == [32]
    assert [r["n"] for r in results["einsum_overhead"][0]["chain"]] == [4]
    assert [r["data"] for r in results["einsum_default"][0]["rows"]] == ["uniform", "uniform"]
    planners = results["planners"][0]
    assert {(t["n"], t["planner"]) for t in planners["timings"]} == {(4, "greedy"), (4, "optimal")}
    assert [(a["depth"], a["dataset"]) for a in planners["accuracy"]] == [(3, ds) for ds in DATASETS]


# ----- progress bars: on stderr in a terminal, nowhere else ---------------------------------------------------


def test_no_progress_output_without_a_terminal(capsys):
    assert cli.main(["accuracy", "--depths", "3", "--count", "1"]) == 0
    assert capsys.readouterr().err == ""
    done = subprocess.run([sys.executable, "-m", "rnstensor", "accuracy", "gemm", "--size", "4", "32", "3",
                           "--gemm-moduli", "16", "--data", "uniform"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr == "" and "dgemm" in done.stdout


def test_a_bar_appears_in_a_terminal(monkeypatch, capsys):
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    assert cli.main(["accuracy", "--depths", "3,4", "--count", "1"]) == 0
    bar = tty.getvalue()
    steps = 2 * len(DATASETS)  # one step per depth and dataset
    assert "accuracy:" in bar and f"{steps}/{steps}" in bar and "d=4 wide160" in bar
    out = capsys.readouterr().out
    assert "Table 2" in out and "accuracy:" not in out and "\r" not in out  # the tables stay clean

    tty.seek(0), tty.truncate()
    argv = ["accuracy", "gemm", "--size", "4", "32", "3", "--gemm-moduli", "16", "20", "--data", "uniform"]
    assert cli.main(argv) == 0
    assert "table 6:" in tty.getvalue() and "3/3" in tty.getvalue() and "uniform: the exact product" in tty.getvalue()
    assert [ln.split()[1] for ln in capsys.readouterr().out.splitlines() if ln.startswith("uniform")] == \
        ["numpy", "dgemm", "dgemm"]
    tty.seek(0), tty.truncate()
    argv = ["accuracy", "gemm", "--table", "7", "--size", "3", "0", "3", "--ks", "32", "--data", "uniform"]
    assert cli.main(argv) == 0
    assert "table 7:" in tty.getvalue() and "1/1" in tty.getvalue() and "uniform k=32 s=" in tty.getvalue()


def test_a_bar_appears_on_a_real_terminal():
    pty = pytest.importorskip("pty")
    import fcntl
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "rnstensor", "accuracy", "--depths", "3", "--count", "1"],
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out, _ = proc.communicate(timeout=300)
    bar = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, bar
    assert "accuracy:" in bar and "%|" in bar and f"/{len(DATASETS)}" in bar
    assert "Table 2" in out and "%|" not in out


def test_progress_helper_quiet_stand_in_and_missing_tqdm(monkeypatch, capsys):
    from tqdm import tqdm

    tty = FakeTTY()
    with progress_mod.progress(range(4), desc="work", file=tty) as bar:
        assert isinstance(bar, tqdm) and sum(bar) == 6
    assert "work:" in tty.getvalue()
    quiet = io.StringIO()
    with progress_mod.progress(range(4), desc="work", file=quiet) as bar:
        assert not isinstance(bar, tqdm) and list(bar) == [0, 1, 2, 3] and bar.total == 4
        bar.write("a line")
    assert quiet.getvalue() == "" and capsys.readouterr().out == "a line\n"
    # no tqdm: the run works, a terminal is told once how to get bars, a file is told nothing
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setattr(progress_mod, "_hinted", False)
    monkeypatch.setattr(sys, "stderr", tty)
    tty.seek(0), tty.truncate()
    assert cli.main(["accuracy", "--depths", "3", "--count", "1"]) == 0
    assert cli.main(["accuracy", "--depths", "3", "--count", "1"]) == 0
    assert tty.getvalue() == progress_mod.HINT + "\n"
    assert capsys.readouterr().out.count("Table 2") == 2
    monkeypatch.setattr(progress_mod, "_hinted", False)
    with progress_mod.progress(range(2), file=quiet) as bar:
        assert list(bar) == [0, 1]
    assert quiet.getvalue() == ""


def test_verbose_lines_go_above_the_bar_on_stderr(capsys):
    assert cli.main(["accuracy", "--depths", "3", "--count", "1", "-v"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [ln.split(":")[0].strip() for ln in err] == [f"d=3 {ds}" for ds in DATASETS]


def test_benchmark_bars(monkeypatch):
    if not BENCHMARKS.is_dir():  # pragma: no cover
        pytest.skip("benchmarks/ not beside the tests")
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    _bench("bench_gemm", ["--sizes", "16", "--moduli", "10", "12", "--repeat", "1"])
    assert "bench_gemm:" in tty.getvalue() and "2/2" in tty.getvalue()


# ----- plot ------------------------------------------------------------------------------------------------


def _assert_png(path: Path) -> None:
    """A complete PNG with a valid header chunk, of a real size, not one flat colour."""
    from matplotlib.image import imread

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and data[-8:-4] == b"IEND"
    assert zlib.crc32(data[12:29]) == struct.unpack(">I", data[29:33])[0]
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 300 and height >= 200
    img = imread(path)
    assert img.shape[:2] == (height, width) and float(img[..., :3].std()) > 0.01


def test_plot_draws_every_kind(results, tmp_path):
    from rnstensor.plot import FIGURES

    if BENCHMARKS.is_dir():
        assert set(results) == set(FIGURES)  # a result of every kind there is a figure for
    for kind, (_, _, path) in results.items():
        out = tmp_path / f"{kind}.png"
        code, text = _cli(["plot", str(path), "-o", str(out)])
        assert code == 0 and str(out) in text, kind
        _assert_png(out)


def test_moduli_axes_have_integer_ticks(results):
    from rnstensor.plot import figure_of

    for kind in ("gemm_accuracy", "gemm_thresholds", "info"):
        record = json.loads(results[kind][2].read_text())
        for ax in figure_of(record).axes:
            if ax.get_xlabel() == "moduli s":
                ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
                assert ticks and all(float(t).is_integer() for t in ticks), (kind, ticks)


def test_plot_default_output_and_as_a_command(results, tmp_path):
    src = tmp_path / "acc.json"
    src.write_text(results["chain_accuracy"][2].read_text())
    done = subprocess.run([sys.executable, "-m", "rnstensor", "plot", str(src)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    _assert_png(tmp_path / "acc.png")


def test_benchmark_plot_option(results, tmp_path):
    if not BENCHMARKS.is_dir():  # pragma: no cover
        pytest.skip("benchmarks/ not beside the tests")
    out = tmp_path / "chain.png"
    _bench("bench_chain", ["--sizes", "4", "--log2dofs", "8", "--repeat", "1", "--plot", str(out)])
    _assert_png(out)


def test_output_in_a_missing_folder_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    missing = tmp_path / "no such folder" / "out.json"
    for argv in (["accuracy", "--json", str(missing)], ["accuracy", "gemm", "--json", str(missing)],
                 ["demo", "--json", str(missing)], ["info", "--json", str(missing)],
                 ["plot", str(missing), "-o", str(missing.with_suffix(".png"))]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        err = capsys.readouterr().err
        assert "does not exist" in err and ("--json" in err or "--output" in err), argv
    if BENCHMARKS.is_dir():
        with pytest.raises(SystemExit):
            _bench("bench_chain", ["--sizes", "4", "--plot", str(missing.with_suffix(".png"))])
        assert "argument --plot" in capsys.readouterr().err


def test_plot_errors(results, tmp_path, monkeypatch, capsys):
    from rnstensor.plot import FIGURES

    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"kind": "nonsense", "rows": []}))
    assert cli.main(["plot", str(unknown)]) == 2
    err = capsys.readouterr().err
    assert "'nonsense'" in err and all(k in err for k in FIGURES)
    assert cli.main(["plot", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    nokind = tmp_path / "old.json"
    nokind.write_text(json.dumps([{"n": 4}]))
    assert cli.main(["plot", str(nokind)]) == 2
    assert "no 'kind'" in capsys.readouterr().err
    garbage = tmp_path / "garbage.json"
    garbage.write_text("not json")
    assert cli.main(["plot", str(garbage)]) == 2
    assert "not JSON" in capsys.readouterr().err
    # matplotlib missing: the error names the extra, and no image is written
    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, mod, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "none.png"
    assert cli.main(["plot", str(results["info"][2]), "-o", str(out)]) == 2
    assert "pip install 'rnstensor[plot]'" in capsys.readouterr().err and not out.exists()


def test_a_reader_that_leaves_early_is_not_an_error():
    """``rnstensor info | head -1``: the closed pipe ends the command quietly, with status 0."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # each line reaches the pipe as printed, before info's slow parts
    proc = subprocess.Popen([sys.executable, "-m", "rnstensor", "info"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader leaves while info still has lines to print
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0 and first.startswith(b"rnstensor ") and "Traceback" not in err, err


def test_accuracy_argument_errors_show_the_subcommand_usage(capsys):
    with pytest.raises(SystemExit):
        cli.main(["accuracy", "--count", "0"])
    assert "usage: rnstensor accuracy" in capsys.readouterr().err
