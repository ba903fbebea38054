"""Where the simulator misses a real run: compare.py's graphpipe V row on real CPU ranks, each
instruction measured against its simulated task, and the ranks' idle time against the
simulated schedule's.

    python benchmarks/sim_gap_bench.py [--models transformer mmt] [--world 2] [--steps 16]
        [--out results/sim_gap_bench.json]

For each model (compare.py's BENCH_SPECS), as ``compare.py --no-emulate`` makes its "graphpipe/V
zb" row: trace, profile on this CPU, calibrate the description on ``--world`` ranks
(graphpipe.calibration, compare.calibrate), cut the model with the sequential partitioner for
twice the ranks and place the stages in a V (rank r: stages r and 2 world - 1 - r), ``zb_graph``.
The plan is simulated (graphpipe.simulate: every task of the step) and run on ``--world``
spawned ranks (Gloo, one torch thread each, SGD), ``--steps`` timed steps after 3 warm-up steps;
each rank's executor flight recorder keeps the last 4 steps' instructions with their start and
end (one clock for all ranks: CLOCK_MONOTONIC on one machine).

It prints, per model:

- the measured step (median) against the simulated one;
- per stage and kind (forward, backward, backward_input, backward_weight), the median measured
  instruction against the simulated task: whether the cost model prices the compute right;
- per rank, its compute and its idle time between compute instructions, measured (mean over the
  recorded steps; the part in gaps under SHORT_GAP, the executor's own work between
  instructions, apart) against simulated: what the schedule's waits add; and the time from the
  step's start to its first instruction and from its last to the step's end (the step's set-up,
  the optimizer, the closing loss sum);
- for every compute instruction whose rank waited for another rank's output (idle when that
  output was not yet made), the lag from the producer's end there to its own start, against the
  simulated transfer: how long data took to be usable when a rank was waiting for it.

Nothing is emulated: real compute, real Gloo transfers. The table's figures are one run's on a
noisy machine (compare the ratios, not the milliseconds, across runs). Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare  # noqa: E402  this folder's compare.py: the V row's plan and the calibration

COMPUTE = ("forward", "backward", "backward_input", "backward_weight")
RECORDED_STEPS = 4
WARMUP = 3
# A gap between two instructions shorter than this is the executor's own work between them
# (dispatch, posting, bookkeeping), not a wait for another rank.
SHORT_GAP = 3e-4


def _rank(rank: int, world: int, spec: str, plan_json: str, steps: int) -> dict[str, Any]:
    """One rank: the plan's steps timed, and the flight records of the last RECORDED_STEPS."""
    import torch.distributed as dist

    import graphpipe
    from graphpipe.models import build_model, default_loss

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, inputs = build_model(spec)
    targets = model.example_targets(inputs[0].shape[0])
    pipe = graphpipe.wrap(model, inputs, default_loss(spec), plan=plan_json, skip_nonfinite=False)
    optimizer = torch.optim.SGD(list(pipe.parameters()), lr=compare.LR)
    seconds = []
    spans = []  # each step's start and end on the flight recorder's clock (time.time())
    for i in range(WARMUP + steps):
        dist.barrier()
        start, wall = time.perf_counter(), time.time()
        pipe.step(inputs, targets, optimizer=optimizer)
        if i >= WARMUP:
            seconds.append(time.perf_counter() - start)
            spans.append((wall, time.time()))
    records = pipe.executor.flight_recorder.records()
    kept = sorted({r["run"] for r in records})[-RECORDED_STEPS:]
    pipe.close()
    # One executor run per step: the last runs are the last steps.
    return {"seconds": seconds, "steps": dict(zip(kept, spans[-len(kept):])),
            "records": [{k: r[k] for k in ("run", "kind", "stage", "micro_batch", "start", "end")}
                        for r in records if r["run"] in kept]}


def _producer(kind: str, stage: int, edges: list[tuple[int, int]]) -> list[tuple[str, int]]:
    """The compute instructions whose outputs ``kind`` on ``stage`` consumes from other stages:
    a forward takes its producers' forwards, a backward (or its input half) its consumers'
    backward inputs."""
    if kind == "forward":
        return [("forward", s) for s, d in edges if d == stage]
    if kind in ("backward", "backward_input"):
        return [(k, d) for s, d in edges if s == stage for k in ("backward", "backward_input")]
    return []


Instruction = tuple[str, int, int]  # kind, stage, micro-batch


