"""einsum and contract_expression: any einsum expression, contracted in the residue domain."""

# The modules, each importing only those above it: parse (subscripts, index sizes, path options), operands
# (operand kinds and checks, one operand's encoding), planner (the bounds-only planner), auto (moduli='auto') and
# classical (the classical default), the mixins of expression (ContractExpression), and api (einsum,
# contract_expression, the cache, tensordot and transpose for opt_einsum's backend='rnstensor').
#
# Re-exported here: every name the former module rnstensor/contract.py defined, private ones included (other
# modules, tests and benchmarks import them from rnstensor.contract), and the errors einsum raises.

from ..errors import EinsumPathError, PlanError, RNSRangeError
from .api import (
    _DECODES,
    _EXPR_CACHE,
    EINSUM_METHODS,
    _cached_expression,
    _check_auto,
    _check_options,
    _check_rtol,
    _result_dtype,
    contract_expression,
    einsum,
    tensordot,
    transpose,
)
from .auto import _CorrectlyRounded
from .classical import _arranged, _classical_pair, _classical_single, _ClassicalDefault, _prepared
from .expression import ContractExpression
from .operands import (
    _as_float,
    _check_finite,
    _encode_leaf,
    _leaf_array,
    _operand_kind,
    _tensor_broadcast,
    _tensor_diagonal,
)
from .parse import (
    _C,
    _C2,
    _LETTERS,
    _label_sizes,
    _parse,
    _parse_subscripts,
    _path_option,
    _shape_of,
    _show,
    _sublist,
    _term,
    _unique,
)
from .planner import (
    _SCANNED,
    _abs_sum_max,
    _alignment_shift,
    _exact_width,
    _Node,
    _Planner,
    _rounds_inside,
    _shared_axes,
)

__all__ = ["einsum", "contract_expression", "ContractExpression", "tensordot", "transpose", "EINSUM_METHODS"]

#: The submodules' examples, for ``doctest.testmod(rnstensor.contract)`` (tests/test_doctests.py names the package,
#: and doctest collects only what a module defines itself).
__test__ = {
    "einsum": einsum,
    "contract_expression": contract_expression,
    "tensordot": tensordot,
    "ContractExpression.error_bound": ContractExpression.error_bound,
}
