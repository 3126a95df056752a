"""The runtime between the front ends and the backends: what every entry point does alike once it has a program."""

from .epilogue import exact_combination, exact_parts, ieee_rows, needs_exact_epilogue, plus_beta_c, zero_parts

__all__ = ["exact_combination", "exact_parts", "ieee_rows", "needs_exact_epilogue", "plus_beta_c", "zero_parts"]
