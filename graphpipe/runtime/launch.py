"""``graphpipe.init_distributed``: the default process group from torchrun's environment, set up so
that ``torchrun --max-restarts N`` can restart it.

Why not ``torch.distributed.init_process_group("gloo")`` alone: under torchrun's c10d rendezvous
the ranks' store is the agent's ``TCPStore``, which lives as long as the agent and so outlives an
attempt. torch's ``env://`` handler connects to it without a namespace (its comment assumes a new
store per retry), so a restarted attempt's Gloo rendezvous can read the addresses the previous
attempt's ranks published under the same keys and try to connect to processes that are gone
("Gloo connectFullMesh failed ... Connection refused"; 4 runs in 5 on torch 2.13). Prefixing the
store with the attempt number (``TORCHELASTIC_RESTART_COUNT``) gives every attempt keys of its own.
Everything else is torch's: the same ``TCPStore`` (agent's or rank 0's), ``PrefixStore`` and
``init_process_group``.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from graphpipe.errors import InputError

__all__ = ["init_distributed"]

_REQUIRED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_distributed(backend: str | None = None, timeout: float = 300.0) -> int:
    """Initialises the default process group from torchrun's environment variables, with a store
    namespace per restart attempt; returns this process's rank.

    Args:
        backend: ``"gloo"``, ``"nccl"`` or ``"cpu:gloo,cuda:nccl"`` (default: NCCL when a GPU is
            present, Gloo otherwise). With NCCL, the process's GPU is its ``LOCAL_RANK``.
        timeout: seconds the store and the group's collectives may wait.

    Raises ``InputError`` naming what is missing when not started by torchrun (or with the same
    variables set by hand), or when a default group already exists.
    """
    missing = [v for v in _REQUIRED if v not in os.environ]
    if missing:
        raise InputError(f"graphpipe.init_distributed: the environment lacks {missing}; start the script with "
                         "torchrun, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT")
    if dist.is_initialized():
        raise InputError("graphpipe.init_distributed: the default process group is already initialised")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "nccl" in backend and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deadline = datetime.timedelta(seconds=timeout)
    # torchrun's agent hosts the store when it says so; otherwise rank 0 does (torch's env://).
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_store and rank == 0, timeout=deadline,
                          multi_tenant=not agent_store)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend, store=dist.PrefixStore(f"graphpipe/attempt_{attempt}/", store),
                            rank=rank, world_size=world, timeout=deadline)
    return rank
