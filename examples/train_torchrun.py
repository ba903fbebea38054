"""Trains a multi-branch model with graph pipeline parallelism, launched the usual way.

    torchrun --nproc-per-node 2 examples/train_torchrun.py --model mmt:branches=4 --steps 5

Every rank builds the same model (same seed) and passes the whole batch; graphpipe plans on
rank 0, keeps one stage per rank, and returns the full-batch loss on every rank. On GPUs, put
each rank's model on its device and use the NCCL backend (``--backend nccl``).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import graphpipe
from graphpipe.models import default_loss
from graphpipe.runtime.testing import seeded_batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mmt:branches=4", help="graphpipe.models spec")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--partitioner", default="graphpipe", choices=["graphpipe", "metis", "sequential"])
    parser.add_argument("--schedule", default="1f1b", choices=["1f1b", "fill_drain", "1f1b_greedy"])
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--checkpoint", help="save each rank's shard here at the end (a folder)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    model, inputs, batches = seeded_batches(args.model, args.steps)
    pipe = graphpipe.wrap(model, inputs, default_loss(args.model), partitioner=args.partitioner,
                          schedule=args.schedule, micro_batches=args.micro_batches, timeout=120.0)
    if rank == 0:
        print(pipe.schedule_table(), flush=True)
    optimizer = torch.optim.SGD(list(pipe.parameters()), lr=0.01)
    for step, (x, y) in enumerate(batches):
        loss = pipe.step(x, y, optimizer=optimizer)
        if rank == 0:
            print(f"step {step}: loss {float(loss):.6f}", flush=True)
    if args.checkpoint:
        os.makedirs(args.checkpoint, exist_ok=True)
        torch.save(pipe.state_dict(), os.path.join(args.checkpoint, f"rank{rank}.pt"))
    # The pipeline's C++ executor holds the process group: release it before the group is
    # destroyed, not during interpreter shutdown (which once aborted a rank under load).
    pipe.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
