"""Sync methods of replicated stages on a real data set: what each costs and what it trains to.

scikit-learn's digits (1,797 8x8 images, shipped inside the package: no download), scaled to
[0, 1], split 80/20 with a fixed seed. An MLP (64 -> hidden -> hidden -> 10) is cut into two stages, each
on two of four CPU ranks (a 2 x 2 placement: a pipeline whose stages are data parallel), and
trained with SGD (momentum 0.9) on a cosine learning-rate schedule, once per sync method:

- all-reduce every step (exact: equals single-process training);
- QSR (Quadratic Synchronization Rule), H = max(H_base, floor((alpha / lr)^2)) per round;
- local SGD with a constant H equal to QSR's mean H on this schedule, and with H = H_base;
- top-k (with error feedback) and PowerSGD (torch's hook).

Per method: the final train and held-out loss and accuracy (of the replicas' average: local
methods end with replicas that differ until the next round's end), the number of
synchronisations, the bytes each replica handed to collectives (measured by a counting process
group) beside the cost model's, and the wall time.

Then timing against the simulator (``--timing``, default on): each method's iteration with
compute emulated (each stage waits its profiled time, as compare.py and replica_bench.py do,
because four ranks on two cores would time-share them), the communication real; measured per
step (mean over whole rounds, so a local method's averaging is amortised) beside
``graphpipe.simulate(..., sync=...)``'s prediction on devices that carry the runtime's measured
costs (graphpipe.calibration, measured between emulated waits). Last, the simulator alone projects each
method to 64 and 1,024 V100s (8 per node) at the size of the QSR paper's ViT-B (86 M parameters).

    python benchmarks/sync_bench.py [--epochs 10] [--hidden 512] [--no-timing]

Writes results/sync_bench.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import git_commit  # noqa: E402

import graphpipe  # noqa: E402
from graphpipe.runtime import manual_plan  # noqa: E402
from graphpipe.sync import QSR, AllReduce, LocalSGD, PowerSGD, SyncMethod, TopK  # noqa: E402
from graphpipe.testing import run_ranks  # noqa: E402

WORLD = 4
PLACEMENT = {0: [0, 1], 1: [2, 3]}
MICRO_BATCHES = 2
MOMENTUM = 0.9


class DigitsMLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train x, train y, test x, test y): pixels (0-16) scaled to [0, 1]. (Standardising per
    pixel divides by the tiny spread of border pixels that are nearly always 0, which blows up the
    held-out loss on the few images where they are not.)"""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(data.data, data.target, test_size=0.2, random_state=0,
                                                        stratify=data.target)
    x_train, x_test = torch.tensor(x_train, dtype=torch.float32), torch.tensor(x_test, dtype=torch.float32)
    return x_train / 16.0, torch.tensor(y_train), x_test / 16.0, torch.tensor(y_test)


def batches(epochs: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every step's batch: each epoch a fixed-seed permutation, full batches only."""
    x, y, _, _ = digits()
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=g)
        for k in range(len(x) // batch):
            idx = order[k * batch:(k + 1) * batch]
            out.append((x[idx], y[idx]))
    return out


def learning_rates(steps: int, lr: float) -> list[float]:
    """The cosine schedule every run uses (what CosineAnnealingLR gives at each step)."""
    eta_min = lr * 0.01
    return [eta_min + 0.5 * (lr - eta_min) * (1 + math.cos(math.pi * t / steps)) for t in range(steps)]


def make_plan(hidden: int, batch: int, devices: Any = None) -> tuple[Any, Any, str]:
    torch.manual_seed(0)
    model = DigitsMLP(hidden)
    example = (torch.zeros(batch, 64),)
    graph = graphpipe.trace(model, example)
    plan = manual_plan(graph, {"fc1": 0, "fc2": 1, "fc3": 1}, MICRO_BATCHES, stage_devices=PLACEMENT, devices=devices)
    return plan, graph, plan.to_json(graph)


def _train(rank: int, world: int, method: SyncMethod, plan_json: str, hidden: int, epochs: int, batch: int,
           lr: float, emulate: bool, steps_limit: int | None) -> dict[str, Any]:
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DigitsMLP(hidden)
    data = batches(epochs, batch)
    if steps_limit is not None:
        data = data[:steps_limit]
    with graphpipe.wrap(model, (data[0][0],), nn.functional.cross_entropy, plan=plan_json, timeout=120,
                        sync=method) as pipe:
        if emulate:
            from graphpipe.emulation import emulate_stage

            emulate_stage(pipe, scale=1.0)
        optimizer = torch.optim.SGD(list(pipe.parameters()), lr=lr, momentum=MOMENTUM)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=len(batches(epochs, batch)),
                                                               eta_min=lr * 0.01)
        dist.barrier()
        start = time.perf_counter()
        losses = []
        for x, y in data:
            losses.append(float(pipe.step(x, y, optimizer=optimizer)))
            scheduler.step()
        dist.barrier()
        wall = time.perf_counter() - start
        return {"stage": pipe.stage, "params": {k: v.detach().clone() for k, v in pipe.named_parameters()},
                "stats": pipe.sync_stats, "wall": wall, "steps": len(data), "losses": losses}


