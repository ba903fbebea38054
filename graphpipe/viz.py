"""Pictures of pipelines: Gantt charts, stage DAG drawings and Chrome traces of an iteration.

Everything here takes plain data: a simulation result (``_C.SimResult``, or its ``to_dict()``),
or a list of task dicts with the keys ``name, kind, rank, peer, stage, micro_batch, edge, start,
end`` (seconds). The runtime's measured traces use the same task dicts, so a prediction and a
measurement draw and compare the same way.

Chrome trace format (``chrome_trace``; opens in https://ui.perfetto.dev and chrome://tracing)::

    {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "rank 1"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 0, "args": {"name": "compute"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "transfers"}},
        {"ph": "X", "name": "F3 s1", "cat": "forward", "pid": 1, "tid": 0,
         "ts": 1250.0, "dur": 500.0,
         "args": {"stage": 1, "micro_batch": 3, "kind": "forward", "edge": -1, "peer": -1}},
        ...],
     "displayTimeUnit": "ms",
     "otherData": {"source": "graphpipe simulation", "iteration_seconds": 0.012, ...}}

One complete ("X") event per task: ``pid`` is the rank, ``tid`` 0 for computation (forward,
backward, optimizer) and 1 for communication (transfers and all-reduces), ``ts``/``dur`` in microseconds from the start of the
iteration. Names: ``F<mb> s<stage>`` forward, ``B<mb> s<stage>`` backward, ``A<mb> e<edge>``
activation transfer, ``G<mb> e<edge>`` gradient transfer, ``OPT s<stage>`` optimizer step, ``AR s<stage>`` a replicated stage's gradient sum,
``I<mb> s<stage>`` / ``W<mb> s<stage>`` a split backward's input- and weight-gradient halves,
``C<bucket> s<stage>`` compressing a gradient bucket (top-k, PowerSGD), ``AVG s<stage>`` local
SGD's parameter averaging, ``XR r<rank>`` a rank's average across fault-tolerant replicas. A transfer is drawn on its sending rank; ``args.peer`` is the
receiving rank. ``args.kind`` is one of ``forward, backward, activation, gradient, optimizer,
all_reduce, backward_input, backward_weight, compress, average, cross_replica``. ``read_chrome_trace`` turns such a
file back into task dicts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "TASK_KINDS",
    "tasks_of",
    "gantt_png",
    "stage_dag_png",
    "chrome_trace",
    "write_chrome_trace",
    "read_chrome_trace",
]

#: Task kinds and their colours in the pictures.
TASK_KINDS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "activation": "#8C8C8C",
    "gradient": "#B0B0B0",
    "optimizer": "#8172B3",
    "all_reduce": "#55A868",
    "backward_input": "#C44E52",
    "backward_weight": "#DA8BC3",
    "compress": "#937860",
    "average": "#2F7F4F",
    "cross_replica": "#64B5CD",
}
_TASK_KEYS = ("name", "kind", "rank", "peer", "stage", "micro_batch", "edge", "start", "end")
_TRANSFERS = ("activation", "gradient")
# Drawn on a rank's thin communication lane: transfers, a replicated stage's gradient sum,
# local SGD's parameter averaging and the average across fault-tolerant replicas.
_COMMUNICATION = (*_TRANSFERS, "all_reduce", "average", "cross_replica")


def tasks_of(result: Any) -> list[dict]:
    """Task dicts of a simulation result, its ``to_dict()``, or a list of tasks."""
    if hasattr(result, "to_dict"):
        result = result.to_dict()
    if isinstance(result, Mapping):
        result = result["tasks"]
    tasks = []
    for task in result:
        if not isinstance(task, Mapping):
            task = task.to_dict() if hasattr(task, "to_dict") else {k: getattr(task, k) for k in _TASK_KEYS}
        missing = [k for k in ("kind", "rank", "start", "end") if k not in task]
        if missing:
            raise ValueError(f"task {task!r} lacks {', '.join(missing)}")
        if task["kind"] not in TASK_KINDS:
            raise ValueError(f"task kind {task['kind']!r} is not one of {', '.join(TASK_KINDS)}")
        tasks.append(dict(task))
    return tasks


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    return plt


def gantt_png(result: Any, path: str | os.PathLike, *, title: str | None = None,
              transfers: bool = True, label_micro_batches: bool = True) -> str:
    """Draws ranks over time: forwards, backwards, optimizer steps, and (on a thin lane under each
    rank) transfers, each coloured by kind and labelled with its micro-batch where it fits."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    tasks = tasks_of(result)
    ranks = sorted({t["rank"] for t in tasks} | {t.get("peer", -1) for t in tasks} - {-1, None})
    if not ranks:
        ranks = [0]
    row = {r: i for i, r in enumerate(ranks)}
    end = max((t["end"] for t in tasks), default=1.0) or 1.0
    per_rank = sum(t["kind"] not in _COMMUNICATION for t in tasks) / len(ranks)
    fig, ax = plt.subplots(figsize=(min(24.0, max(8.0, 0.2 * per_rank)), 1.2 + 0.55 * len(ranks)))
    for t in tasks:
        width = t["end"] - t["start"]
        y = row[t["rank"]]
        if t["kind"] in _COMMUNICATION:
            if not transfers:
                continue
            ax.broken_barh([(t["start"], width)], (y + 0.28, 0.14), facecolors=TASK_KINDS[t["kind"]])
            continue
        ax.broken_barh([(t["start"], width)], (y - 0.3, 0.56), facecolors=TASK_KINDS[t["kind"]],
                       edgecolors="white", linewidth=0.4)
        mb = t.get("micro_batch", -1)
        if label_micro_batches and mb is not None and mb >= 0 and width > end / 120:
            ax.text(t["start"] + width / 2, y - 0.02, str(mb), ha="center", va="center",
                    fontsize=6 if width < end / 40 else 8, color="white")
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.set_ylim(len(ranks) - 0.5, -0.5)  # rank 0 on top
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel("seconds")
    kinds = [k for k in TASK_KINDS if any(t["kind"] == k for t in tasks)]
    ax.legend(handles=[Patch(color=TASK_KINDS[k], label=k) for k in kinds], loc="lower right",
              bbox_to_anchor=(1.0, 1.0), ncol=len(kinds) or 1, fontsize=8, frameon=False)
    if title:
        ax.set_title(title, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def _stage_graph(plan: Any) -> tuple[int, list[tuple[int, int]], list[str]]:
    """(number of stages, edges, node labels) of a plan, a plan dict or a schedule."""
    if isinstance(plan, Mapping):
        stages = plan.get("stages", [])
        edges = [(e["src"], e["dst"]) for e in plan.get("edges", [])]
        labels = []
        for i, st in enumerate(stages):
            devices = st.get("devices", []) if isinstance(st, Mapping) else []
            labels.append(f"s{i}" + (f"\nrank {devices[0]}" if devices else ""))
        return len(stages), edges, labels
    if hasattr(plan, "stage_ranks"):  # a Schedule
        edges = [tuple(e) for e in plan.edges]
        return len(plan.stage_ranks), edges, [
            f"s{i}\nrank{'s' if len(r) > 1 else ''} {','.join(map(str, r))}" for i, r in enumerate(plan.stage_ranks)]
    stages = list(plan.stages)
    edges = [(e.src, e.dst) for e in plan.edges]
    labels = [f"s{i}" + (f"\nrank {st.devices[0]}" if len(st.devices) else "") for i, st in enumerate(stages)]
    return len(stages), edges, labels


def stage_dag_png(plan: Any, path: str | os.PathLike, *, title: str | None = None,
                  labels: Sequence[str] | None = None) -> str:
    """Draws the stage DAG left to right: column = longest path from a source, so parallel
    branches stand one above the other. Takes a Plan, a plan dict (its JSON) or a Schedule."""
    plt = _pyplot()

    n, edges, default_labels = _stage_graph(plan)
    labels = list(labels) if labels is not None else default_labels
    depth = [0] * n
    for src, dst in sorted(edges, key=lambda e: e[1]):  # stages are numbered topologically
        depth[dst] = max(depth[dst], depth[src] + 1)
    columns: dict[int, list[int]] = {}
    for s in range(n):
        columns.setdefault(depth[s], []).append(s)
    pos = {}
    for x, members in columns.items():
        for k, s in enumerate(members):
            pos[s] = (x, (len(members) - 1) / 2 - k)
    width = max(columns, default=0) + 1
    height = max((len(m) for m in columns.values()), default=1)
    fig, ax = plt.subplots(figsize=(1.6 + 1.6 * width, 1.0 + 0.9 * height))
    for src, dst in edges:
        ax.annotate("", xy=pos[dst], xytext=pos[src],
                    arrowprops=dict(arrowstyle="-|>", color="#555555", shrinkA=16, shrinkB=16,
                                    connectionstyle="arc3,rad=0.08"))
    for s in range(n):
        x, y = pos[s]
        ax.text(x, y, labels[s], ha="center", va="center", fontsize=8,
                bbox=dict(boxstyle="round,pad=0.4", facecolor="#DCE6F2", edgecolor="#4C72B0"))
    ax.set_xlim(-0.6, width - 0.4)
    ax.set_ylim(-height / 2 - 0.2, height / 2 + 0.2)
    ax.axis("off")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def chrome_trace(result: Any, *, source: str = "graphpipe simulation") -> dict:
    """The Chrome trace (format in the module docstring) of a simulation result or task list."""
    tasks = tasks_of(result)
    events: list[dict] = []
    for r in sorted({t["rank"] for t in tasks} | {t.get("peer", -1) for t in tasks} - {-1, None}):
        events.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
        for tid, name in ((0, "compute"), (1, "transfers")):
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": name}})
    for t in tasks:
        transfer = t["kind"] in _COMMUNICATION
        events.append({
            "ph": "X",
            "name": t.get("name") or t["kind"],
            "cat": t["kind"],
            "pid": t["rank"],
            "tid": 1 if transfer else 0,
            "ts": t["start"] * 1e6,
            "dur": (t["end"] - t["start"]) * 1e6,
            "args": {
                "stage": t.get("stage", -1),
                "micro_batch": t.get("micro_batch", -1),
                "kind": t["kind"],
                "edge": t.get("edge", -1),
                "peer": t.get("peer", -1),
            },
        })
    other: dict[str, Any] = {"source": source}
    summary = result.to_dict() if hasattr(result, "to_dict") else result
    if isinstance(summary, Mapping):
        for key in ("iteration_seconds", "samples_per_second", "overlap"):
            if key in summary:
                other[key] = summary[key]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_chrome_trace(result: Any, path: str | os.PathLike, *, source: str = "graphpipe simulation") -> str:
    """Writes ``chrome_trace(result)`` as JSON to ``path``."""
    with open(path, "w") as f:
        json.dump(chrome_trace(result, source=source), f)
    return str(path)


def read_chrome_trace(path_or_trace: str | os.PathLike | Mapping) -> list[dict]:
    """Task dicts (seconds) back from a Chrome trace written by graphpipe (simulated or measured)."""
    trace = path_or_trace
    if not isinstance(trace, Mapping):
        with open(trace) as f:
            trace = json.load(f)
    tasks = []
    for e in trace["traceEvents"]:
        if e.get("ph") != "X":
            continue
        args = e.get("args", {})
        tasks.append({
            "name": e["name"],
            "kind": args.get("kind", e.get("cat")),
            "rank": e["pid"],
            "peer": args.get("peer", -1),
            "stage": args.get("stage", -1),
            "micro_batch": args.get("micro_batch", -1),
            "edge": args.get("edge", -1),
            "start": e["ts"] / 1e6,
            "end": (e["ts"] + e["dur"]) / 1e6,
        })
    return tasks
