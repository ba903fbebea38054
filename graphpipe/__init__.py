"""graphpipe: graph pipeline parallelism for multi-branch PyTorch models.

The front door to the C++ core: trace a model into an operator DAG (:func:`trace`), measure its
operators (:func:`profile`), and inspect the result. Partitioning, scheduling, simulation and the
runtime build on the same graph.
"""

from __future__ import annotations

from graphpipe._ext import _C
from graphpipe.errors import (
    FormatError,
    GraphError,
    GraphpipeError,
    InputError,
    PlanningError,
    TraceError,
)
from graphpipe.profile import profile  # noqa: F401
from graphpipe.trace import trace

OpGraph = _C.OpGraph
Node = _C.Node
ProfileSample = _C.ProfileSample


def set_log_level(level: str) -> None:
    """Sets the C++ core's log level (trace, debug, info, warn, error, off).

    The initial level comes from the environment variable ``GRAPHPIPE_LOG_LEVEL`` (default warn).
    """
    _C.set_log_level(level)


__version__ = "0.1.0"

__all__ = [
    "FormatError",
    "GraphError",
    "GraphpipeError",
    "InputError",
    "Node",
    "OpGraph",
    "PlanningError",
    "ProfileSample",
    "TraceError",
    "profile",
    "set_log_level",
    "trace",
]

from graphpipe.runtime import PeerError, PipelineTimeout, TransferMismatch, wrap  # noqa: E402

__all__ += ["PeerError", "PipelineTimeout", "TransferMismatch", "wrap"]
