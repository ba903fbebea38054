"""Planning benchmark: how long each partitioner takes, and what it predicts on the paper's models.

Part 1 times ``_C.partition`` for every partitioner on synthetic operator graphs of 100, 1,000
and 10,000 operators (a random series-parallel graph and a random DAG with local edges, seeded)
onto 4 to 64 stages of V100-class devices (memory limit lifted: only planning speed counts). Part 2 plans the paper-size multi-modal Transformer,
DLRM and CANDLE-Uno (traced on the meta device) onto 8 and 32 V100-class devices and compares
the graph partitioners with the sequential (chain) baseline: pipeline depth, bottleneck time per
sample, predicted step, and first-stage activation memory (activations of one micro-batch x the
micro-batches it holds in flight). Each planner picks its own micro-batch size, and the graph
plan spends the memory its smaller depth frees on larger micro-batches, so the table also has
graphpipe re-planned at the sequential plan's micro-batch size ("@seq mb"): first-stage
activation memory like for like. A verdict line per model and device count says whether the
graph plan is shallower, has the lower bottleneck, the lower first-stage activation memory at
the same micro-batch size, and stages that run in parallel (two stages neither of which reaches
the other in the stage graph).

Part 3 (replicated stages, ``replicate=True``; docs/design.md §4.8) times every partitioner
planning the three paper-size models onto 64 V100-class devices (8 per node), where stages may
take several devices as data-parallel replicas, with the plan it makes (stages, devices used,
widest stage, predicted step). The budget is 10 s per model and partitioner.

All tables are printed; everything is written to results/plan_bench.json.

    python3 benchmarks/plan_bench.py [--quick] [--replicated-only] [--out results/plan_bench.json]

``--speed`` times only the planning-speed goals, each ``--repeats`` times (median and every
run reported), and writes results/plan_speed.json: the paper-size MMT, mini-batch 256, onto 64
V100-class devices with 8 per node (goal 2 s each) planned by ``partition`` with replicas, by
``graphpipe.plan(replicate=True)`` and by ``graphpipe.plan``'s default (replicate not given: the
widened search and the baselines' searches; csrc/planner/default_search.h), and the
10,000-operator series-parallel graph of part 1 onto 64 stages (goal 1 s; onto 4 stages beside
it, no goal).

    python3 benchmarks/plan_bench.py --speed [--repeats 3] [--out results/plan_speed.json]

``--speed --against OLD`` times the same cases with an older build beside this one (a folder
holding a graphpipe package, or a git ref built once into results/against/<commit>;
benchmarks/against.py): ``--rounds`` rounds, each running every case once in a fresh subprocess
per build, the builds' order alternating from round to round; medians and old / new per case.

    python3 benchmarks/plan_bench.py --speed --against ec0535b [--rounds 3]

``--plain-budgets`` checks what stopping the default's plain pools at 16 devices costs
(csrc/planner/default_search.h): each partitioner's own default search (replicas allowed, grown
by simulation, plans without replicas on every count up to 16), with the plain pools also on
every power of two up to the device count (plain_budget_limit 0) and without them (16), on the
paper-size models at batch 256 onto 32, 48 and 64 V100s (8 per node); the simulated steps side by
side, and how many pairs differ. Writes results/plan_plain_budgets.json (about 2 min).

    python3 benchmarks/plan_bench.py --plain-budgets
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from graphpipe._ext import _C

# Every automatic partitioner the C++ registry has (manual needs a mapping).
PARTITIONERS = tuple(p for p in _C.partitioner_names() if p != "manual")
MiB = 1024.0 * 1024.0


def _node(rng: random.Random, index: int):
    n = _C.Node()
    n.name = f"n{index}"
    n.op = "call_module"
    n.target = "Op"
    n.module = f"m{index}"
    n.forward_flops = rng.uniform(0.5e9, 8e9)
    n.param_bytes = rng.randrange(0, 5) * 1_000_000
    n.output_bytes = rng.uniform(1e3, 2e5)
    return n


def series_parallel_graph(n: int, seed: int):
    """Random two-terminal series-parallel DAG: subdivide an edge, or add a path beside it."""
    rng = random.Random(seed)
    edges = {(0, 1)}
    edge_list = [(0, 1)]
    count = 2
    while count < n:
        u, v = edge_list[rng.randrange(len(edge_list))]
        w = count
        count += 1
        if rng.random() < 0.5:
            edges.discard((u, v))
        edges.update({(u, w), (w, v)})
        edge_list = sorted(edges)
    # ids in a topological order (longest distance from the source)
    succ: dict[int, list[int]] = {}
    indeg = [0] * count
    for u, v in edges:
        succ.setdefault(u, []).append(v)
        indeg[v] += 1
    order, ready = [], [0]
    while ready:
        u = ready.pop()
        order.append(u)
        for v in succ.get(u, []):
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    rename = {old: new for new, old in enumerate(order)}
    g = _C.OpGraph()
    for i in range(count):
        g.add_node(_node(rng, i))
    for u, v in sorted(edges, key=lambda e: (rename[e[0]], rename[e[1]])):
        g.add_edge(rename[u], rename[v], rng.uniform(1e3, 2e5))
    g.trace_batch_size = 64
    return g


def random_dag(n: int, seed: int):
    """Random DAG: each operator takes 1-3 inputs among the 6 before it (not series-parallel)."""
    rng = random.Random(seed)
    g = _C.OpGraph()
    for i in range(n):
        g.add_node(_node(rng, i))
    for j in range(1, n):
        preds = sorted({rng.randrange(max(0, j - 6), j) for _ in range(rng.randint(1, 3))})
        for u in preds:
            g.add_edge(u, j, rng.uniform(1e3, 2e5))
    g.trace_batch_size = 64
    return g


def timing_table(quick: bool) -> list[dict]:
    rows = []
    sizes = (100, 1000) if quick else (100, 1000, 10000)
    for n in sizes:
        for kind, build in (("sp", series_parallel_graph), ("dag", random_dag)):
            g = build(n, seed=n)
            for stages in (4, 16, 64):
                if stages > n:
                    continue
                devices = _C.Devices.v100(stages)
                for name in PARTITIONERS:
                    start = time.perf_counter()
                    # 1 TB per device: this table measures planning speed, not fitting.
                    plan = _C.partition(g, devices, partitioner=name, batch_size=64, memory_limit=1e12)
                    seconds = time.perf_counter() - start
                    rows.append(
                        {
                            "graph": kind,
                            "nodes": n,
                            "stages_max": stages,
                            "partitioner": name,
                            "plan_seconds": seconds,
                            **_figures(plan),
                        }
                    )
                    print(
                        f"{kind:4s} {n:6d} ops -> {stages:2d} devices  {name:10s} {seconds:8.3f} s  "
                        f"stages {plan.num_stages:2d} depth {plan.depth:2d} mb {plan.micro_batch_size:3d} "
                        f"bottleneck {plan.bottleneck_seconds_per_sample * 1e3:8.3f} ms/sample",
                        flush=True,
                    )
    return rows


def _figures(plan) -> dict:
    """The plan-level figures both tables report."""
    return {
        "result": plan.partitioner,
        "stages": plan.num_stages,
        "depth": plan.depth,
        "micro_batch_size": plan.micro_batch_size,
        "bottleneck_ms_per_sample": plan.bottleneck_seconds_per_sample * 1e3,
        "step_ms": plan.predicted_iteration_seconds * 1e3,
    }


def parallel_stage_pairs(plan) -> int:
    """Pairs of stages neither of which reaches the other in the plan's stage graph."""
    count = plan.num_stages
    successors: list[list[int]] = [[] for _ in range(count)]
    for edge in plan.edges:
        successors[edge.src].append(edge.dst)
    reach = [0] * count  # bit mask of the stages each stage reaches
    for s in reversed(range(count)):  # stages are in a topological order
        for t in successors[s]:
            reach[s] |= (1 << t) | reach[t]
    return sum(
        1
        for a in range(count)
        for b in range(a + 1, count)
        if not (reach[a] >> b) & 1 and not (reach[b] >> a) & 1
    )


