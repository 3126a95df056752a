"""Planning chains of mode products: effective operators, drop schedules, method planners."""

from .drops import StepBounds, drop_plan, simulate
from .methods import METHODS, Schedule, plan_schedule
from .operators import PreparedOperator, prepare_operators

__all__ = [
    "PreparedOperator",
    "prepare_operators",
    "drop_plan",
    "simulate",
    "StepBounds",
    "Schedule",
    "plan_schedule",
    "METHODS",
]
