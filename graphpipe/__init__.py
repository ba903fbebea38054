"""graphpipe: graph pipeline parallelism for multi-branch PyTorch models.

The front door to the C++ core. The data flows one way:
``trace`` (model -> OpGraph) -> ``profile`` (measured operator times) -> ``plan`` (OpGraph ->
stages forming a DAG) -> ``schedule`` / ``simulate`` (per-rank instructions, predicted
iteration) -> ``wrap`` (train the plan on torch.distributed ranks).
"""

from __future__ import annotations

from graphpipe import sync
from graphpipe._ext import _C
from graphpipe.errors import (
    CalibrationError,
    CheckpointError,
    FormatError,
    GraphError,
    GraphpipeError,
    InputError,
    PlanningError,
    ScheduleError,
    TraceError,
)
from graphpipe.fault_tolerance import FaultTolerantPipeline, fault_tolerant
from graphpipe.planner import DEVICE_KINDS, OPTIMIZERS, PARTITIONERS, all_reduce_cost, devices, plan, retime
from graphpipe.profile import profile
from graphpipe.runtime import PeerError, PipelineTimeout, TransferMismatch, WrapOptions, init_distributed, wrap
from graphpipe.simulation import SCHEDULES, schedule, simulate
from graphpipe.trace import trace

OpGraph = _C.OpGraph
Node = _C.Node
ProfileSample = _C.ProfileSample
Plan = _C.Plan
Devices = _C.Devices
#: Fault-tolerant replicas of the whole pipeline, as plan() and simulate() price them.
CrossReplica = _C.CrossReplica
Schedule = _C.Schedule


def __getattr__(name: str) -> object:
    """``load_into_model`` and ``model_state_dict`` (graphpipe.runtime.checkpoint), imported on
    first use: torch.distributed.checkpoint takes a second to import, which every rank, tool and
    test would pay at ``import graphpipe``."""
    if name in ("load_into_model", "model_state_dict"):
        from graphpipe.runtime import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'graphpipe' has no attribute {name!r}")


def set_log_level(level: str) -> None:
    """Sets the C++ core's log level (trace, debug, info, warn, error, off).

    The initial level comes from the environment variable ``GRAPHPIPE_LOG_LEVEL`` (default warn).
    """
    _C.set_log_level(level)


__version__ = "0.1.0"

__all__ = [
    "DEVICE_KINDS",
    "OPTIMIZERS",
    "PARTITIONERS",
    "SCHEDULES",
    "CalibrationError",
    "CheckpointError",
    "CrossReplica",
    "Devices",
    "FaultTolerantPipeline",
    "FormatError",
    "GraphError",
    "GraphpipeError",
    "InputError",
    "Node",
    "OpGraph",
    "PeerError",
    "PipelineTimeout",
    "Plan",
    "PlanningError",
    "ProfileSample",
    "Schedule",
    "ScheduleError",
    "TraceError",
    "TransferMismatch",
    "all_reduce_cost",
    "devices",
    "fault_tolerant",
    "init_distributed",
    "load_into_model",
    "model_state_dict",
    "plan",
    "profile",
    "retime",
    "schedule",
    "set_log_level",
    "simulate",
    "sync",
    "trace",
    "WrapOptions",
    "wrap",
]
