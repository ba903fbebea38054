"""Trains R replicas of a graph pipeline that keep training when a replica's rank dies.

    torchft_lighthouse --min_replicas 1 --bind '[::]:29510' --join_timeout_ms 10000 &
    export TORCHFT_LIGHTHOUSE=http://localhost:29510
    # one torchrun per replica (here 2 replicas of a 2-rank pipeline), each restarting its ranks:
    torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint localhost:29600 --max-restarts 3 \\
        examples/train_fault_tolerant.py --replica 0 --steps 10 &
    torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint localhost:29601 --max-restarts 3 \\
        examples/train_fault_tolerant.py --replica 1 --steps 10

Each replica trains on its own batches (seeded by step and replica); the stages' gradients and
the loss are averaged over the replicas alive in the step (graphpipe.fault_tolerance). Kill a
rank of one replica (``GRAPHPIPE_FAULT=1:3:forward:kill`` on that replica's torchrun, which this
script honours on the first attempt only): its torchrun restarts the replica, the other replica
redoes step 3 alone and goes on, and the restarted one heals from it and rejoins. A replacement
that starts after the others have finished finds nobody to heal from and refuses to train from
scratch; ``--until-full 2`` keeps every replica training past ``--steps`` until two steps in a
row had all of them in (the tests use it: a restart can outlast a short run).

``--record-dir DIR`` writes one JSON line per step and rank (``DIR/replica<r>_rank<s>.jsonl``: the step,
whether it committed, the averaged loss, the participants, the seconds of each phase of the step,
and with ``--digest`` a digest of the rank's parameters, buffers and optimizer state), the plan
(``DIR/replica<r>_plan.json``), and at the end each rank's state (``DIR/replica<r>_rank<s>.pt``) and
the replica's whole model (``DIR/replica<r>_model.pt``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import time
from typing import Any

import torch
import torch.distributed as dist

import graphpipe
from graphpipe.fault_tolerance import fault_tolerant
from graphpipe.models import build_model, default_loss
from graphpipe.runtime import faults


def replica_batch(model: Any, batch: int, step: int, replica: int) -> tuple[Any, Any]:
    """The batch replica ``replica`` trains on at step ``step`` (a redone step reads it again)."""
    generator = torch.Generator().manual_seed(1_000_003 * (replica + 1) + step)
    return model.example_inputs(batch, generator), model.example_targets(batch, generator)


def state_digest(module: torch.nn.Module, optimizer: Any) -> str:
    """A digest of every byte of a rank's parameters, buffers and optimizer state."""
    h = hashlib.sha256()
    tensors = list(module.state_dict().values())
    if optimizer is not None:
        for entry in optimizer.state_dict()["state"].values():
            tensors += [v for _, v in sorted(entry.items()) if torch.is_tensor(v)]
    for t in tensors:
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replica", type=int, required=True, help="this replica's index (0, 1, ...)")
    parser.add_argument("--replicas", type=int, default=2, help="the replicas the job starts with")
    parser.add_argument("--model", default="mmt:branches=2,depth=1", help="graphpipe.models spec")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate")
    parser.add_argument("--timeout", type=float, default=10.0, help="the pipeline's and torchft's timeout (s)")
    parser.add_argument("--float64", action="store_true", help="train in float64 (the tests' tight tolerance)")
    parser.add_argument("--record-dir", help="folder for the per-step JSON lines and the final states")
    parser.add_argument("--digest", action="store_true", help="record a digest of each rank's state after every step")
    parser.add_argument("--nan-at", type=int, default=-1, help="tests: replica 1's batch of this step holds a NaN")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep after each step (paces a demo)")
    parser.add_argument("--until-full", type=int, default=0,
                        help="after --steps, go on until this many committed steps in a row had every one of "
                             "--replicas in (a replacement slower to start than the run is long still joins); "
                             "at most --max-steps")
    parser.add_argument("--max-steps", type=int, default=100, help="the bound on --until-full's steps")
    args = parser.parse_args()

    torch.set_num_threads(1)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt > 0:  # an injected fault fires on the first attempt only: the replacement must live
        os.environ.pop(faults.ENV, None)
    graphpipe.init_distributed("gloo", timeout=120.0)
    if args.float64:
        torch.set_default_dtype(torch.float64)
    # A job's replicas start from one seed; a replacement from another, so that only healing
    # can make it equal to the live replicas again.
    torch.manual_seed(10 * attempt)
    model, inputs = build_model(args.model)
    batch = inputs[0].shape[0]
    ft = fault_tolerant(model, inputs, default_loss(args.model), lambda ps: torch.optim.Adam(ps, lr=args.lr),
                        replica=args.replica, start_replicas=args.replicas, ft_timeout=args.timeout, partitioner="sequential",
                        micro_batches=args.micro_batches, timeout=args.timeout)
    rank = ft.pipe.rank

    def poisoned(data: tuple[Any, Any], step: int) -> tuple[Any, Any]:
        if args.replica == 1 and step == args.nan_at:
            data[0][0][0] = float("nan")  # the first input's first sample
        return data

    log = None
    if args.record_dir:
        os.makedirs(args.record_dir, exist_ok=True)
        if rank == 0 and attempt == 0:  # what the bench simulates the step of
            with open(os.path.join(args.record_dir, f"replica{args.replica}_plan.json"), "w", encoding="utf-8") as f:
                f.write(ft.pipe.plan.to_json(ft.pipe.graph))
        log = open(os.path.join(args.record_dir, f"replica{args.replica}_rank{rank}.jsonl"), "a", encoding="utf-8")
    # Committed steps in a row with every replica in: every replica counts the same ones (they
    # see the same quorums from a replacement's join on), so all stop at the same step.
    full_run = 0
    while ft.current_step < args.steps or (full_run < args.until_full and ft.current_step < args.max_steps):
        began = time.time()
        result = ft.step(lambda step: poisoned(replica_batch(model, batch, step, args.replica), step))
        record: dict[str, Any] = {"attempt": attempt, "step": result.step, "committed": result.committed,
                                  "loss": result.loss, "participants": result.participants,
                                  "healed": result.healed, "skipped": result.skipped,
                                  "digest": state_digest(ft.pipe.module, ft.optimizer) if args.digest else None,
                                  "seconds": dataclasses.asdict(result.seconds), "t0": began, "t": time.time()}
        if log is not None:
            log.write(json.dumps(record) + "\n")
            log.flush()
        if rank == 0:
            print(f"replica {args.replica} attempt {attempt}: {record}", flush=True)
        if result.committed:  # pacing stands for compute; a step that did not land is redone at once
            full_run = full_run + 1 if result.participants == args.replicas else 0
            time.sleep(args.step_seconds)
    if args.record_dir:
        state = {"module": ft.pipe.module.state_dict(),
                 "optimizer": ft.optimizer.state_dict() if ft.optimizer is not None else None}
        torch.save(state, os.path.join(args.record_dir, f"replica{args.replica}_rank{rank}.pt"))
        whole = ft.pipe.full_state_dict()
        if rank == 0:
            torch.save(whole, os.path.join(args.record_dir, f"replica{args.replica}_model.pt"))
    ft.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
