"""The Sphinx site builds with warnings as errors, documents every public name, and its examples run."""

import doctest
import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
# the modules whose __all__ the API reference promises to cover, name by name
REFERENCED = ["rnstensor", "rnstensor.fem", "rnstensor.dask", "rnstensor.backends", "rnstensor.backends.cuda", "rnstensor.errors",
              "rnstensor.progress", "rnstensor.results", "rnstensor.plot", "rnstensor.cli"]

_missing = [m for m in ("sphinx", "numpydoc") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(
    bool(_missing), reason=f"building the docs needs {', '.join(_missing)}: pip install -e '.[docs]'"
)


# the pages' examples compare exception messages too: Sphinx's default flags add IGNORE_EXCEPTION_DETAIL, which
# passes an example whose shown message went stale as long as the exception's type still matches
DOCTEST_FLAGS = doctest.ELLIPSIS | doctest.DONT_ACCEPT_TRUE_FOR_1


def _sphinx(builder: str, src: Path, out: Path, doctrees: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder, "-d", str(doctrees), str(src), str(out)]
    if builder == "doctest":
        cmd[3:3] = ["-D", f"doctest_default_flags={DOCTEST_FLAGS}"]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=src)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The HTML build of a copy of docs/ (autosummary writes its stubs into the copy, not the checkout)."""
    root = tmp_path_factory.mktemp("docs")
    src = root / "src"
    shutil.copytree(DOCS, src, ignore=shutil.ignore_patterns("_build", "generated"))
    html = _sphinx("html", src, root / "html", root / "doctrees")
    return root, html


def test_html_builds_without_warnings(site):
    root, html = site
    assert html.returncode == 0, f"sphinx -W -b html failed:\n{html.stdout}\n{html.stderr}"
    for page in ["index", "how_it_works", "chains", "fem", "gemm", "gpu", "dask", "api"]:
        assert (root / "html" / f"{page}.html").is_file(), page
    # the one picture, copied beside the page that shows it
    assert (root / "html" / "_images" / "pipeline.svg").is_file()
    assert 'src="_images/pipeline.svg"' in (root / "html" / "how_it_works.html").read_text()


def test_reference_has_a_page_for_every_public_name(site):
    root, html = site
    assert html.returncode == 0, html.stderr
    missing = []
    for mod in REFERENCED:
        names = importlib.import_module(mod).__all__
        assert names, mod
        missing += [f"{mod}.{n}" for n in names if not (root / "html" / "generated" / f"{mod}.{n}.html").is_file()]
    assert not missing, f"no API page for {missing}"


# the pages' examples import these (the FEM page: SciPy's CG and a meshio file; the Dask page); all are in 'test'
_EXAMPLE_NEEDS = [m for m in ("dask", "scipy", "meshio") if importlib.util.find_spec(m) is None]


@pytest.mark.skipif(bool(_EXAMPLE_NEEDS), reason=f"the pages' examples need {_EXAMPLE_NEEDS}: pip install -e '.[test]'")
def test_page_examples_pass(site):
    root, html = site
    assert html.returncode == 0, html.stderr
    # reuses the HTML build's doctrees: the sources are read once
    run = _sphinx("doctest", root / "src", root / "doctest", root / "doctrees")
    report = (root / "doctest" / "output.txt").read_text() if (root / "doctest" / "output.txt").is_file() else ""
    assert run.returncode == 0, f"sphinx -b doctest failed:\n{report}\n{run.stdout}\n{run.stderr}"
    summary = report.rpartition("Doctest summary")[2]
    count = re.search(r"^\s*(\d+) tests?$", summary, re.M)
    assert count and int(count.group(1)) >= 50 and re.search(r"^\s*0 failures in tests$", summary, re.M), report


def test_page_examples_compare_exception_messages(tmp_path):
    # a page whose example shows a stale message must fail the doctest run, not pass on the exception type alone
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text('extensions = ["sphinx.ext.doctest"]\n')
    (src / "index.rst").write_text(
        "Stale\n=====\n\n.. doctest::\n\n"
        "   >>> int('x')\n"
        "   Traceback (most recent call last):\n"
        "       ...\n"
        "   ValueError: a message the code no longer gives\n"
    )
    run = _sphinx("doctest", src, tmp_path / "out", tmp_path / "doctrees")
    report = (tmp_path / "out" / "output.txt").read_text()
    assert run.returncode != 0 and "1 failure in tests" in report, report
