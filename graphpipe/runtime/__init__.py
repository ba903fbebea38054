"""The runtime's Python side: stage modules from a plan, micro-batching, graphpipe.wrap."""

from __future__ import annotations

from graphpipe.runtime.microbatch import merge, split
from graphpipe.runtime.pipeline import DEFAULT_TIMEOUT, Pipeline, wrap
from graphpipe.runtime.plan import manual_plan, resolve_plan
from graphpipe.runtime.stages import build_stages

__all__ = [
    "DEFAULT_TIMEOUT",
    "Pipeline",
    "build_stages",
    "manual_plan",
    "merge",
    "resolve_plan",
    "split",
    "wrap",
]