def evaluate(results: list[Any], hidden: int) -> dict[str, float]:
    """Loss and accuracy on both splits of the replicas' average (each stage's replicas averaged)."""
    x_train, y_train, x_test, y_test = digits()
    sums: dict[str, list[torch.Tensor]] = {}
    for r in results:
        for k, v in r.value["params"].items():
            sums.setdefault(k, []).append(v)
    model = DigitsMLP(hidden)
    model.load_state_dict({k: torch.stack(v).mean(0) for k, v in sums.items()})
    out = {}
    with torch.no_grad():
        for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
            logits = model(x)
            out[f"{split}_loss"] = float(nn.functional.cross_entropy(logits, y))
            out[f"{split}_accuracy"] = float((logits.argmax(1) == y).float().mean())
    return out


def expected_bytes(method: SyncMethod, hidden: int, bucket_bytes: float, steps: int, syncs: int) -> dict[int, float]:
    """The cost model's payload bytes per replica of each stage over the run: per step for the
    gradient methods (PowerSGD: its plain first iterations as all-reduces), per averaging for
    the local ones (their rounds are the measured syncs)."""
    from graphpipe._ext import _C

    model = DigitsMLP(hidden)
    names = {0: ["fc1"], 1: ["fc2", "fc3"]}
    out = {}
    for stage, modules in names.items():
        shapes = [_C.ParamShape(name=f"{m}.{n}", shape=list(p.shape), element_size=p.element_size())
                  for m in modules for n, p in getattr(model, m).named_parameters()]
        per_step = _C.sync_payload_bytes(method.cost_method(), shapes, bucket_bytes, 2,
                                         sync_step=method.local_updates)
        if method.local_updates:
            out[stage] = per_step * syncs
        elif isinstance(method, PowerSGD):
            plain = _C.sync_payload_bytes(AllReduce().cost_method(), shapes, bucket_bytes, 2)
            out[stage] = plain * method.start_iter + per_step * (steps - method.start_iter)
        else:
            out[stage] = per_step * steps
    return out


def timing_plan(hidden: int, batch: int, calibration: dict[str, float], slowdown: float) -> tuple[Any, Any, Any]:
    """The 2 x 2 plan of the profiled MLP on the devices of this machine's ``calibration``
    (compare.calibrate's: the link, the collective link and the runtime's measured costs)
    ``slowdown`` times slower than a core (replica_bench.py does the same), and its JSON."""
    from compare import calibrated_description

    torch.manual_seed(0)
    model = DigitsMLP(hidden)
    example = (torch.randn(batch, 64),)
    graph = graphpipe.trace(model, example)
    graphpipe.profile(graph, model, example, batch_sizes=(8, 16, 32, 64), repeats=5, warmup=2)
    # Throughput measured here; every other figure from the calibration (graphpipe.devices(...,
    # measure=True) would measure the runtime's costs again, without the emulated waits).
    devices = calibrated_description(graphpipe.Devices.cpu_rank(WORLD, measure=True), WORLD, slowdown, calibration)
    plan = manual_plan(graph, {"fc1": 0, "fc2": 1, "fc3": 1}, MICRO_BATCHES, stage_devices=PLACEMENT, devices=devices)
    return plan, devices, plan.to_json(graph)


def _timed(rank: int, world: int, method: SyncMethod, plan_json: str, hidden: int, batch: int, steps: int,
           scale: float) -> list[float]:
    """Emulated compute (``scale`` x the plan's times), real communication: per-step seconds."""
    import torch.distributed as dist

    from graphpipe.emulation import emulate_stage

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DigitsMLP(hidden)
    data = batches(1, batch)
    with graphpipe.wrap(model, (data[0][0],), nn.functional.cross_entropy, plan=plan_json, timeout=120,
                        sync=method) as pipe:
        emulate_stage(pipe, scale=scale)
        optimizer = torch.optim.SGD(list(pipe.parameters()), lr=0.01)
        seconds = []
        # Back to back after one barrier, each step from the previous one's return (compare.py's
        # measure_rank says why).
        dist.barrier()
        last = time.perf_counter()
        for k in range(steps + 1):  # the first step warms up
            x, y = data[k % len(data)]
            pipe.step(x, y, optimizer=optimizer)
            now = time.perf_counter()
            if k:
                seconds.append(now - last)
            last = now
        dist.barrier()  # no rank leaves while another still steps
        return seconds


