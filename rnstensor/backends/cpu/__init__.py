"""The CPU backend: numpy for layout and BLAS, numba for fused exact residue kernels."""

# The modules, each importing only those above it:
#   warm         which kernels a call compiles (a small call on a cold kernel takes the reference path)
#   common       sizes, the thread launcher, numba array intrinsics, exact reductions, mixed-radix digits
#   encoding, products, drop_extend, decoding, magnitudes     the kernels of each primitive (on common)
#   fused        the fused interpreter of whole programs (on the primitives' block kernels)
#   wide, gemm   the exact GEMM engine on wide moduli (wide: its numba passes; gemm: plan, memory, BLAS threads)
#   combine      the exact GEMM epilogue's residues (alpha S 2**s1 + beta c 2**s2 per modulus, one pass)
#   backend      CpuBackend (fused and gemm loaded on first use)

from .backend import CpuBackend
from .magnitudes import chain_magnitude_stats, chain_stats_warm, encode_magnitudes, mode_magnitudes

__all__ = ["CpuBackend", "mode_magnitudes", "encode_magnitudes", "chain_magnitude_stats", "chain_stats_warm"]
