"""Where the simulator misses a real run: compare.py's graphpipe V row on real CPU ranks, each
instruction measured against its simulated task, and the ranks' idle time against the
simulated schedule's.

    python benchmarks/sim_gap_bench.py [--models transformer mmt] [--world 2] [--steps 16]
        [--no-beside] [--out results/sim_gap_bench.json]

For each model (compare.py's BENCH_SPECS), as ``compare.py --no-emulate`` makes its "graphpipe/V
zb" row: trace, profile on this CPU, calibrate the description on ``--world`` ranks
(graphpipe.calibration, compare.calibrate), cut the model with the sequential partitioner for
twice the ranks and place the stages in a V (rank r: stages r and 2 world - 1 - r), ``zb_graph``.
The plan is simulated (graphpipe.simulate: every task of the step) and run on ``--world``
spawned ranks (Gloo, one torch thread each, SGD), ``--steps`` timed steps after 3 warm-up steps;
each rank's executor flight recorder keeps the last 4 steps' instructions with their start and
end (one clock for all ranks: the system clock, time.time(), on one machine).

It prints, per model:

- the measured step (median) against the simulated one;
- per stage and kind (forward, backward, backward_input, backward_weight), the median measured
  instruction against the simulated task: whether the cost model prices the compute right;
- per rank, its compute and its idle time between compute instructions, measured (mean over the
  recorded steps; the part in gaps under SHORT_GAP, the executor's own work between
  instructions, apart) against simulated: what the schedule's waits add; and the time from the
  step's start to its first instruction and from its last to the step's end (the step's set-up,
  the optimizer, the closing loss sum);
- every wait of a rank for another rank's output (the rank free, the output landing later, as
  its receive's record ends): the lag from the (last) producer's end to the landing, against the
  simulated transfers, and how many landed over 1 ms later than their edge's simulated transfer
  allows;
- the recorded steps' mean, measured minus simulated, in five parts that add up to it, from
  replays of the recorded instruction orders (replay(), each input brought over in its edge's
  simulated transfer time) with the simulated durations, with each
  instruction at its median, and with the recorded durations: the replay's own model against the
  simulator, the medians against their prices, the durations' spread around their medians (in a
  schedule without slack a rank that runs long makes the other wait), the waits the replay does
  not have (late landings, the executor's own work), and the set-up and close beyond their price.

With ``--beside`` (the default) the ranks also profile the model at once right after their steps
(``graphpipe.profile(group=)``, benchmarks/profiles_beside.py), and everything above is printed
again against the plan priced on that profile under the very schedule the ranks ran: the
instructions' prices then carry no drift of the machine between the profile and the run.

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
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare  # noqa: E402  this folder's compare.py: the V row's plan and the calibration
from profiles_beside import profile_rank, shard_sizes  # noqa: E402

from graphpipe.profile import median_samples  # noqa: E402

COMPUTE = ("forward", "backward", "backward_input", "backward_weight")
RECORDED_STEPS = 4
WARMUP = 3
# A gap between two instructions shorter than this is the executor's own work between them
# (dispatch, posting, bookkeeping), not a wait for another rank.
SHORT_GAP = 3e-4
RECORDER_SIZE = 16384


def _rank(rank: int, world: int, spec: str, plan_json: str, steps: int, beside: list[int]) -> dict[str, Any]:
    """One rank: the plan's steps timed, the flight records of the last RECORDED_STEPS, and
    where ``beside`` lists batch sizes, the model profiled at them on every rank at once right
    after the steps (profiles_beside.profile_rank)."""
    import torch.distributed as dist

    import graphpipe
    from graphpipe.models import build_model, default_loss

    torch.set_num_threads(1)
    torch.manual_seed(0)
    # Room in the recorder's ring for the recorded steps whole (the default keeps 1024 records).
    os.environ["GRAPHPIPE_FLIGHT_RECORDER_SIZE"] = str(RECORDER_SIZE)
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
    pipe.close()
    # One executor run per step: the last runs are the last steps. Every step runs the same
    # instructions, so a run with fewer records than the last lost its first ones to the ring.
    counts = Counter(r["run"] for r in records)
    last = max(counts)
    kept = [run for run in range(last - RECORDED_STEPS + 1, last + 1) if counts.get(run) == counts[last]]
    if not kept:
        raise RuntimeError("the flight recorder kept no whole step")
    return {"seconds": seconds, "steps": {run: spans[len(spans) - 1 - (last - run)] for run in kept},
            "records": [{k: r[k] for k in ("run", "kind", "stage", "micro_batch", "start", "end")}
                        for r in records if r["run"] in kept],
            "profile": profile_rank(rank, world, spec, beside) if beside else None}


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
# The simulated transfer of each edge and direction: (activation or gradient, the edge's source
# stage, its destination stage) -> the median over the micro-batches.
Transfers = dict[tuple[str, int, int], float]


def _transfer(transfers: Transfers, producer: tuple[str, int], consumer: int, fallback: float) -> float:
    """How long the simulator takes to bring ``producer``'s output (its kind and stage) to stage
    ``consumer``: a forward's activations go along the edge producer -> consumer, a backward's
    gradients back along consumer -> producer; ``fallback`` where the simulation has no such
    transfer."""
    kind, stage = producer
    key = ("activation", stage, consumer) if kind == "forward" else ("gradient", consumer, stage)
    return transfers.get(key, fallback)


def replay(order: dict[int, list[Instruction]], seconds: Callable[[Instruction], float], edges: list[tuple[int, int]],
           rank_of: dict[int, int], transfers: Transfers, transfer: float, gap: float) -> float:
    """The step of the ranks' instruction orders (rank -> instructions in the order the rank ran
    them) replayed with each instruction lasting ``seconds(instruction)``: an instruction starts
    when its rank is done with the one before (plus ``gap``, the executor's own work between
    them) and every output it takes from another rank has been made and brought over (the
    edge's simulated transfer, ``transfers``; ``transfer`` where it has none)."""
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
                start = max([free[r] + (gap if position[r] else 0.0)]
                            + [end[i] + _transfer(transfers, i[:2], ins[1], transfer) for i in inputs])
                end[ins] = start + seconds(ins)
                free[r] = end[ins]
                position[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("the recorded orders wait on each other: not one schedule's step")
    return max(free.values())


RECEIVES = {"forward": "recv_activation", "backward": "recv_gradient", "backward_input": "recv_gradient"}


def _simulated(sim: Any, edges: list[tuple[int, int]]) -> dict[str, Any]:
    """The simulated step's figures: each compute task's duration by (kind, stage), each rank's
    tasks in order, each edge's transfers' median by direction and all transfers' median, and the
    compute's span."""
    durations: dict[tuple[str, int], list[float]] = defaultdict(list)
    tasks: dict[int, list[Any]] = defaultdict(list)
    transfers = []
    by_edge: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for t in sim.tasks:
        if t.kind in COMPUTE:
            durations[(t.kind, t.stage)].append(t.end - t.start)
            tasks[t.rank].append(t)
        elif t.kind in ("activation", "gradient"):
            transfers.append(t.end - t.start)
            by_edge[(t.kind, *edges[t.edge])].append(t.end - t.start)
    for items in tasks.values():
        items.sort(key=lambda t: t.start)
    compute = [t for items in tasks.values() for t in items]
    return {"durations": durations, "tasks": tasks, "transfer": statistics.median(transfers) if transfers else 0.0,
            "transfers": {key: statistics.median(v) for key, v in by_edge.items()},
            "span": max(t.end for t in compute) - min(t.start for t in compute) if compute else 0.0}


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    """How long the intervals [a0, a1] and [b0, b1] overlap."""
    return max(0.0, min(a1, b1) - max(a0, b0))


def _one_step(run: int, ranks: list[dict[str, Any]], edges: list[tuple[int, int]], rank_of: dict[int, int],
              transfers: Transfers, transfer: float, short_gap: float) -> dict[str, Any]:
    """One recorded step: per rank its compute, idle, set-up and close; the waits on another
    rank's output; the ranks' instruction orders and durations (for replay()); its spans."""
    done: dict[Instruction, dict[str, Any]] = {}
    landed: dict[tuple[int, str, int, int], float] = {}  # (rank, receive kind, stage, micro-batch)
    by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rank, value in enumerate(ranks):
        for r in value["records"]:
            if r["run"] != run:
                continue
            if r["kind"] in COMPUTE:
                done[(r["kind"], r["stage"], r["micro_batch"])] = r
                by_rank[rank].append(r)
            elif r["kind"] in ("recv_activation", "recv_gradient"):
                key = (rank, r["kind"], r["stage"], r["micro_batch"])
                landed[key] = max(landed.get(key, 0.0), r["end"])
    for items in by_rank.values():
        items.sort(key=lambda r: r["start"])
    per_rank, waits, gaps_short = {}, [], []
    for rank, items in sorted(by_rank.items()):
        gaps = [max(0.0, b["start"] - a["end"]) for a, b in zip(items, items[1:])]
        gaps_short += [g for g in gaps if g < short_gap]
        start, end = ranks[rank]["steps"][run]
        per_rank[rank] = {"compute": sum(r["end"] - r["start"] for r in items), "idle": sum(gaps),
                          "short": sum(g for g in gaps if g < short_gap), "head": items[0]["start"] - start,
                          "tail": end - items[-1]["end"]}
        for a, b in zip(items, items[1:]):
            # The rank was free at a's end and b's inputs from another rank landed after it:
            # the rank waited for them. A receive's record ends when the executor lands it, just
            # before b, so a landing after a short gap is the executor's bookkeeping, not a wait.
            arrival = landed.get((rank, RECEIVES.get(b["kind"], ""), b["stage"], b["micro_batch"]))
            made = [(done[(k, s, b["micro_batch"])]["end"], _transfer(transfers, (k, s), b["stage"], transfer),
                     rank_of[s]) for k, s in _producer(b["kind"], b["stage"], edges)
                    if (k, s, b["micro_batch"]) in done and rank_of[s] != rank]
            if b["start"] - a["end"] < short_gap or arrival is None or arrival <= a["end"] or not made:
                continue
            # The lag from the last producer's end; late: past where the simulator lands the last
            # input; the last producer's rank's compute during the lag.
            last, _, sender = max(made)
            busy = sum(_overlap(r["start"], r["end"], last, arrival) for r in by_rank[sender])
            waits.append({"run": run, "rank": rank, "kind": b["kind"], "stage": b["stage"],
                          "micro_batch": b["micro_batch"], "lag_seconds": arrival - last,
                          "late_seconds": max(0.0, arrival - max([a["end"]] + [e + t for e, t, _ in made])),
                          "sender_busy_seconds": busy})
    compute = [r for items in by_rank.values() for r in items]
    steps = [ranks[rank]["steps"][run] for rank in by_rank]
    return {"ranks": per_rank, "waits": waits, "short_gaps": gaps_short,
            "order": {rank: [(r["kind"], r["stage"], r["micro_batch"]) for r in items]
                      for rank, items in sorted(by_rank.items())},
            "durations": {key: r["end"] - r["start"] for key, r in done.items()},
            "compute_span": max(r["end"] for r in compute) - min(r["start"] for r in compute),
            "step": max(e for _, e in steps) - min(s for s, _ in steps)}


def analyse(plan: Any, sim: Any, ranks: list[dict[str, Any]], short_gap: float = SHORT_GAP) -> dict[str, Any]:
    """The figures the table prints, from the simulation and the ranks' records (each rank's
    ``records`` of whole steps and ``steps``: run -> its start and end on the records' clock);
    ``short_gap``: the longest gap between two instructions that is the executor's own work."""
    edges = [(e.src, e.dst) for e in plan.edges]
    rank_of = {s.id: int(s.devices[0]) for s in plan.stages}
    simulated = _simulated(sim, edges)
    steps = [_one_step(run, ranks, edges, rank_of, simulated["transfers"], simulated["transfer"], short_gap)
             for run in sorted(ranks[0]["steps"])]
    measured: dict[tuple[str, int], list[float]] = defaultdict(list)
    for step in steps:
        for (kind, stage, _), seconds in step["durations"].items():
            measured[(kind, stage)].append(seconds)
    short = [g for step in steps for g in step["short_gaps"]]
    gap = statistics.median(short) if short else 0.0

    def at(table: dict[tuple[str, int], list[float]]) -> Callable[[Instruction], float]:
        medians = {key: statistics.median(v) for key, v in table.items() if v}
        return lambda ins: medians.get((ins[0], ins[1]), 0.0)

    def replayed(seconds: Callable[[Instruction, dict], float]) -> float:
        return statistics.fmean(replay(s["order"], lambda ins, s=s: seconds(ins, s), edges, rank_of,
                                       simulated["transfers"], simulated["transfer"], gap) for s in steps)

    replays = {"simulated_durations": replayed(lambda ins, s: at(simulated["durations"])(ins)),
               "medians": replayed(lambda ins, s: at(measured)(ins)),
               "recorded": replayed(lambda ins, s: s["durations"][ins])}
    step = statistics.fmean(s["step"] for s in steps)
    span = statistics.fmean(s["compute_span"] for s in steps)
    sim_rank = {r: {"compute": sum(t.end - t.start for t in ts),
                    "idle": sum(max(0.0, b.start - a.end) for a, b in zip(ts, ts[1:])),
                    "head": ts[0].start, "tail": sim.iteration_seconds - ts[-1].end}
                for r, ts in simulated["tasks"].items()}
    mean = lambda rank, key: statistics.fmean(s["ranks"][rank][key] for s in steps)  # noqa: E731
    return {
        "measured_step_seconds": statistics.median(ranks[0]["seconds"]),
        "simulated_step_seconds": sim.iteration_seconds,
        "simulator_error": sim.iteration_seconds / statistics.median(ranks[0]["seconds"]) - 1.0,
        "steps_analysed": len(steps),
        "instructions": [{"kind": k, "stage": s, "measured_seconds": statistics.median(measured[(k, s)]),
                          "simulated_seconds": statistics.median(v)}
                         for (k, s), v in sorted(simulated["durations"].items(), key=lambda kv: (kv[0][1], kv[0][0]))
                         if measured.get((k, s))],
        "ranks": [{"rank": r, **{f"measured_{name}_seconds": mean(r, key) for name, key in FIGURES},
                   **{f"simulated_{name}_seconds": sim_rank[r][key] for name, key in FIGURES if key != "short"}}
                  for r in sorted(steps[0]["ranks"]) if r in sim_rank],
        "waits_on_transfers": {"waits": [w for s in steps for w in s["waits"]],
                               "simulated_transfer_seconds": simulated["transfer"]},
        # The analysed steps' mean, measured minus simulated, in five parts that add up to it.
        "decomposition": {
            "replay_against_simulator": replays["simulated_durations"] - simulated["span"],
            "medians_against_prices": replays["medians"] - replays["simulated_durations"],
            "spread_around_medians": replays["recorded"] - replays["medians"],
            "waits_the_replay_lacks": span - replays["recorded"],
            "set_up_and_close": (step - span) - (sim.iteration_seconds - simulated["span"]),
            "measured_step": step, "simulated_step": sim.iteration_seconds,
        },
        "replays": {f"{name}_seconds": v for name, v in replays.items()} | {"gap_seconds": gap},
    }


# The per-rank figures: (name in the report, key in _one_step's ranks).
FIGURES = (("compute", "compute"), ("idle", "idle"), ("short_gap", "short"), ("before_first", "head"),
           ("after_last", "tail"))


@dataclass
class VRow:
    """compare.py's "graphpipe/V zb" row of one model: its plan, the description it was made
    for, and the plan's JSON for the ranks (or the reason there is none)."""

    spec: str
    plan: Any = None
    devices: Any = None
    plan_json: str = ""
    reason: str = ""


def v_row(name: str, world: int, calibration: dict[str, float]) -> VRow:
    """The V row as ``compare.py --no-emulate`` makes it: traced, profiled on this CPU, the
    description calibrated, the sequential cut for twice the ranks placed in a V, zb_graph."""
    import graphpipe
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
        return VRow(spec, reason=doubled.reason)
    plan = graphpipe.plan(graph, devices, "manual", manual=doubled.labels, stage_devices=compare.v_placement(world),
                          micro_batches=doubled.cut.micro_batches, schedule="zb_graph", replicate=False)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "plan.json")
        plan.save(graph, path)
        plan_json = Path(path).read_text()
    return VRow(spec, plan, devices, plan_json)


def measure(name: str, world: int, steps: int, calibration: dict[str, float], launch: compare.Launch,
            beside: bool = True) -> dict[str, Any]:
    """The model's V row simulated, run on ``world`` spawned ranks for ``steps`` timed steps
    (bound to a CPU each where ``launch`` binds them), and analysed; ``beside``: analysed again
    against the plan priced on the profile its ranks take right after their steps."""
    import graphpipe
    from graphpipe.local_ranks import expect_ok, run_ranks
    from graphpipe.models import build_model

    row = v_row(name, world, calibration)
    if row.reason:
        return {"model": name, "spec": row.spec, "unavailable": row.reason}
    sim = graphpipe.simulate(row.plan, row.devices, "zb_graph", optimizer=compare.RUN_OPTIMIZER)
    sizes = shard_sizes([(row.plan.micro_batch_size, [len(s.devices) for s in row.plan.stages])]) if beside else []
    ranks = expect_ok(run_ranks(_rank, world, row.spec, row.plan_json, steps, sizes, timeout=1800,
                                bind_cpus=launch.binds(world)))
    shape = {"model": name, "spec": row.spec, "world": world, "stages": row.plan.num_stages,
             "micro_batches": row.plan.num_micro_batches}
    out = {**shape, **analyse(row.plan, sim, [r.value for r in ranks])}
    if beside:
        # The same records against the plan priced on the profile the ranks took right after them.
        graph = graphpipe.trace(*build_model(row.spec))
        for node, samples in median_samples([ranks[0].value["profile"]]).items():
            graph.set_profile(node, samples)
        ran = graphpipe.schedule(row.plan, "zb_graph")  # the instructions the ranks ran, as they ran them
        again = graphpipe.retime(graphpipe.Plan.from_json(row.plan_json, graph), graph, row.devices)
        sim_again = graphpipe.simulate(again, row.devices, ran, optimizer=compare.RUN_OPTIMIZER)
        out["beside"] = {**shape, **analyse(again, sim_again, [r.value for r in ranks])}
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def print_model(row: dict[str, Any]) -> None:
    """The model's tables and lines (the module's docstring says what each holds)."""
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
    print(f"\nper rank, ms (measured: mean of the {row['steps_analysed']} recorded steps)\n")
    print("| rank | compute, measured | simulated | idle between instructions, measured | of it in gaps under "
          f"{SHORT_GAP * 1e3:.1f} ms | simulated | before the first instruction, measured | simulated | after "
          "the last, measured | simulated |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in row["ranks"]:
        figures = [r[f"{side}_{name}_seconds"] for name, side in (
            ("compute", "measured"), ("compute", "simulated"), ("idle", "measured"), ("short_gap", "measured"),
            ("idle", "simulated"), ("before_first", "measured"), ("before_first", "simulated"),
            ("after_last", "measured"), ("after_last", "simulated"))]
        print(f"| {r['rank']} | " + " | ".join(_ms(x) for x in figures) + " |")
    waits = row["waits_on_transfers"]["waits"]
    if waits:
        lags = [w["lag_seconds"] for w in waits]
        late = [w["late_seconds"] for w in waits if w["late_seconds"] > 1e-3]
        print(f"\n{len(waits)} waits of a rank for another rank's output to land: from the producer's end to the "
              f"landing, median {statistics.median(lags) * 1e3:.2f} ms (simulated transfers' median "
              f"{row['waits_on_transfers']['simulated_transfer_seconds'] * 1e3:.2f} ms); {len(late)} landed over 1 ms "
              f"later than their edge's simulated transfer allows ({_ms(sum(late) / row['steps_analysed'])} ms a step)")
        for name, group in (("late", [w for w in waits if w["late_seconds"] > 1e-3]),
                            ("on time", [w for w in waits if w["late_seconds"] <= 1e-3])):
            if group:
                busy = sum(w["sender_busy_seconds"] for w in group) / sum(w["lag_seconds"] for w in group)
                print(f"  {name}: the last producer's rank computed through {busy:.0%} of their lag")
    d = row["decomposition"]
    print(f"\nmeasured minus simulated, the recorded steps' mean ({_ms(d['measured_step'])} against "
          f"{_ms(d['simulated_step'])} ms), in parts: the replay's own model against the simulator "
          f"{_ms(d['replay_against_simulator'])}, the instructions' medians against their prices "
          f"{_ms(d['medians_against_prices'])}, their spread around the medians {_ms(d['spread_around_medians'])}, "
          f"waits the replay lacks {_ms(d['waits_the_replay_lacks'])}, set-up and close beyond their price "
          f"{_ms(d['set_up_and_close'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["transformer", "mmt"], choices=sorted(compare.BENCH_SPECS))
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16, help="timed steps (after 3 warm-up steps)")
    parser.add_argument("--out", default="results/sim_gap_bench.json")
    parser.add_argument("--bind-cpus", action=argparse.BooleanOptionalAction, default=True,
                        help="each rank on a core of its own where the ranks are no more than the cores, as "
                             "compare.py runs them (default: on)")
    parser.add_argument("--beside", action=argparse.BooleanOptionalAction, default=True,
                        help="the ranks also profile the model at once right after their steps, and the "
                             "analysis is repeated against the plan priced on that profile (default: on)")
    args = parser.parse_args()
    if args.world < 2:
        parser.error("--world must be at least 2: a V needs two ranks")
    if args.steps < RECORDED_STEPS:
        parser.error(f"--steps must be at least {RECORDED_STEPS}: the analysis reads the last {RECORDED_STEPS} "
                     "timed steps")
    torch.set_num_threads(1)
    launch = compare.Launch.spawned(bind_cpus=args.bind_cpus)
    calibration = compare.calibrate([args.world], launch)[args.world]
    rows = []
    for name in args.models:
        rows.append(measure(name, args.world, args.steps, calibration, launch, args.beside))
        print_model(rows[-1])
        if "beside" in rows[-1]:
            print(f"\n### {name} again, the plan priced on the profile its ranks took right after their steps")
            print_model(rows[-1]["beside"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # The commit beside the figures: the simulator and the runtime they describe are that code.
    out.write_text(json.dumps({"benchmark": "sim_gap", "commit": compare.git_commit(), "world": args.world,
                               "bind_cpus": launch.binds(args.world),
                               "steps": args.steps, "calibration": calibration, "rows": rows}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