def timing_rows(methods: list[tuple[str, SyncMethod]], args: Any) -> list[dict[str, Any]]:
    """Each method's step, emulated compute and real communication, beside the simulator's."""
    from compare import Launch, calibrate

    # The compute is emulated by waits: the runtime's costs are measured between such waits.
    calibration = calibrate([WORLD], Launch.spawned(), emulated=True)[WORLD]
    plan, devices, plan_json = timing_plan(args.hidden, args.batch, calibration, args.slowdown)
    rows = []
    for label, method in methods:
        if isinstance(method, QSR):
            continue  # its period changes with the learning rate: timed as local SGD at its mean H
        period = getattr(method, "period", 1)
        steps = max(args.timing_steps // period, 1) * period  # whole rounds: the averaging amortised

        def measure(scale: float, plan_text: str) -> float:
            results = run_ranks(_timed, WORLD, method, plan_text, args.hidden, args.batch, steps, scale, timeout=900)  # noqa: B023 (runs within this iteration)
            bad = [r for r in results if not r.ok]
            if bad:
                raise SystemExit(f"{label}: rank {bad[0].rank}: {bad[0].message}\n{bad[0].traceback}")  # noqa: B023 (runs within this iteration)
            per_step = [max(r.value[k] for r in results) for k in range(steps)]  # noqa: B023 (runs within this iteration)
            return statistics.mean(per_step)

        measured = measure(1.0, plan_json)
        sim = graphpipe.simulate(plan, devices, sync=method)
        rows.append({"method": label, "steps": steps, "measured_seconds": measured,
                     "simulated_seconds": sim.amortized_iteration_seconds,
                     "error": sim.amortized_iteration_seconds / measured - 1.0})
        print(f"  timed {label}: measured {1e3 * measured:.2f} ms, simulated "
              f"{1e3 * sim.amortized_iteration_seconds:.2f} ms", file=sys.stderr)
    return rows


def projection_rows(methods: list[tuple[str, SyncMethod]], gpus: list[int], per_gpu_batch: int) -> list[dict[str, Any]]:
    """The simulator alone: plain data parallelism of a ViT-B-sized transformer (12 layers,
    hidden 768, FFN 3072, 197 tokens: 86 M parameters, the QSR paper's ViT-B) on V100s, 8 per
    node, each method's amortised iteration."""
    spec = "transformer:size=paper,depth=12,hidden=768,heads=12,ffn=3072,seq=197,device=meta"
    rows = []
    for n in gpus:
        from graphpipe.models import build_model

        model, _ = build_model(spec.replace("device=meta", f"batch={per_gpu_batch * n},device=meta"))
        example = model.example_inputs(per_gpu_batch * n)
        graph = graphpipe.trace(model, example)
        devices = graphpipe.devices(n, "v100", per_node=8)
        plan = manual_plan(graph, {"": 0}, 1, stage_devices=[list(range(n))], devices=devices)
        row: dict[str, Any] = {"gpus": n, "parameters": sum(p.numel() for p in model.parameters())}
        for label, method in methods:
            sim = graphpipe.simulate(plan, devices, sync=method)
            row[label] = sim.amortized_iteration_seconds
        rows.append(row)
        print(f"  projected {n} GPUs", file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--base-period", type=int, default=2)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--topk", type=float, default=0.05)
    parser.add_argument("--powersgd-rank", type=int, default=4)
    parser.add_argument("--timing", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--timing-steps", type=int, default=24)
    parser.add_argument("--slowdown", type=float, default=4.0, help="emulated device, this many times slower than a core")
    parser.add_argument("--project", nargs="*", type=int, default=[64, 1024], help="GPU counts to project to")
    parser.add_argument("--out", default="results/sync_bench.json")
    args = parser.parse_args()

    steps = len(batches(args.epochs, args.batch))
    lrs = learning_rates(steps, args.lr)
    qsr = QSR(args.base_period, args.alpha)
    mean_h = qsr.mean_period_of(lrs)
    qsr = QSR(args.base_period, args.alpha, mean_period=mean_h)
    methods: list[tuple[str, SyncMethod]] = [
        ("all-reduce every step", AllReduce()),
        (f"QSR (H_base={args.base_period}, alpha={args.alpha:g})", qsr),
        (f"local SGD H={round(mean_h)} (QSR's mean H)", LocalSGD(max(1, round(mean_h)))),
        (f"local SGD H={args.base_period} (H_base)", LocalSGD(args.base_period)),
        (f"top-k {args.topk:g} + error feedback", TopK(args.topk)),
        (f"PowerSGD rank {args.powersgd_rank}", PowerSGD(rank=args.powersgd_rank)),
    ]
    print(f"digits: {steps} steps ({args.epochs} epochs of batch {args.batch}), cosine lr {args.lr:g} -> "
          f"{args.lr * 0.01:g}; QSR rounds {len(qsr.rounds(lrs))}, mean H {mean_h:.2f}", file=sys.stderr)
    _, _, plan_json = make_plan(args.hidden, args.batch)
    bucket_bytes = float(graphpipe._C.default_bucket_bytes)
    rows = []
    for label, method in methods:
        results = run_ranks(_train, WORLD, method, plan_json, args.hidden, args.epochs, args.batch, args.lr, False,
                            None, timeout=1800)
        bad = [r for r in results if not r.ok]
        if bad:
            raise SystemExit(f"{label}: rank {bad[0].rank}: {bad[0].message}\n{bad[0].traceback}")
        figures = evaluate(results, args.hidden)
        expected = expected_bytes(method, args.hidden, bucket_bytes, steps, results[0].value["stats"]["syncs"])
        rows.append({
            "method": label, "sync": repr(method), **figures,
            "syncs": results[0].value["stats"]["syncs"],
            "bytes_per_rank": {r.rank: r.value["stats"]["bytes"] for r in results},
            "cost_model_bytes_per_stage_replica": expected,
            "wall_seconds": max(r.value["wall"] for r in results),
            "final_step_loss": results[0].value["losses"][-1],
        })
        print(f"  {label}: held-out accuracy {figures['test_accuracy']:.4f}", file=sys.stderr)
    print(f"\n{'method':<40} {'train loss':>10} {'train acc':>9} {'test loss':>9} {'test acc':>8} {'syncs':>6} "
          f"{'MB/rank':>9} {'model MB':>9} {'wall s':>7}")
    for r in rows:
        measured = statistics.mean(r["bytes_per_rank"].values()) / 1e6
        model_mb = statistics.mean(r["cost_model_bytes_per_stage_replica"].values()) / 1e6
        print(f"{r['method']:<40} {r['train_loss']:>10.4f} {r['train_accuracy']:>9.4f} {r['test_loss']:>9.4f} "
              f"{r['test_accuracy']:>8.4f} {r['syncs']:>6} {measured:>9.2f} {model_mb:>9.2f} {r['wall_seconds']:>7.1f}")
    timing = timing_rows(methods, args) if args.timing else []
    if timing:
        print(f"\niteration, {WORLD} ranks, compute emulated ({args.slowdown:g}x slower than a core), communication real; "
              "simulated with the runtime's measured costs in the devices")
        print(f"{'method':<40} {'measured':>10} {'simulated':>10} {'error':>7}")
        for r in timing:
            print(f"{r['method']:<40} {1e3 * r['measured_seconds']:>8.2f}ms {1e3 * r['simulated_seconds']:>8.2f}ms "
                  f"{100 * r['error']:>+6.1f}%")
    projected = [m for m in methods if not isinstance(m[1], QSR)]
    projected += [("QSR at its mean H", qsr)]
    projection = projection_rows(projected, args.project, 32) if args.project else []
    if projection:
        print(f"\nsimulated only: ViT-B size ({projection[0]['parameters'] / 1e6:.0f} M parameters), plain data "
              "parallelism on V100s, 8 per node, 32 images per GPU; amortised iteration (ms)")
        print(f"{'method':<40} " + " ".join(f"{str(r['gpus']) + ' GPUs':>10}" for r in projection))
        for label, _ in projected:
            print(f"{label:<40} " + " ".join(f"{1e3 * r[label]:>10.1f}" for r in projection))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"commit": git_commit(), "world": WORLD, "steps": steps, "epochs": args.epochs,
                               "qsr_mean_period": mean_h, "rows": rows, "timing": timing, "projection": projection},
                              indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