def replay(order: dict[int, list[Instruction]], seconds: Callable[[Instruction], float], edges: list[tuple[int, int]],
           rank_of: dict[int, int], transfer: float, gap: float) -> float:
    """The step of the ranks' instruction orders (rank -> instructions in the order the rank ran
    them) replayed with each instruction lasting ``seconds(instruction)``: an instruction starts
    when its rank is done with the one before (plus ``gap``, the executor's own work between
    them) and every output it takes from another rank has been made (plus ``transfer``)."""
    present = {ins for items in order.values() for ins in items}
    end: dict[Instruction, float] = {}
    position = dict.fromkeys(order, 0)
    free = dict.fromkeys(order, 0.0)
    remaining = len(present)
    while remaining:
        progressed = False
        for r, items in order.items():
            while position[r] < len(items):
                ins = items[position[r]]
                inputs = [(k, s, ins[2]) for k, s in _producer(ins[0], ins[1], edges)
                          if rank_of[s] != r and (k, s, ins[2]) in present]
                if any(i not in end for i in inputs):
                    break  # an input not made yet: the other ranks go on first
                start = max([free[r] + (gap if position[r] else 0.0)] + [end[i] + transfer for i in inputs])
                end[ins] = start + seconds(ins)
                free[r] = end[ins]
                position[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("the recorded orders wait on each other: not one schedule's step")
    return max(free.values())


def analyse(plan: Any, sim: Any, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures the table prints, from the simulation and the ranks' records."""
    edges = [(e.src, e.dst) for e in plan.edges]
    rank_of = {s.id: int(s.devices[0]) for s in plan.stages}
    simulated: dict[tuple[str, int], list[float]] = defaultdict(list)
    sim_rank_tasks: dict[int, list[Any]] = defaultdict(list)
    transfer: list[float] = []
    for t in sim.tasks:
        if t.kind in COMPUTE:
            simulated[(t.kind, t.stage)].append(t.end - t.start)
            sim_rank_tasks[t.rank].append(t)
        elif t.kind in ("activation", "gradient"):
            transfer.append(t.end - t.start)
    measured: dict[tuple[str, int], list[float]] = defaultdict(list)
    per_rank: dict[int, dict[str, list[float]]] = defaultdict(
        lambda: {"compute": [], "idle": [], "short": [], "head": [], "tail": []})
    waits: list[dict[str, Any]] = []
    recorded: list[tuple[dict[int, list[Instruction]], dict[Instruction, float]]] = []  # per run
    short_gaps: list[float] = []
    runs = sorted({r["run"] for r in ranks[0]["records"]})
    for run in runs:
        done: dict[tuple[str, int, int], dict[str, Any]] = {}
        by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for rank, value in enumerate(ranks):
            for r in value["records"]:
                if r["run"] == run and r["kind"] in COMPUTE:
                    done[(r["kind"], r["stage"], r["micro_batch"])] = r
                    by_rank[rank].append(r)
        for rank, items in by_rank.items():
            items.sort(key=lambda r: r["start"])
            per_rank[rank]["compute"].append(sum(r["end"] - r["start"] for r in items))
            gaps = [max(0.0, b["start"] - a["end"]) for a, b in zip(items, items[1:])]
            per_rank[rank]["idle"].append(sum(gaps))
            per_rank[rank]["short"].append(sum(g for g in gaps if g < SHORT_GAP))
            short_gaps += [g for g in gaps if g < SHORT_GAP]
            steps = ranks[rank].get("steps", {})
            step_start, step_end = steps.get(run, steps.get(str(run), (None, None)))
            if step_start is not None and items:
                per_rank[rank]["head"].append(items[0]["start"] - step_start)
                per_rank[rank]["tail"].append(step_end - items[-1]["end"])
            for a, b in zip(items, items[1:]):
                measured[(b["kind"], b["stage"])].append(b["end"] - b["start"])
                if b["start"] - a["end"] < 1e-4:
                    continue  # no wait before it
                ends = [done[(k, s, b["micro_batch"])]["end"] for k, s in _producer(b["kind"], b["stage"], edges)
                        if (k, s, b["micro_batch"]) in done and rank_of[s] != rank]
                # Only where the input was not there yet when the rank became free: the rank
                # waited for it (and not for something else first).
                if ends and max(ends) > a["end"]:
                    waits.append({"run": run, "rank": rank, "kind": b["kind"], "stage": b["stage"],
                                  "micro_batch": b["micro_batch"], "lag_seconds": b["start"] - max(ends)})
            if items:
                measured[(items[0]["kind"], items[0]["stage"])].append(items[0]["end"] - items[0]["start"])
        recorded.append(({rank: [(r["kind"], r["stage"], r["micro_batch"]) for r in items]
                          for rank, items in sorted(by_rank.items())},
                         {key: r["end"] - r["start"] for key, r in done.items()}))
    step = statistics.median(ranks[0]["seconds"])
    sim_ranks = {}
    for rank, tasks in sim_rank_tasks.items():
        tasks.sort(key=lambda t: t.start)
        sim_ranks[rank] = {"compute": sum(t.end - t.start for t in tasks),
                           "idle": sum(max(0.0, b.start - a.end) for a, b in zip(tasks, tasks[1:])),
                           "head": tasks[0].start, "tail": sim.iteration_seconds - max(t.end for t in tasks)}
    return {
        "measured_step_seconds": step, "simulated_step_seconds": sim.iteration_seconds,
        "simulator_error": sim.iteration_seconds / step - 1.0,
        "instructions": [{"kind": k, "stage": s, "measured_seconds": statistics.median(measured[(k, s)]),
                          "simulated_seconds": statistics.median(simulated[(k, s)])}
                         for k, s in sorted(simulated, key=lambda key: (key[1], key[0])) if measured.get((k, s))],
        "ranks": [{"rank": r, "measured_compute_seconds": statistics.fmean(v["compute"]),
                   "measured_idle_seconds": statistics.fmean(v["idle"]),
                   "measured_short_gap_seconds": statistics.fmean(v["short"]),
                   "measured_before_first_seconds": statistics.fmean(v["head"]) if v["head"] else None,
                   "measured_after_last_seconds": statistics.fmean(v["tail"]) if v["tail"] else None,
                   "simulated_compute_seconds": sim_ranks.get(r, {}).get("compute", 0.0),
                   "simulated_idle_seconds": sim_ranks.get(r, {}).get("idle", 0.0),
                   "simulated_before_first_seconds": sim_ranks.get(r, {}).get("head", 0.0),
                   "simulated_after_last_seconds": sim_ranks.get(r, {}).get("tail", 0.0)}
                  for r, v in sorted(per_rank.items())],
        "waits_on_transfers": {"count": len(waits), "waits": waits,
                               "simulated_transfer_seconds_median": statistics.median(transfer) if transfer else 0.0},
        "replays": replays(recorded, measured, simulated, edges, rank_of,
                           statistics.median(transfer) if transfer else 0.0,
                           statistics.median(short_gaps) if short_gaps else 0.0),
    }


def replays(recorded: list[tuple[dict[int, list[Instruction]], dict[Instruction, float]]],
            measured: dict[tuple[str, int], list[float]], simulated: dict[tuple[str, int], list[float]],
            edges: list[tuple[int, int]], rank_of: dict[int, int], transfer: float, gap: float) -> dict[str, float]:
    """Each recorded step's instruction orders replayed (replay(), the simulated transfer and
    the median short gap between instructions): with the durations the step measured, with
    every instruction at its (stage, kind) median over the recorded steps (no spread), and at
    its simulated duration. The first against the second is what the durations' spread alone
    costs the schedule; the second against the third, what their medians' error costs."""
    def median_of(table: dict[tuple[str, int], list[float]]) -> Callable[[Instruction], float]:
        medians = {key: statistics.median(v) for key, v in table.items() if v}
        return lambda ins: medians.get((ins[0], ins[1]), 0.0)

    out = {"recorded_seconds": [], "medians_seconds": [], "simulated_durations_seconds": []}
    for order, durations in recorded:
        for name, seconds in (("recorded_seconds", lambda ins, d=durations: d[ins]),
                              ("medians_seconds", median_of(measured)),
                              ("simulated_durations_seconds", median_of(simulated))):
            out[name].append(replay(order, seconds, edges, rank_of, transfer, gap))
    return {name: statistics.fmean(v) for name, v in out.items()} | {"gap_seconds": gap,
                                                                      "transfer_seconds": transfer}


def measure(name: str, world: int, steps: int, calibration: dict[str, float]) -> dict[str, Any]:
    import graphpipe
    from graphpipe.local_ranks import expect_ok, run_ranks
    from graphpipe.models import build_model

    spec = compare.BENCH_SPECS[name]
    model, inputs = build_model(spec)
    graph = graphpipe.trace(model, inputs)
    batch = graph.trace_batch_size
    graphpipe.profile(graph, model, inputs, device="cpu",
                      batch_sizes=tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= batch), repeats=3, warmup=1)
    devices = compare.calibrated_description(graphpipe.devices(world, "cpu", measure=True), world, 1.0, calibration)
    doubled = compare.doubled_sequential_cut(graph, devices, None)
    if doubled.reason:
        return {"model": name, "spec": spec, "unavailable": doubled.reason}
    plan = graphpipe.plan(graph, devices, "manual", manual=doubled.labels, stage_devices=compare.v_placement(world),
                          micro_batches=doubled.cut.micro_batches, schedule="zb_graph", replicate=False)
    sim = graphpipe.simulate(plan, devices, "zb_graph")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "plan.json")
        plan.save(graph, path)
        plan_json = Path(path).read_text()
    ranks = expect_ok(run_ranks(_rank, world, spec, plan_json, steps, timeout=1800))
    out = analyse(plan, sim, [r.value for r in ranks])
    return {"model": name, "spec": spec, "world": world, "stages": plan.num_stages,
            "micro_batches": plan.num_micro_batches, **out}


