"""The package carries what its kernels include: run from a checkout and from the installed wheel (``.ci/run``)."""

from __future__ import annotations

import fnmatch
import re
import shutil
from pathlib import Path

import pytest

import rnstensor
from rnstensor.kernels import build, fused

KERNELS = Path(rnstensor.__file__).resolve().parent / "kernels"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
SOURCES = ("*.cu", "*.cuh", "*.cpp", "*.h")


def included_headers() -> set[str]:
    names = set()
    for pattern in SOURCES:
        for src in KERNELS.glob(pattern):
            names.update(re.findall(r'^\s*#\s*include\s+"([^"]+)"', src.read_text(encoding="utf-8"), flags=re.M))
    names.discard(fused.SPEC_HEADER)  # generated per plan and handed to the compiler, never a file
    return names


def test_every_included_file_is_in_the_package():
    names = included_headers()
    assert {"rns_arith.cuh", "simt_runtime.h", "rns_chain_layout.cuh"} <= names
    missing = sorted(n for n in names if not (KERNELS / n).is_file())
    assert not missing, f"kernel sources include files the package lacks: {missing}"


def test_package_data_globs_cover_every_kernel_file():
    if not PYPROJECT.is_file():
        pytest.skip("run from an installed wheel: the previous test checked the installed files themselves")
    text = PYPROJECT.read_text(encoding="utf-8")
    globs = re.search(r'"rnstensor\.kernels" = \[([^\]]*)\]', text)
    assert globs, "pyproject.toml has no package data for rnstensor.kernels"
    patterns = re.findall(r'"([^"]+)"', globs.group(1))
    for name in included_headers() | {p.name for pat in SOURCES for p in KERNELS.glob(pat)}:
        assert any(fnmatch.fnmatch(name, pat) for pat in patterns), f"{name} is not in the wheel's package data"


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")), reason="no C++ compiler")
def test_host_builds_compile_from_the_package(tmp_path):
    """The host builds read only the package's own sources (a fresh cache: nothing reused)."""
    assert build.host_library(cache=tmp_path / "host").is_file()
    assert build.chain_simt_library(cache=tmp_path / "chain").is_file()
