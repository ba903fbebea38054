"""A split backward's halves (zero-bubble's I and W) per stage: predicted against measured.

For each model (default: the MMT and the Transformer of compare.py's BENCH_SPECS), on this CPU:
trace, profile (``graphpipe.profile``, which times every operator's I and W as the runtime splits
a backward), plan on 2 and 4 ranks (``--worlds``) (the ``graphpipe`` and ``sequential`` partitioners, 4 micro-batches),
then for every stage print

- the planner's forward F, backward B and B / 2 (how I and W were priced before), and its I and W
  (partition/backward_halves.h, from the profiled operators);
- the same stage measured the runtime's way on one process: its stage module (graphpipe.runtime's
  ``build_stages``) run on one micro-batch, B = one whole backward, I = ``torch.autograd.grad`` of
  its outputs to the activations it receives, recording the gradients where the parameters' paths
  join theirs, W = autograd from those joins to its parameters (``graphpipe._C.backward_input``
  and its ``PendingWeights.run()``: runtime/split_backward.h, what the executor runs;
  all-ones output gradients stand in for the received ones and the loss);
- and the simulated iteration of the plan under ``1f1b``, under ``zb_graph`` with the stages' own
  halves, and under ``zb_graph`` with halves of the backward (the pricing before).

One thread, as compare.py's ranks run. Timings on a shared machine are noisy: each measured
figure is a median of ``--repeats`` runs, timed by default in the thread's CPU time (``--clock
cpu``: autograd runs a CPU backward in the calling thread, and CPU time does not count the time
other processes hold the core, which on a busy 2-core machine moved wall-clock ratios by 20%);
``--clock wall`` times wall-clock seconds.

    python benchmarks/backward_split_bench.py [--models mmt transformer] [--repeats 9] [--clock cpu]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

import graphpipe
from graphpipe.models import build_model
from graphpipe.runtime.stages import build_stages
from graphpipe.trace import iter_tensors, trace_module

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import BENCH_SPECS

MICRO_BATCHES = 4


def node_values(gm: fx.GraphModule, values: list[Any]) -> dict[str, Any]:
    """Every node's value in one forward of the traced model (the stages' received tensors)."""
    run = fx.Interpreter(gm, garbage_collect_values=False)
    with torch.no_grad():
        run.run(*values)
    return {n.name: v for n, v in run.env.items()}


def measure_stage(stage: Any, env: dict[str, Any], repeats: int, clock: Any = time.thread_time) -> dict[str, float]:
    """Median seconds of the stage's whole backward, and of its I and W as the runtime runs them."""
    module = stage.module
    received = {name for names in stage.in_values.values() for name in names}
    order = list(stage.placeholders) + [n for e in sorted(stage.in_values) for n in stage.in_values[e]]
    params = [p for p in module.parameters() if p.requires_grad]

    def forward() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        args, leaves = [], []
        for name in order:
            v = env[name]
            if isinstance(v, torch.Tensor):
                v = v.detach()
                if name in received and v.is_floating_point():  # as the runtime's received tensors
                    v.requires_grad_(True)
                    leaves.append(v)
            args.append(v)
        return [t for t in iter_tensors(module(*args)) if t.requires_grad], leaves

    whole, inputs, weights = [], [], []
    for _ in range(repeats + 1):  # the first run warms up
        outs, _ = forward()
        grads = [torch.ones_like(t) for t in outs]
        start = clock()
        torch.autograd.backward(outs, grads)
        # The executor's backward drops the roots, and with them the graph, before it returns (as
        # I drops them below and W frees what I kept): freeing the graph is part of every half.
        del outs
        whole.append(clock() - start)
        outs, leaves = forward()
        start = clock()
        _, pending = graphpipe._C.backward_input(outs, grads, leaves, params)
        del outs  # as the executor drops the roots after I
        middle = clock()
        pending.run()
        end = clock()
        inputs.append(middle - start)
        weights.append(end - middle)
    return {"B": statistics.median(whole[1:]), "I": statistics.median(inputs[1:]),
            "W": statistics.median(weights[1:])}


