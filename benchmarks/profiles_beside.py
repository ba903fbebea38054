"""compare.py's profiles beside the runs: the operators' times measured in every round of a
measured (not emulated) comparison, by the ranks of the run, and the graphpipe plans simulated
again on them.

Why: compare.py plans on one profile taken by a lone process before its runs, and that one
moment of a shared machine's speed then prices every run. On 2 CPU cores the machine drifts by
10-20% from minute to minute, so the simulator's error on a row mixed how well it models a
schedule with how fast the machine happened to be when it was profiled (the whole table read
7-13% fast in one run, 2-9% in the next, the same plans measured alike). Here each round
also profiles, on ``world`` ranks at once (``graphpipe.profile(group=)``: every rank times, the
median over the ranks is kept), at the micro-batch sizes the plans run, in its place in the
round's order; the figure per operator is then the median over the rounds, and each plan is
priced again on it (``graphpipe.retime``: its cut, placement, micro-batching and schedule
unchanged). The plans themselves stay those of the profile before the runs: a planner cannot
wait for the runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import graphpipe
from graphpipe.models import build_model
from graphpipe.profile import median_samples

#: The profile's settings in every round (compare.py's profile before the runs uses the same):
#: 5 timed repeats per operator and size, for a steadier median (the bench Transformer's profile
#: at 4 sizes takes about 3.4 s on one core, against 2.4 s with 3).
REPEATS = 5
WARMUP = 1


def profile_rank(rank: int, world: int, spec: str, sizes: Sequence[int], device: str = "cpu") -> dict[int, list[tuple]]:
    """Every rank profiles ``spec``'s model at ``sizes`` on ``device`` ("cpu", or "cuda": its own
    GPU) at once (the group is joined): per node, its samples as ``(batch_size, forward,
    backward, backward_input, backward_weight)``, the same on every rank (the median over the
    ranks)."""
    import torch.distributed as dist

    model, inputs = build_model(spec)
    graph = graphpipe.trace(model, inputs)
    graphpipe.profile(graph, model, inputs, device=device, batch_sizes=tuple(sizes), repeats=REPEATS,
                      warmup=WARMUP, group=dist.group.WORLD)
    return {i: [(s.batch_size, s.forward_seconds, s.backward_seconds, s.backward_input_seconds,
                 s.backward_weight_seconds) for s in node.profile] for i, node in enumerate(graph.nodes)}


def shard_sizes(plans: Iterable[tuple[int, Sequence[int]]]) -> list[int]:
    """The batch sizes the plans' replicas compute at, from each plan's micro-batch size and its
    stages' replica counts: each stage's largest shard of a micro-batch."""
    return sorted({-(-micro_batch_size // replicas) for micro_batch_size, counts in plans for replicas in counts})


def simulate_beside(spec: str, rounds: Sequence[Mapping[int, Sequence[tuple]]], runs: Mapping[str, tuple[str, str]],
                    devices: Any, optimizer: str) -> dict[str, dict[str, Any]]:
    """Per plan key of ``runs`` (key -> (plan JSON, schedule)): the plan simulated on the median
    over ``rounds`` of the profiles beside the runs, under the very schedule it ran, or why not."""
    model, inputs = build_model(spec)
    graph = graphpipe.trace(model, inputs)
    for node, samples in median_samples(list(rounds)).items():
        graph.set_profile(node, samples)
    out: dict[str, dict[str, Any]] = {}
    for key, (plan_json, schedule) in runs.items():
        try:
            ran = graphpipe.Plan.from_json(plan_json, graph)  # its stage times as planned
            # The schedule the runtime ran, generated from the plan's own times: on other times
            # the zero-bubble schedules may split other backwards or order them otherwise.
            program = graphpipe.schedule(ran, schedule)
            plan = graphpipe.retime(ran, graph, devices)  # the same plan, priced on these profiles
            seconds = graphpipe.simulate(plan, devices, program, optimizer=optimizer).iteration_seconds
            out[key] = {"simulated_iteration_seconds": seconds, "profiles": len(rounds)}
        except Exception as exc:  # the row says why it has no figure
            out[key] = {"unavailable": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return out
