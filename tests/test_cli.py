"""The command line: ``rnstensor info`` reports what is installed and working."""

import importlib.util
import subprocess
import sys

import pytest

from rnstensor import cli


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


def test_info_names_only_extras_that_exist():
    import tomllib
    from pathlib import Path

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


def test_info_json(tmp_path, capsys):
    import json

    from rnstensor.basis import Basis, int8_pool

    path = tmp_path / "info.json"
    assert cli.main(["info", "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    assert record["int8_pool"] == [int(p) for p in int8_pool()]
    assert [b["s"] for b in record["bases"]] == list(range(1, len(int8_pool()) + 1))
    assert all(b["log2_product"] == Basis.int8(b["s"]).log2_product for b in record["bases"])
    parts = {p["part"]: p for p in record["optional"]}
    assert set(parts) == {"numba"} | {m for m, _, _ in cli.OPTIONAL_PARTS}
    for module, _, _ in cli.OPTIONAL_PARTS:
        assert parts[module]["working"] == (importlib.util.find_spec(module) is not None), module
    assert parts["numba"]["working"] is True
    assert str(path) in capsys.readouterr().out


def test_info_runs_as_a_command():
    done = subprocess.run([sys.executable, "-m", "rnstensor", "info"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "numba" in done.stdout and "cuda device:" in done.stdout