def with_halves(plan: Any, graph: Any) -> Any:
    """The plan with its stages' I and W cleared: schedule::backward_split halves the backward."""
    copy = graphpipe.Plan.from_json(plan.to_json(graph), graph)
    stages = copy.stages
    for st in stages:
        st.backward_input_seconds = st.backward_weight_seconds = 0.0
    copy.stages = stages
    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mmt", "transformer"], choices=sorted(BENCH_SPECS))
    parser.add_argument("--repeats", type=int, default=9, help="runs per measured stage figure")
    parser.add_argument("--worlds", nargs="+", type=int, default=[2, 4], help="ranks to plan on")
    parser.add_argument("--profile-repeats", type=int, default=5, help="graphpipe.profile(repeats=...)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="time the backwards in this thread's CPU time or in wall-clock time")
    parser.add_argument("--out", default="results/backward_split_bench.json")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as every rank of compare.py and the runtime tests runs
    torch.manual_seed(0)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    report: list[dict[str, Any]] = []
    for name in args.models:
        spec = BENCH_SPECS[name]
        model, inputs = build_model(spec)
        graph = graphpipe.trace(model, inputs)
        batch = graph.trace_batch_size
        mb = batch // MICRO_BATCHES
        started = time.perf_counter()
        sizes = tuple(b for b in (1, 2, 4, 8, 16, 32) if b <= batch)
        graphpipe.profile(graph, model, inputs, batch_sizes=sizes, repeats=args.profile_repeats, warmup=2)
        profile_seconds = time.perf_counter() - started
        ops = [n for n in graph.nodes if n.op != "input"]
        at = [next(p for p in n.profile if p.batch_size == mb) for n in ops]
        sums = {k: sum(getattr(p, f"{k}_seconds") for p in at)
                for k in ("backward", "backward_input", "backward_weight")}
        print(f"\n## {name} ({spec}), profiled in {profile_seconds:.1f} s; at {mb} rows, sums over "
              f"operators: B {1e3 * sums['backward']:.2f} ms, I {1e3 * sums['backward_input']:.2f}, "
              f"W {1e3 * sums['backward_weight']:.2f} ((I + W) / B = "
              f"{(sums['backward_input'] + sums['backward_weight']) / sums['backward']:.2f})")
        traced = trace_module(model, inputs, None)
        rows = [v[:mb] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch else v
                for v in traced.placeholder_values]
        env = node_values(traced.module, rows)
        for world, partitioner in [(w, p) for w in args.worlds for p in ("graphpipe", "sequential")]:
            devices = graphpipe.devices(world, "cpu")
            devices.relative_speed = 1.0  # this machine's profile as it is
            plan = graphpipe.plan(graph, devices, partitioner, micro_batches=MICRO_BATCHES)
            stages = build_stages(traced.module, plan, graph).stages
            print(f"\n### {partitioner} on {world} ranks: {plan.num_stages} stages, depth {plan.depth}, {plan.num_micro_batches} x "
                  f"{plan.micro_batch_size} rows\n")
            print("| stage | ops | F ms | B ms | B/2 ms | I ms | W ms | measured B ms | measured I ms | "
                  "measured W ms | measured (I + W) / B |")
            print("|---|---|---|---|---|---|---|---|---|---|---|")
            rows_out = []
            for st, module in zip(plan.stages, stages):
                m = measure_stage(module, env, args.repeats, clock)
                row = {"stage": st.id, "operators": len(st.nodes), "F": st.forward_seconds, "B": st.backward_seconds,
                       "I": st.backward_input_seconds, "W": st.backward_weight_seconds,
                       "measured": m}
                rows_out.append(row)
                figures = (st.forward_seconds, st.backward_seconds, st.backward_seconds / 2, st.backward_input_seconds,
                           st.backward_weight_seconds, m["B"], m["I"], m["W"])
                print(f"| {st.id} | {len(st.nodes)} | " + " | ".join(f"{1e3 * x:.2f}" for x in figures) +
                      f" | {(m['I'] + m['W']) / m['B']:.2f} |")
            total = {k: sum(r[k] for r in rows_out) for k in ("B", "I", "W")}
            seen = {k: sum(r["measured"][k] for r in rows_out) for k in ("B", "I", "W")}
            print(f"| all | {sum(r['operators'] for r in rows_out)} | | {1e3 * total['B']:.2f} | "
                  f"{0.5e3 * total['B']:.2f} | {1e3 * total['I']:.2f} | {1e3 * total['W']:.2f} | "
                  f"{1e3 * seen['B']:.2f} | {1e3 * seen['I']:.2f} | {1e3 * seen['W']:.2f} |")
            print(f"\n(I + W) / B over the stages: predicted {(total['I'] + total['W']) / total['B']:.2f}, "
                  f"measured {(seen['I'] + seen['W']) / seen['B']:.2f}")
            sim = {"1f1b": graphpipe.simulate(plan, devices, "1f1b").iteration_seconds,
                   "zb_graph": graphpipe.simulate(plan, devices, "zb_graph").iteration_seconds,
                   "zb_graph_halves": graphpipe.simulate(with_halves(plan, graph), devices,
                                                         "zb_graph").iteration_seconds}
            print(f"\nsimulated iteration: 1f1b {1e3 * sim['1f1b']:.1f} ms, zb_graph {1e3 * sim['zb_graph']:.1f} ms "
                  f"({sim['zb_graph'] / sim['1f1b']:.3f} of 1f1b), zb_graph with halves of B "
                  f"{1e3 * sim['zb_graph_halves']:.1f} ms ({sim['zb_graph_halves'] / sim['1f1b']:.3f})")
            report.append({"model": name, "world": world, "partitioner": partitioner, "micro_batch_size": plan.micro_batch_size,
                           "stages": rows_out, "simulated": sim})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
