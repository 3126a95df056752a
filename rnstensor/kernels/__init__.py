"""CUDA C++ kernel sources (``*.cu``, ``*.cuh``) and their NVRTC build, cache and inspection (no GPU needed)."""

from .build import (
    ARCHS,
    HOT_KERNELS,
    MODULES,
    KernelBuildError,
    ResourceUsage,
    arch_for_capability,
    build_all,
    cache_dir,
    compile_module,
    compile_modules,
    find_tool,
    host_library,
    nvrtc_version,
    resource_usage,
    sass,
    source_dir,
)

__all__ = [
    "ARCHS",
    "HOT_KERNELS",
    "MODULES",
    "KernelBuildError",
    "ResourceUsage",
    "arch_for_capability",
    "build_all",
    "cache_dir",
    "compile_module",
    "compile_modules",
    "find_tool",
    "host_library",
    "nvrtc_version",
    "resource_usage",
    "sass",
    "source_dir",
]
