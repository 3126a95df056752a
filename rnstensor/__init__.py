"""rnstensor: float64-accurate tensor contractions with exact INT8 residue arithmetic (Ozaki scheme II)."""

from .backends import available_backends, get_backend, set_backend
from .basis import Basis, int8_pool
from .chain import ChainPlan, mode_chain, plan_chain
from .encode import encode
from .errors import EinsumPathError, PlanError, RNSRangeError
from .contract import ContractExpression, contract_expression, einsum, tensordot, transpose
from .gemm import dgemm, gemm_moduli, matmul, moduli_for_bits, zgemm
from .primitives import (
    add,
    base_extend,
    decode,
    drop,
    fold_pending,
    hadamard,
    mode_product,
    operator_row_sums,
    sub,
    to_int,
)
from .tensor import RNSTensor, Scale

from . import fem  # noqa: E402  (rnstensor.fem: quadrature, tensor bases, mass and Poisson operators)

__version__ = "0.1.0"

__all__ = [
    "Basis",
    "int8_pool",
    "RNSTensor",
    "Scale",
    "encode",
    "mode_product",
    "fold_pending",
    "operator_row_sums",
    "hadamard",
    "add",
    "sub",
    "drop",
    "base_extend",
    "decode",
    "to_int",
    "plan_chain",
    "mode_chain",
    "dgemm",
    "zgemm",
    "matmul",
    "moduli_for_bits",
    "gemm_moduli",
    "einsum",
    "contract_expression",
    "ContractExpression",
    "tensordot",
    "transpose",
    "ChainPlan",
    "RNSRangeError",
    "PlanError",
    "EinsumPathError",
    "get_backend",
    "set_backend",
    "available_backends",
    "fem",
]