def _model_row(model: str, g, widest: int, count: int, name: str, plan, seconds: float) -> dict:
    first = plan.stages[0]
    return {
        "model": model,
        "operators": g.num_nodes,
        "branches": widest,
        "devices": count,
        "partitioner": name,
        **_figures(plan),
        "first_stage_activation_mib": first.activation_bytes * first.in_flight / MiB,
        "max_memory_gib": max(s.memory_bytes for s in plan.stages) / 1024.0 / MiB,
        "plan_seconds": seconds,
        "parallel_stage_pairs": parallel_stage_pairs(plan),
    }


def model_table(batch: int) -> tuple[list[dict], list[dict]]:
    from graphpipe.models import build_model
    from graphpipe.trace import trace

    rows, verdicts = [], []
    for model in ("mmt", "dlrm", "candle_uno"):
        spec = f"{model}:size=paper,device=meta,batch={batch}"
        m, x = build_model(spec)
        g = trace(m, x)
        widest = g.series_parallel().tree.widest_parallel()
        for count in (8, 32):
            devices = _C.Devices.v100(count)
            made = {}
            for name in PARTITIONERS:
                start = time.perf_counter()
                plan = _C.partition(g, devices, partitioner=name, batch_size=batch)
                made[name] = _model_row(model, g, widest, count, name, plan, time.perf_counter() - start)
                rows.append(made[name])
            # graphpipe at the sequential plan's micro-batch size: first-stage memory like for like
            seq_mb = made["sequential"]["micro_batch_size"]
            start = time.perf_counter()
            plan = _C.partition(g, devices, partitioner="graphpipe", batch_size=batch, micro_batch_size=seq_mb)
            same_mb = _model_row(model, g, widest, count, "graphpipe@seq_mb", plan, time.perf_counter() - start)
            rows.append(same_mb)
            graph, seq = made["graphpipe"], made["sequential"]
            verdicts.append(
                {
                    "model": model,
                    "devices": count,
                    "depth_graph": graph["depth"],
                    "depth_sequential": seq["depth"],
                    "shallower": graph["depth"] < seq["depth"],
                    "lower_bottleneck": graph["bottleneck_ms_per_sample"] < seq["bottleneck_ms_per_sample"],
                    "micro_batch_size_compared": seq_mb,
                    "first_stage_activation_mib_graph_same_mb": same_mb["first_stage_activation_mib"],
                    "first_stage_activation_mib_sequential": seq["first_stage_activation_mib"],
                    "lower_first_stage_activation_same_mb": same_mb["first_stage_activation_mib"]
                    < seq["first_stage_activation_mib"],
                    "parallel_stage_pairs": graph["parallel_stage_pairs"],
                    "parallel_stages": graph["parallel_stage_pairs"] > 0,
                }
            )
    print(f"\nPaper-size models on V100-class devices, mini-batch {batch} (act0 = first-stage activations x in-flight)")
    header = f"{'model':11s} {'dev':>3s} {'partitioner':24s} {'stages':>6s} {'depth':>5s} {'mb':>4s} {'ms/sample':>10s} {'step ms':>9s} {'act0 MiB':>9s} {'peak GiB':>8s}"
    print(header)
    for r in rows:
        label = r["result"] + (" @seq mb" if r["partitioner"] == "graphpipe@seq_mb" else "")
        print(
            f"{r['model']:11s} {r['devices']:3d} {label:24s} {r['stages']:6d} {r['depth']:5d} "
            f"{r['micro_batch_size']:4d} {r['bottleneck_ms_per_sample']:10.4f} {r['step_ms']:9.2f} "
            f"{r['first_stage_activation_mib']:9.1f} {r['max_memory_gib']:8.2f}"
        )
        if r["partitioner"] == "graphpipe@seq_mb":
            v = next(v for v in verdicts if v["model"] == r["model"] and v["devices"] == r["devices"])
            yes = {True: "yes", False: "NO"}
            print(
                f"  verdict: depth graph < sequential {yes[v['shallower']]} ({v['depth_graph']} vs "
                f"{v['depth_sequential']}); bottleneck graph < sequential {yes[v['lower_bottleneck']]}; "
                f"act0 at mb {v['micro_batch_size_compared']} graph < sequential "
                f"{yes[v['lower_first_stage_activation_same_mb']]} "
                f"({v['first_stage_activation_mib_graph_same_mb']:.1f} vs "
                f"{v['first_stage_activation_mib_sequential']:.1f} MiB); parallel stages "
                f"{yes[v['parallel_stages']]} ({v['parallel_stage_pairs']} pairs)"
            )
    return rows, verdicts


