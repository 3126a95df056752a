"""The CUDA kernel modules compile with NVRTC for every target arch (no GPU needed); SASS and resources as intended."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rnstensor.kernels import build
from residues import needs_cuobjdump, needs_nvrtc

PRODUCT_KERNELS = ("rns_product_n8", "rns_product_n16", "rns_product_n32", "rns_product_n64",
                   "rns_product3m_n8", "rns_product3m_n32")


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory):
    # one cache per test session, shared with tests/test_kernels_backend.py
    path = tmp_path_factory.getbasetemp() / "rnstensor-kernel-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def cubins(kernel_cache):
    """Every module for every arch it exists for (``build.modules_for``), compiled once per test session."""
    pairs = [(m, a) for a in build.ARCHS for m in build.modules_for(a)]
    return dict(zip(pairs, build.compile_modules(pairs, cache=kernel_cache)))


BUILT_PAIRS = [(m, a) for a in build.ARCHS for m in sorted(build.modules_for(a))]


@needs_nvrtc
@pytest.mark.parametrize("module, arch", BUILT_PAIRS)
def test_module_compiles(cubins, module, arch):
    built = cubins[(module, arch)]
    data = built.cubin
    assert data[:4] == b"\x7fELF", "NVRTC must produce a cubin (ELF)"
    # the ptxas -v report names every kernel of the module
    assert "Compiling entry function" in built.log


@needs_nvrtc
@pytest.mark.parametrize("arch", build.ARCHS)
def test_ptxas_reports_no_spills(cubins, arch):
    for module in build.modules_for(arch):
        log = cubins[(module, arch)].log
        lines = [ln for ln in log.splitlines() if "spill" in ln]
        assert lines, f"no ptxas resource report for {module} on {arch}"
        for ln in lines:
            assert "0 bytes spill stores, 0 bytes spill loads" in ln, f"{module} on {arch}: {ln.strip()}"


@needs_nvrtc
@needs_cuobjdump
@pytest.mark.parametrize("arch", build.ARCHS)
def test_fused_chain_sass_uses_int8_tensor_cores(cubins, arch):
    # the fused kernel's full-tile products (8 outputs from 5..8 inputs) run mma.sync m16n8k16 .s8
    code = build.sass(cubins[("chain", arch)].path, ["rns_chain_fused"])["rns_chain_fused"]
    imma = [ln for ln in code.splitlines() if "IMMA" in ln]
    assert imma and all("IMMA.16816.S8.S8" in ln for ln in imma), imma[:2]


@needs_nvrtc
@needs_cuobjdump
@pytest.mark.parametrize("arch", build.ARCHS)
def test_product_sass_uses_int8_tensor_cores(cubins, arch):
    code = build.sass(cubins[("product", arch)].path, PRODUCT_KERNELS)
    for k in PRODUCT_KERNELS:
        assert k in code, f"{k} missing from the product cubin for {arch}"
        imma = [ln for ln in code[k].splitlines() if "IMMA" in ln]
        assert imma, f"{k} on {arch} has no IMMA instruction"
        assert all("IMMA.16832.S8.S8" in ln for ln in imma), imma[:2]
        # n8 tiles per k-step: 2 m16 tiles x BN/8 (the 3M kernels run one K loop three times)
        assert len(imma) >= 2 * int(k.rsplit("n", 1)[1]) // 8


@needs_nvrtc
@needs_cuobjdump
@pytest.mark.parametrize("arch", build.ARCHS)
def test_hot_kernels_use_no_local_memory(cubins, arch):
    found = {}
    for module in build.modules_for(arch):
        found.update(build.resource_usage(cubins[(module, arch)].path))
    for k in build.hot_kernels(arch):
        assert k in found, f"{k} not in any module for {arch}"
        r = found[k]
        assert r.local == 0 and r.stack == 0, f"{k} on {arch}: {r}"
        assert r.registers <= 255


@needs_nvrtc
def test_cache_hit_and_key(kernel_cache):
    a = build.compile_module("entry", "sm_80", cache=kernel_cache)
    b = build.compile_module("entry", "sm_80", cache=kernel_cache)
    assert a.path == b.path and a.path.exists()
    # options, arch and sources are part of the key (no compile needed to see it)
    assert build._key("entry", "sm_80", ("-DRNS_TEST_KEY=1",)) != build._key("entry", "sm_80", ())
    assert build._key("entry", "sm_89", ()) != build._key("entry", "sm_80", ())
    assert build._key("product", "sm_80", ()) != build._key("entry", "sm_80", ())
    # no temporary files are left behind
    assert not [p for p in kernel_cache.iterdir() if p.name.endswith(".tmp")]


@needs_nvrtc
def test_compile_modules_side_by_side(tmp_path):
    reqs = [("entry", "sm_80", ("-DRNS_TEST_KEY=1",)), ("entry", "sm_80", ("-DRNS_TEST_KEY=2",)),
            build.ModuleRequest("entry", "sm_80", ("-DRNS_TEST_KEY=1",))]
    got = build.compile_modules(reqs, jobs=2, cache=tmp_path)
    assert [b.path for b in got] == [build.compile_module(r[0], r[1], r[2], cache=tmp_path).path for r in reqs]
    assert got[0].path == got[2].path != got[1].path  # one build per distinct request, in request order
    assert all(b.path.exists() and b.arch == "sm_80" for b in got)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # a failed build in a worker comes back as the caller's error, with the NVRTC log
    with pytest.raises(build.KernelBuildError, match="could not compile"):
        build.compile_modules([("entry", "sm_80", ("-DRNS_TEST_KEY=3", "--no-such-option")),
                               ("entry", "sm_80", ("-DRNS_TEST_KEY=4", "--no-such-option"))], jobs=2, cache=tmp_path)


def test_compile_modules_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match=r"\(name, arch\[, options\[, headers\]\]\)"):
        build.compile_modules(["entry"], cache=tmp_path)
    with pytest.raises(ValueError, match="jobs must be a positive int"):
        build.compile_modules([("entry", "sm_80")], jobs=0, cache=tmp_path)
    with pytest.raises(ValueError, match="built for sm_90a only"):
        build.compile_modules([("product_wgmma", "sm_80")], cache=tmp_path)
    with pytest.raises(ValueError, match="module must be one of"):
        build.compile_modules([("nope", "sm_80")], cache=tmp_path)


def test_bad_names():
    with pytest.raises(ValueError, match="module must be one of"):
        build.compile_module("nope", "sm_80")
    with pytest.raises(ValueError, match="arch must look like"):
        build.compile_module("entry", "ampere")
    # an arch-specific module names the archs it exists for
    with pytest.raises(ValueError, match="built for sm_90a only"):
        build.compile_module("product_wgmma", "sm_80")
    assert "product_wgmma" not in build.modules_for("sm_89") and "product_wgmma" in build.modules_for("sm_90a")
    assert set(build.modules_for("sm_80")) == {m for m in build.MODULES if build.module_archs(m) is None}
    assert build.arch_for_capability(9, 0) == "sm_90a"
    assert build.arch_for_capability(8, 9) == "sm_89"


@needs_nvrtc
def test_cli_build_writes_cubins(tmp_path, kernel_cache):
    env = dict(os.environ, RNSTENSOR_KERNEL_CACHE=str(kernel_cache))
    out = tmp_path / "cubins"
    res = subprocess.run(
        [sys.executable, "-m", "rnstensor.kernels", "build", "--arch", "sm_89", "--out", str(out), "--quiet"],
        capture_output=True, text=True, env=env,
    )
    assert res.returncode == 0, res.stderr
    for m in build.modules_for("sm_89"):
        assert (out / f"{m}.sm_89.cubin").read_bytes()[:4] == b"\x7fELF"
    assert not (out / "product_wgmma.sm_89.cubin").exists()  # sm_90a only


@needs_nvrtc
def test_cached_cubin_and_describe(cubins, kernel_cache, monkeypatch):
    from rnstensor.backends.cuda import describe

    assert build.cached_cubin("product", "sm_90a", cache=kernel_cache) == cubins[("product", "sm_90a")].path
    monkeypatch.setenv("RNSTENSOR_KERNEL_CACHE", str(kernel_cache / "empty"))
    assert build.cached_cubin("product", "sm_90a") is None
    lines = describe()
    assert lines[0].startswith("cuda device:") and any(ln.startswith("nvrtc: ") for ln in lines)
    monkeypatch.setenv("RNSTENSOR_KERNEL_CACHE", str(kernel_cache))
    assert any("built: product, entry" in ln for ln in describe())
