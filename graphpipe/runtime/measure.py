"""Measured traces: a step's per-instruction timestamps as the simulator's task dicts, merged over
ranks, and a measured-vs-predicted table per stage.

Task dicts are those of graphpipe.viz (``name, kind, rank, peer, stage, micro_batch, edge, start,
end``), so ``graphpipe.viz.chrome_trace(tasks, source="graphpipe runtime")`` draws a measurement
exactly like a simulation. Times are seconds from the start of each rank's ``step``; ranks start
their step within a few milliseconds of each other (they all wait on the same first transfers),
which is the alignment error of the merged trace. A transfer is drawn on its sending rank
(``peer`` is the receiver) over the span of the communication batch it was posted in.
"""

from __future__ import annotations

from typing import Any

from graphpipe._ext import _C

__all__ = ["tasks_from_timings", "stage_report"]

_Op = _C.OpKind
# The instructions drawn, by kind (receives are folded into their sends), as viz kinds.
_KINDS = {_Op.forward: "forward", _Op.backward: "backward", _Op.send_activation: "activation",
          _Op.send_gradient: "gradient", _Op.optimizer_step: "optimizer", _Op.all_reduce: "all_reduce",
          _Op.backward_input: "backward_input", _Op.backward_weight: "backward_weight"}


def tasks_from_timings(
    timings: list[Any], rank: int, edges: list[tuple[int, int]], stage_ranks: list[list[int]]
) -> list[dict[str, Any]]:
    """Task dicts of one rank's recorded instructions (``_C.InstructionTiming``s, which carry
    the instruction's kind, stage, micro-batch and edge)."""
    tasks = []
    for t in timings:
        kind = _KINDS.get(t.kind)
        if kind is None:
            continue
        stage, mb, edge = int(t.stage), int(t.micro_batch), int(t.edge)
        peer = -1
        if t.kind == _Op.send_activation:
            peer = stage_ranks[edges[edge][1]][0]
        elif t.kind == _Op.send_gradient:
            peer = stage_ranks[edges[edge][0]][0]
        names = {"forward": f"F{mb} s{stage}", "backward": f"B{mb} s{stage}", "activation": f"A{mb} e{edge}",
                 "gradient": f"G{mb} e{edge}", "optimizer": f"OPT s{stage}",
                 "all_reduce": f"AR s{stage}", "backward_input": f"I{mb} s{stage}",
                 "backward_weight": f"W{mb} s{stage}"}
        tasks.append({"name": names[kind], "kind": kind, "rank": rank, "peer": peer, "stage": stage,
                      "micro_batch": mb, "edge": edge, "start": float(t.start), "end": float(t.end)})
    return tasks


def stage_report(measured: list[dict[str, Any]], predicted: Any = None) -> str:
    """Per stage: measured forward and backward seconds (sum over micro-batches) beside the
    prediction's (a simulation result or its task dicts), and the iteration time of each."""
    def per_stage(tasks: list[dict[str, Any]]) -> tuple[dict[int, dict[str, float]], float]:
        out: dict[int, dict[str, float]] = {}
        for t in tasks:
            if t["kind"] in ("forward", "backward", "backward_input", "backward_weight"):
                row = out.setdefault(int(t["stage"]), {"forward": 0.0, "backward": 0.0})
                row["forward" if t["kind"] == "forward" else "backward"] += t["end"] - t["start"]
        span = max((t["end"] for t in tasks), default=0.0) - min((t["start"] for t in tasks), default=0.0)
        return out, span

    meas, meas_span = per_stage(measured)
    pred: dict[int, dict[str, float]] = {}
    pred_span = float("nan")
    if predicted is not None:
        from graphpipe.viz import tasks_of

        pred, pred_span = per_stage(tasks_of(predicted))
        pred_span = getattr(predicted, "iteration_seconds", pred_span)
    lines = [f"{'stage':>5} | {'fwd meas':>9} {'fwd pred':>9} | {'bwd meas':>9} {'bwd pred':>9}  (seconds per iteration)"]
    for s in sorted(set(meas) | set(pred)):
        m = meas.get(s, {"forward": 0.0, "backward": 0.0})
        p = pred.get(s, {"forward": float("nan"), "backward": float("nan")})
        lines.append(f"{s:>5} | {m['forward']:9.4f} {p['forward']:9.4f} | {m['backward']:9.4f} {p['backward']:9.4f}")
    lines.append(f"iteration: measured {meas_span:.4f} s, predicted {pred_span:.4f} s")
    return "\n".join(lines)


class SavedActivations:
    """Counts the bytes autograd keeps for the backward (the activations a stage stashes), live
    and at the peak, through ``torch.autograd.graph.saved_tensors_hooks``: each saved tensor is
    wrapped in a holder whose release, when autograd frees the graph (after a B, or after a W
    for a split backward), subtracts its bytes. Parameters are left out (they are not stashed
    per micro-batch). Use as a context manager around the stage's forward calls."""

    class _Held:
        __slots__ = ("tensor", "nbytes", "owner", "__weakref__")

        def __init__(self, tensor: Any, nbytes: int, owner: SavedActivations) -> None:
            self.tensor, self.nbytes, self.owner = tensor, nbytes, owner

        def __del__(self) -> None:
            self.owner.live -= self.nbytes

    def __init__(self, parameters: Any = ()) -> None:
        self.live = 0
        self.peak = 0
        self._params = {id(p) for p in parameters}

    def _pack(self, tensor: Any) -> Any:
        if id(tensor) in self._params:
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        return SavedActivations._Held(tensor, nbytes, self)

    @staticmethod
    def _unpack(held: Any) -> Any:
        return held.tensor if isinstance(held, SavedActivations._Held) else held

    def hooks(self) -> Any:
        """The context manager that routes this stage's saved tensors through the counter."""
        import torch

        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