def replicated_table(batch: int, count: int = 64) -> list[dict]:
    """Planning time and plan of every partitioner with replicate=True on the paper models."""
    from graphpipe.models import build_model
    from graphpipe.trace import trace

    print(f"\nReplicated stages: paper-size models onto {count} V100-class devices (8 per node), mini-batch {batch}")
    print(f"{'model':11s} {'partitioner':12s} {'plan s':>7s}  {'label':26s} {'stages':>6s} {'devices':>7s} "
          f"{'widest':>6s} {'mb':>4s} {'step ms':>9s}")
    rows = []
    devices = _C.Devices.v100(count, per_node=8)
    for model in ("mmt", "dlrm", "candle_uno"):
        m, x = build_model(f"{model}:size=paper,device=meta,batch={batch}")
        g = trace(m, x)
        for name in PARTITIONERS:
            start = time.perf_counter()
            plan = _C.partition(g, devices, partitioner=name, batch_size=batch, replicate=True)
            seconds = time.perf_counter() - start
            widths = [len(s.devices) for s in plan.stages]
            row = {
                "model": model,
                "devices": count,
                "partitioner": name,
                "label": plan.partitioner,
                "plan_seconds": seconds,
                "stages": len(plan.stages),
                "devices_used": sum(widths),
                "widest_stage": max(widths),
                "micro_batch_size": plan.micro_batch_size,
                "predicted_iteration_seconds": plan.predicted_iteration_seconds,
                "under_10s": seconds < 10.0,
            }
            rows.append(row)
            print(f"{model:11s} {name:12s} {seconds:7.2f}  {plan.partitioner:26s} {row['stages']:6d} "
                  f"{row['devices_used']:7d} {row['widest_stage']:6d} {plan.micro_batch_size:4d} "
                  f"{plan.predicted_iteration_seconds * 1e3:9.2f}", flush=True)
    return rows


