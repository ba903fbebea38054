"""The runtime's Python side: stage modules from a plan, micro-batching, graphpipe.wrap."""

from __future__ import annotations

from graphpipe._ext import _C
from graphpipe.runtime.launch import init_distributed
from graphpipe.runtime.microbatch import merge, split
from graphpipe.runtime.options import DEFAULT_TIMEOUT, WrapOptions
from graphpipe.runtime.pipeline import Pipeline, wrap
from graphpipe.runtime.plan import load_plan, manual_plan, stage_assignment
from graphpipe.runtime.stages import build_stages

#: A peer rank died or failed during a transfer (the message names the peer, instruction, edge).
PeerError = _C.PeerError
#: A transfer did not complete within the timeout (a PeerError); the process group is unusable.
PipelineTimeout = _C.PipelineTimeout
#: A stage produced tensors that differ from what its stage edge declares.
TransferMismatch = _C.TransferMismatch

__all__ = [
    "DEFAULT_TIMEOUT",
    "WrapOptions",
    "PeerError",
    "PipelineTimeout",
    "TransferMismatch",
    "Pipeline",
    "build_stages",
    "init_distributed",
    "load_plan",
    "manual_plan",
    "stage_assignment",
    "merge",
    "split",
    "wrap",
]
