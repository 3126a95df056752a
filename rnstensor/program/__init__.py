"""The residue program: the interpreters of the one representation (:mod:`rnstensor.ir`) (execution, the running error analysis)."""

from .execute import Value, execute
from ..ir import (CONTRACT_KINDS, Add, Combine, Contract, Contract3M, Decode, Drop, Encode, Fold, Operand, Program,
                 Reencode, Sum)

__all__ = ["Program", "Encode", "Operand", "Drop", "Reencode", "Fold", "Sum", "Contract", "Contract3M", "Combine",
           "Add", "Decode", "CONTRACT_KINDS", "Value", "execute"]