def speed_table(repeats: int, quiet: bool = False) -> list[dict]:
    """The planning-speed goals, timed `repeats` times each (plan and time of every run);
    `quiet`: no table printed."""
    import statistics

    from graphpipe.models import build_model
    from graphpipe.trace import trace

    m, x = build_model("mmt:size=paper,device=meta,batch=256")
    mmt = trace(m, x)
    cases = [
        ("mmt paper, replicated, 64 V100 (8 per node), batch 256", mmt, _C.Devices.v100(64, per_node=8),
         {"batch_size": 256, "replicate": True}, 2.0),
        # What a user's graphpipe.plan(replicate=True) costs: every candidate of the replicated
        # search and of the plain ones (1-8 devices) listed, then ranked by simulation.
        ("mmt paper, replicated, 64 V100, graphpipe.plan(replicate=True)", mmt,
         _C.Devices.v100(64, per_node=8), {"batch_size": 256, "replicate": True, "ranked": True}, 2.0),
        # What graphpipe.plan costs by default (replicate not given: planner/default_search.h):
        # the widened search and the baselines' searches (sequential+dp, piper+dp, data
        # parallelism).
        ("mmt paper, 64 V100, graphpipe.plan default (with its baselines)", mmt,
         _C.Devices.v100(64, per_node=8), {"batch_size": 256, "front_door": True}, 2.0),
    ]
    sp = series_parallel_graph(10000, seed=10000)
    for stages, goal in ((64, 1.0), (4, None)):
        # 1 TB per device, as in part 1: planning speed only.
        cases.append((f"series-parallel 10000 ops -> {stages} stages", sp, _C.Devices.v100(stages),
                      {"batch_size": 64, "memory_limit": 1e12}, goal))
    rows = []
    for label, g, devices, kwargs, goal in cases:
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            if kwargs.get("front_door"):  # graphpipe.plan itself, as every build defines its default
                import graphpipe

                plan = graphpipe.plan(g, devices, "graphpipe", batch_size=kwargs["batch_size"])
            elif kwargs.get("ranked"):
                plan = _C.plan_by_simulation(g, devices, partitioner="graphpipe",
                                             **{k: v for k, v in kwargs.items() if k != "ranked"}).plan
            else:
                plan = _C.partition(g, devices, partitioner="graphpipe", **kwargs)
            seconds.append(time.perf_counter() - start)
        median = statistics.median(seconds)
        rows.append({"case": label, "operators": g.num_nodes, "devices": devices.count, "goal_seconds": goal,
                     "plan_seconds_median": median, "plan_seconds": seconds,
                     "meets_goal": None if goal is None else median <= goal,
                     "result": plan.partitioner, "stages": plan.num_stages, "micro_batch_size": plan.micro_batch_size,
                     "predicted_iteration_seconds": plan.predicted_iteration_seconds})
        verdict = "" if goal is None else f"  goal {goal:.1f} s: {'yes' if median <= goal else 'NO'}"
        if quiet:
            continue
        print(f"{label:58s} median {median:7.3f} s  runs {' '.join(f'{t:.3f}' for t in seconds)}  "
              f"{plan.partitioner} {plan.num_stages} stages mb {plan.micro_batch_size}{verdict}", flush=True)
    return rows


