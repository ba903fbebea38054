"""Trains a multi-branch model with graph pipeline parallelism, launched the usual way.

    torchrun --nproc-per-node 2 examples/train_torchrun.py --model mmt:branches=4 --steps 5

Every rank builds the same model (same seed) and passes the whole batch; graphpipe plans on
rank 0, keeps one stage per rank, and returns the full-batch loss on every rank. On GPUs, put
each rank's model on its device and use the NCCL backend (``--backend nccl``).

Elastic restart: with ``--checkpoint-dir DIR --checkpoint-every N`` the job writes a
torch.distributed.checkpoint every N steps (``pipe.save`` into ``DIR/step_K``, then rank 0
points ``DIR/latest`` at it, atomically) and, when started again, resumes from the latest one.
Under ``torchrun --rdzv-backend c10d --rdzv-endpoint HOST:PORT --max-restarts 3 ...`` a rank
that dies makes torchrun restart every rank, and the job goes on from its last checkpoint.
``--kill-rank R --kill-at-step S`` makes rank R kill itself (SIGKILL) before step S, on the
first attempt only: a failure to restart from, for the tests.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist

import graphpipe
from graphpipe.models import default_loss
from graphpipe.runtime.launch import init_distributed
from graphpipe.testing import seeded_batches

LATEST = "latest"


def latest_checkpoint(folder: str) -> str | None:
    """The checkpoint ``folder/latest`` names, or None before the first one."""
    marker = os.path.join(folder, LATEST)
    if not os.path.exists(marker):
        return None
    with open(marker, encoding="utf-8") as f:
        return os.path.join(folder, f.read().strip())


def mark_latest(folder: str, name: str) -> None:
    """Points ``folder/latest`` at ``name``: written aside, then renamed over the old marker,
    so that a crash leaves either the old marker or the new one, never a partial one."""
    tmp = os.path.join(folder, f".{LATEST}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(name)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(folder, LATEST))
    fd = os.open(folder, os.O_RDONLY)  # the rename itself must survive a crash
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mmt:branches=4", help="graphpipe.models spec")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--partitioner", default="graphpipe", choices=["graphpipe", "metis", "sequential"])
    parser.add_argument("--schedule", default="1f1b", choices=["1f1b", "fill_drain", "1f1b_greedy"])
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (optimizer state to checkpoint)")
    parser.add_argument("--checkpoint", help="save each rank's shard here at the end (a folder of rank<r>.pt)")
    parser.add_argument("--checkpoint-dir", help="DCP checkpoints every --checkpoint-every steps; resume from the latest")
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--final-state", help="rank 0 writes the final full state dict here (torch.save)")
    parser.add_argument("--kill-rank", type=int, default=-1, help="tests: this rank SIGKILLs itself ...")
    parser.add_argument("--kill-at-step", type=int, default=-1, help="... before this step, on the first attempt")
    args = parser.parse_args()
    if args.checkpoint_every and not args.checkpoint_dir:
        parser.error("--checkpoint-every needs --checkpoint-dir")

    torch.set_num_threads(1)
    # Not dist.init_process_group: after a restart, Gloo would read the previous attempt's
    # addresses from torchrun's store (graphpipe/runtime/launch.py).
    rank = init_distributed(args.backend)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model, inputs, batches = seeded_batches(args.model, args.steps)
    pipe = graphpipe.wrap(model, inputs, default_loss(args.model), partitioner=args.partitioner,
                          schedule=args.schedule, micro_batches=args.micro_batches, timeout=120.0)
    if rank == 0 and attempt == 0:
        print(pipe.schedule_table(), flush=True)
    params = list(pipe.parameters())  # a rank the planner left without a stage has none
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=args.momentum) if params else None

    start = 0
    resume_from = latest_checkpoint(args.checkpoint_dir) if args.checkpoint_dir else None
    if resume_from is not None:
        extra = pipe.load(resume_from, optimizer=optimizer)
        start = int(extra["step"])
        if rank == 0:
            print(f"attempt {attempt}: resumed from {resume_from} at step {start} (t={time.time():.3f})", flush=True)

    for step in range(start, args.steps):
        if attempt == 0 and rank == args.kill_rank and step == args.kill_at_step:
            print(f"rank {rank}: killing itself before step {step} (t={time.time():.3f})", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batches[step]
        loss = pipe.step(x, y, optimizer=optimizer)
        if rank == 0:
            print(f"step {step}: loss {float(loss):.6f}", flush=True)
        done = step + 1
        if args.checkpoint_every and done % args.checkpoint_every == 0:
            name = f"step_{done}"
            pipe.save(os.path.join(args.checkpoint_dir, name), optimizer=optimizer, extra={"step": done})
            # pipe.save returns on every rank only after rank 0 put the complete, flushed
            # checkpoint in place (an atomic rename): it may become the one to resume from. A
            # save that fails raises on every rank, so `latest` never names a failed one.
            if rank == 0:
                mark_latest(args.checkpoint_dir, name)

    if args.checkpoint:
        os.makedirs(args.checkpoint, exist_ok=True)
        torch.save(pipe.state_dict(), os.path.join(args.checkpoint, f"rank{rank}.pt"))
    if args.final_state:
        full = pipe.full_state_dict()
        if rank == 0:
            torch.save(full, args.final_state)
    # The pipeline's C++ executor holds the process group: release it before the group is
    # destroyed, not during interpreter shutdown (which once aborted a rank under load).
    pipe.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
