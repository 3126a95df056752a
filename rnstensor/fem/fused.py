"""What a FEM operator hands the fused interpreters: its fusion request and its encoded field, per element.

The backends' ``compile_program`` reads only the request's residue program
(:class:`rnstensor.ir.lower.FusionRequest`), as for a chain plan or an
einsum's mode chains; which of the program's constants are the operator's
field components (``w detJ``, the packed metric ``G``) and the encoded field
the interpreter reads per element are the operator's to say, here.
"""

from __future__ import annotations

import numpy as np

from ..arrays import array_module
from ..ir.lower import FusionRequest

__all__ = ["fusion_request", "operator_field", "field_components"]


def field_components(op) -> dict:
    """The operator's field keys -> their component index in :func:`operator_field`'s array."""
    return {"W": 0} if op.kind == "mass" else {("G", c): c for c in range(3 * (op.basis.dim - 1))}


def fusion_request(op) -> FusionRequest:
    """The FEM operator ``op``'s program as a fusion request: one element's ``(P,) * dim`` nodal values in, its
    Hadamard products reading the field components (:func:`operator_field`) per element.

    Raises
    ------
    ValueError
        If ``op`` does not run in residues from encode to decode (``method`` other than ``'rescale_be'``).
    """
    if getattr(op, "method", None) != "rescale_be":
        raise ValueError(f"this operator cannot run fused: only method='rescale_be' runs in residues from encode to "
                         f"decode (this operator: {op.method!r})")
    comps = field_components(op)
    fields = {i: comps[key] for i, key in enumerate(op.program_constants_keys()) if key in comps}
    return FusionRequest(op.program, (op.basis.P,) * op.basis.dim, op.program_constants(), nbatch=1,
                         fields=fields, ncomp=len(comps), nq=op.basis.Q**op.basis.dim)


def operator_field(op) -> tuple[np.ndarray, np.ndarray]:
    """The operator's encoded field as the fused interpreters read it, ``(planes, nelem, components, Q**dim)`` int8
    on the basis moduli, and its exponent per element (int32), where the field was encoded (NumPy or CuPy)."""
    if op.kind == "mass":
        T = op._residue_fields()["W"]
    else:
        op._residue_fields()
        T = op._Gres[0]
    res, scale_exp = T.residues, T.exponent()
    xp = array_module(res)
    L, E = res.shape[:2]
    field = xp.ascontiguousarray(res.reshape(L, E, len(field_components(op)), -1))
    fexp = xp.ascontiguousarray(xp.broadcast_to(scale_exp.reshape(-1), (E,)).astype(np.int32))
    return field, fexp