def _speed_run(build: str | None) -> list[dict]:
    """One run of every speed case in a fresh subprocess: with ``build``, that folder's graphpipe
    first on the path (run from there, as sim_bench.py does); else the installed one."""
    import subprocess

    env = dict(os.environ)
    env.pop("GRAPHPIPE_EXT_DIR", None)
    if build:
        env["PYTHONPATH"] = os.pathsep.join([build, os.environ.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, os.path.abspath(__file__), "--speed-json"], env=env,
                         cwd=build or os.getcwd(), capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"the build {build or '(installed)'} failed to plan the speed cases "
                         f"(exit {run.returncode}):\n{run.stderr.strip()[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def speed_against(against: str, rounds: int) -> list[dict]:
    """The speed cases timed by the build ``against`` and by this one, alternating (old, new; then
    new, old; ...) over ``rounds`` rounds; the medians, old / new, and whether the plans agree."""
    import statistics

    from against import old_build

    old = old_build(against)
    times: dict[str, list[list[dict]]] = {"old": [], "new": []}
    for r in range(rounds):
        for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
            times[which].append(_speed_run(old if which == "old" else None))
    rows = []
    print(f"\nplanning speed, {against} ({old}) against this build, {rounds} rounds, medians")
    print(f"{'case':58s} {'old s':>8} {'new s':>8} {'old/new':>7}  same plan")
    for i, case in enumerate(times["new"][0]):
        old_s = statistics.median(run[i]["plan_seconds"][0] for run in times["old"])
        new_s = statistics.median(run[i]["plan_seconds"][0] for run in times["new"])
        theirs = times["old"][0][i]
        same = all(theirs[k] == case[k] for k in ("result", "stages", "micro_batch_size")) and \
            abs(theirs["predicted_iteration_seconds"] / case["predicted_iteration_seconds"] - 1) < 1e-9
        rows.append({"case": case["case"], "old_seconds": old_s, "new_seconds": new_s, "old_over_new": old_s / new_s,
                     "old_runs": [run[i]["plan_seconds"][0] for run in times["old"]],
                     "new_runs": [run[i]["plan_seconds"][0] for run in times["new"]],
                     "goal_seconds": case["goal_seconds"], "same_plan": same})
        print(f"{case['case']:58s} {old_s:8.3f} {new_s:8.3f} {old_s / new_s:7.2f}  {'yes' if same else 'NO'}")
    return rows


def plain_budgets_table() -> list[dict]:
    """Every (model, device count, partitioner) planned with the plain pools past 16 devices
    (plain_budget_limit 0) and without them (16): steps, seconds, and whether they differ. The
    models are simulate_paper.py's, at paper size."""
    from simulate_paper import MODELS, traced

    rows = []
    for name in MODELS:
        graph = traced(name, 256, "float32")
        for count in (32, 48, 64):
            devices = _C.Devices.v100(count, per_node=8)
            for partitioner in ("graphpipe", "sequential", "piper"):
                row = {"model": name, "devices": count, "partitioner": partitioner}
                for limit in (0, 16):
                    start = time.perf_counter()
                    plan = _C.plan_by_simulation(graph, devices, partitioner=partitioner, batch_size=256,
                                                 replicate=True, grow_replicas=True, plain_every_up_to=16,
                                                 plain_budget_limit=limit).plan
                    row[f"step_limit_{limit}"] = plan.predicted_iteration_seconds
                    row[f"seconds_limit_{limit}"] = time.perf_counter() - start
                row["same"] = row["step_limit_0"] == row["step_limit_16"]
                rows.append(row)
                print(f"{name:12s} {count:3d} {partitioner:10s} step {row['step_limit_0'] * 1e3:9.3f} / "
                      f"{row['step_limit_16'] * 1e3:9.3f} ms  plan {row['seconds_limit_0']:6.2f} / "
                      f"{row['seconds_limit_16']:6.2f} s  {'same' if row['same'] else 'DIFFERS'}", flush=True)
    print(f"{sum(not r['same'] for r in rows)} of {len(rows)} differ (plain pools past 16 devices / not)")
    return rows


def _write(out: str, payload: dict) -> None:
    """The run's JSON at ``out`` (its folder made), and a line saying where."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(payload, f, indent=2)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 10,000-operator graphs")
    parser.add_argument("--batch", type=int, default=128, help="mini-batch of the model table")
    parser.add_argument("--replicated-only", action="store_true", help="only part 3 (replicate=True)")
    parser.add_argument("--out", default="results/plan_bench.json")
    parser.add_argument("--speed", action="store_true", help="only the two planning-speed goals (results/plan_speed.json)")
    parser.add_argument("--repeats", type=int, default=3, help="--speed: runs per case")
    parser.add_argument("--against", default=None, help="--speed: an older build (folder or git ref) timed beside")
    parser.add_argument("--rounds", type=int, default=3, help="--against: rounds of both builds")
    parser.add_argument("--speed-json", action="store_true", help=argparse.SUPPRESS)  # --against's subprocess
    parser.add_argument("--plain-budgets", action="store_true",
                        help="the default's plain pools past 16 devices against none (results/plan_plain_budgets.json)")
    args = parser.parse_args()
    if args.plain_budgets:
        out = args.out if args.out != "results/plan_bench.json" else "results/plan_plain_budgets.json"
        _write(out, {"benchmark": "plan_plain_budgets", "rows": plain_budgets_table()})
        return
    if args.speed_json:
        print(json.dumps(speed_table(1, quiet=True)))
        return
    if args.speed and args.against:
        out = args.out if args.out != "results/plan_bench.json" else "results/plan_speed_against.json"
        _write(out, {"benchmark": "plan_speed_against", "against": args.against,
                     "rows": speed_against(args.against, args.rounds)})
        return
    if args.speed:
        out = args.out if args.out != "results/plan_bench.json" else "results/plan_speed.json"
        _write(out, {"benchmark": "plan_speed", "rows": speed_table(args.repeats)})
        return
    timing, models, verdicts = [], [], []
    if not args.replicated_only:
        print("Planning time on synthetic graphs (V100-class devices, mini-batch 64)")
        timing = timing_table(args.quick)
        models, verdicts = model_table(args.batch)
    replicated = replicated_table(args.batch)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"timing": timing, "models": models, "verdicts": verdicts, "replicated": replicated}, f, indent=2)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
