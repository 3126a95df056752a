"""Whether the CUDA backend can run here, and what the device and the kernel cache hold (``rnstensor info``)."""

from __future__ import annotations

from typing import Optional

from ..arrays import device_module as _cupy
from ..kernels import build

__all__ = ["cuda_unavailable_reason", "cuda_available", "device_info", "describe"]


def cuda_unavailable_reason() -> Optional[str]:
    """Why the CUDA backend cannot run here (CuPy missing or failing, no device), or ``None`` if it can."""
    try:
        cp = _cupy()
    except Exception as exc:  # noqa: BLE001 - an import that fails for any reason is the answer
        return f"CuPy does not import: {type(exc).__name__}: {exc}"
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no driver, no device, a broken installation
        return f"CuPy sees no CUDA device: {type(exc).__name__}: {exc}"
    return None if n > 0 else "CuPy sees no CUDA device (0 devices)"


def cuda_available() -> bool:
    """Whether CuPy imports and sees at least one CUDA device (:func:`cuda_unavailable_reason` says why not)."""
    return cuda_unavailable_reason() is None


def device_info() -> dict:
    """The current device's name, compute capability and the arch the kernels are built for (``{}`` without one)."""
    if not cuda_available():
        return {}
    cp = _cupy()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    major, minor = int(props["major"]), int(props["minor"])
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return {"name": name, "capability": f"{major}.{minor}", "arch": build.arch_for_capability(major, minor)}


def describe() -> list[str]:
    """Lines for ``rnstensor info``: the device and its arch, NVRTC, and which kernel modules are built (cached).

    Never compiles and never fails: what is missing is said in the lines.
    """
    lines = []
    info = device_info()
    if info:
        lines.append(f"cuda device: {info['name']} (compute capability {info['capability']}, kernels for {info['arch']})")
        archs = (info["arch"],)
    else:
        try:
            _cupy()
            lines.append("cuda device: none found (CuPy imports, no GPU visible)")
        except RuntimeError:
            lines.append("cuda device: CuPy not installed (pip install 'rnstensor[gpu]')")
        archs = build.ARCHS
    try:
        major, minor = build.nvrtc_version()
        lines.append(f"nvrtc: {major}.{minor}; kernel cache: {build.cache_dir()}")
        for arch in archs:
            mods = build.modules_for(arch)  # arch-specific modules (the sm_90a wgmma kernels) only where they exist
            built = [m for m in mods if build.cached_cubin(m, arch) is not None]
            missing = [m for m in mods if m not in built]
            state = f"built: {', '.join(built) or 'none'}" + (f"; not yet: {', '.join(missing)}" if missing else "")
            lines.append(f"kernels {arch}: {state}")
    except build.KernelBuildError as exc:
        lines.append(f"nvrtc: not available ({exc})")
    return lines
