"""The training script of the multi-node test (test_multinode.py), run by torchrun on every rank
of two emulated nodes (two_nodes.py):

    torchrun --nnodes 2 --nproc-per-node 2 ... multinode_train.py --out DIR CASE [CASE ...]

For each case, in order: wrap CandleUno (four parallel branches, then a top MLP; float64) with
graphpipe over the case's plan, train STEPS SGD steps on seeded batches, and keep this rank's
losses and parameters. Each rank saves ``DIR/rank{r}.pt`` with its results and where it ran
(node, addresses), for the test to compare with single-process training.

Cases (every plan has a stage edge between the nodes: ranks 0-1 are one node, 2-3 the other):

- ``cross_node_2_stages``: branches 0-1 on rank 0, the rest on rank 2 (ranks 1 and 3 idle).
- ``graph_4_stages``: branches 0-1 | branches 2-3 | top 0-1 | top 2-3 and out on ranks 0..3:
  a stage DAG whose two branch stages, both on node 0, feed stage 2 on node 1.
- ``hybrid_replicas``: the 2-stage split, stage 0 replicated on ranks [0, 1] (node 0),
  stage 1 on ranks [2, 3] (node 1).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch

SPEC = "candle_uno:batch=8"
STEPS = 3
MICRO_BATCHES = 4
LR = 0.05

#: Branches 0 and 1 in stage 0, the rest in stage 1. torch.fx names the inputs' getitems and the
#: concatenation itself; an operator no rule names goes to stage 0 ("").
TWO_STAGES = {"": 0, "getitem_2": 1, "getitem_3": 1, "branches.2": 1, "branches.3": 1, "cat": 1, "top": 1, "out": 1}
FOUR_STAGES = {"": 0, "getitem_2": 1, "getitem_3": 1, "branches.2": 1, "branches.3": 1,
               "cat": 2, "top.0": 2, "top.1": 2, "top.2": 3, "top.3": 3, "out": 3}
CASES = ["cross_node_2_stages", "graph_4_stages", "hybrid_replicas"]
ENV_KEYS = ["RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "GLOO_SOCKET_IFNAME", "GRAPHPIPE_EMULATED_NODE"]


def make_plan(case: str, graph: Any) -> Any:
    """The case's plan for ``graph`` (a Plan or its JSON dict)."""
    from graphpipe.runtime import manual_plan

    if case == "cross_node_2_stages":
        return manual_plan(graph, TWO_STAGES, MICRO_BATCHES, stage_devices=[[0], [2]])
    if case == "graph_4_stages":
        return manual_plan(graph, FOUR_STAGES, MICRO_BATCHES)
    if case == "hybrid_replicas":
        return manual_plan(graph, TWO_STAGES, MICRO_BATCHES, stage_devices=[[0, 1], [2, 3]])
    raise ValueError(f"unknown case {case!r}; known: {CASES}")


def train(case: str) -> dict[str, Any]:
    """Runs on every rank: this rank's losses, parameters, and the plan's placement."""
    import graphpipe
    from graphpipe.models import default_loss
    from graphpipe.testing import seeded_batches

    model, example, batches = seeded_batches(SPEC, STEPS)
    graph = graphpipe.trace(model, example)
    pipe = graphpipe.wrap(model, example, default_loss(SPEC), plan=make_plan(case, graph), timeout=30.0)
    try:
        params = list(pipe.parameters())
        opt = torch.optim.SGD(params, lr=LR) if params else None
        losses = [pipe.step(x, y, optimizer=opt).detach() for x, y in batches]
        return {
            "losses": torch.stack(losses),
            "params": {k: v.detach().clone() for k, v in pipe.named_parameters()},
            "stage_devices": [[int(d) for d in st.devices] for st in pipe.plan.stages],
            "stage_edges": [(int(e.src), int(e.dst)) for e in pipe.plan.edges],
        }
    finally:
        pipe.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for rank{r}.pt")
    parser.add_argument("cases", nargs="+", choices=CASES)
    args = parser.parse_args()

    import torch.distributed as dist

    from graphpipe.testing import run_cases

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = run_cases(train, [(c,) for c in args.cases])
    record = {"rank": rank, "env": {k: os.environ.get(k, "") for k in ENV_KEYS},
              "cases": {case: value for (case,), value in results.items()}}
    torch.save(record, os.path.join(args.out, f"rank{rank}.pt"))
    for case, value in record["cases"].items():
        if "error" in value:
            print(f"rank {rank}: {case}: {value['error']}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
