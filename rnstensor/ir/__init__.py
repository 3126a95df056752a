"""The residue program, at the bottom of the house: the steps every front end writes and every interpreter reads."""

from .steps import (CONTRACT_KINDS, Add, Combine, Contract, Contract3M, Decode, Drop, Encode, Fold, Operand, Program,
                    Reencode, Step, Sum)

__all__ = ["Encode", "Operand", "Drop", "Reencode", "Fold", "Sum", "Contract", "Contract3M", "Combine", "Add", "Decode",
           "Step", "Program", "CONTRACT_KINDS"]