def print_model(row: dict[str, Any]) -> None:
    if "unavailable" in row:
        print(f"\n## {row['model']}: not run ({row['unavailable']})")
        return
    print(f"\n## {row['model']}: {row['stages']} stages in a V on {row['world']} ranks, {row['micro_batches']} "
          f"micro-batches, zb_graph: measured step {row['measured_step_seconds'] * 1e3:.1f} ms, simulated "
          f"{row['simulated_step_seconds'] * 1e3:.1f} ms ({row['simulator_error'] * 100:+.1f}%)\n")
    print("| stage | instruction | measured ms | simulated ms | measured / simulated |")
    print("|---|---|---|---|---|")
    for i in row["instructions"]:
        ratio = i["measured_seconds"] / i["simulated_seconds"] if i["simulated_seconds"] > 0 else float("nan")
        print(f"| {i['stage']} | {i['kind']} | {i['measured_seconds'] * 1e3:.2f} | {i['simulated_seconds'] * 1e3:.2f} "
              f"| {ratio:.2f} |")
    print("\n| rank | compute ms, measured | simulated | idle ms between instructions, measured | of it in gaps under "
          f"{SHORT_GAP * 1e3:.1f} ms | simulated | before the first instruction ms, measured | simulated | after "
          "the last, measured | simulated |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in row["ranks"]:
        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x * 1e3:.1f}"

        print(f"| {r['rank']} | {ms(r['measured_compute_seconds'])} | {ms(r['simulated_compute_seconds'])} | "
              f"{ms(r['measured_idle_seconds'])} | {ms(r['measured_short_gap_seconds'])} | "
              f"{ms(r['simulated_idle_seconds'])} | {ms(r['measured_before_first_seconds'])} | "
              f"{ms(r['simulated_before_first_seconds'])} | {ms(r['measured_after_last_seconds'])} | "
              f"{ms(r['simulated_after_last_seconds'])} |")
    waits = row["waits_on_transfers"]
    lags = [w["lag_seconds"] for w in waits["waits"]]
    if lags:
        late = [x for x in lags if x > 1e-3]
        print(f"\n{waits['count']} compute instructions waited for another rank's output: from its producer's end to "
              f"their start, median {statistics.median(lags) * 1e3:.2f} ms (simulated transfer "
              f"{waits['simulated_transfer_seconds_median'] * 1e3:.2f} ms); {len(late)} over 1 ms "
              f"(median {statistics.median(late) * 1e3 if late else 0.0:.2f} ms, sum {sum(late) * 1e3:.1f} ms over "
              f"{RECORDED_STEPS} steps)")
    rp = row["replays"]
    print(f"\nThe recorded steps' instruction orders replayed (each instruction after its rank's previous one "
          f"and {rp['gap_seconds'] * 1e6:.0f} us, and after its inputs from other ranks and "
          f"{rp['transfer_seconds'] * 1e3:.2f} ms): with the measured durations {rp['recorded_seconds'] * 1e3:.1f} ms, "
          f"every instruction at its median {rp['medians_seconds'] * 1e3:.1f} ms, at its simulated duration "
          f"{rp['simulated_durations_seconds'] * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["transformer", "mmt"], choices=sorted(compare.BENCH_SPECS))
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16, help="timed steps (after 3 warm-up steps)")
    parser.add_argument("--out", default="results/sim_gap_bench.json")
    args = parser.parse_args()
    if args.world < 2:
        parser.error("--world must be at least 2: a V needs two ranks")
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    torch.set_num_threads(1)
    calibration = compare.calibrate([args.world], compare.Launch.spawned())[args.world]
    rows = []
    for name in args.models:
        rows.append(measure(name, args.world, args.steps, calibration))
        print_model(rows[-1])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # The commit beside the figures: the simulator and the runtime they describe are that code.
    out.write_text(json.dumps({"benchmark": "sim_gap", "commit": compare.git_commit(), "world": args.world,
                               "steps": args.steps, "calibration": calibration, "rows": rows}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
