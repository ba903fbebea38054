"""Exceptions raised by graphpipe: the C++ core's classes, plus the Python front end's own."""

from __future__ import annotations

from graphpipe._ext import _C

#: Base class of every graphpipe error (a RuntimeError).
GraphpipeError = _C.GraphpipeError
#: A graph that breaks an invariant (cycle, dangling edge, unreachable output).
GraphError = _C.GraphError
#: A malformed or inconsistent file (graph, plan, schedule, device description).
FormatError = _C.FormatError
#: A request the planner cannot satisfy (model does not fit, more stages than operators).
PlanningError = _C.PlanningError
#: A schedule that is malformed, or that would hang (the report names the ranks and instructions).
ScheduleError = _C.ScheduleError


class TraceError(GraphpipeError):
    """The model could not be traced into an operator graph."""


class InputError(GraphpipeError, TypeError):
    """Example inputs or model outputs of a kind graphpipe cannot handle."""


class CheckpointError(GraphpipeError):
    """A checkpoint could not be written (``Pipeline.save``): raised on every rank, naming the
    rank and its cause, while every rank is alive and in step. The checkpoint at the path, if
    any, is unchanged, and the pipeline can go on training."""


class CalibrationError(GraphpipeError):
    """A measurement of this machine (graphpipe.calibration) that came out inconsistent every
    time it was taken: a large message no slower than a small one, say. Its figures would
    mislead the planner and the simulator, so none are returned."""


__all__ = [
    "GraphpipeError",
    "GraphError",
    "FormatError",
    "PlanningError",
    "ScheduleError",
    "TraceError",
    "InputError",
    "CheckpointError",
    "CalibrationError",
]
