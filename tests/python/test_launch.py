"""graphpipe.init_distributed: the default group from torchrun's variables, one store namespace
per restart attempt (the elastic restart itself runs in test_elastic_restart.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

import graphpipe

_SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist, graphpipe
    rank = graphpipe.init_distributed(timeout=60)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    import os
    raw = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    # The group's own keys (Gloo's addresses) live under this attempt's prefix.
    keys = raw.list_keys()
    prefixed = bool(keys) and all(k.startswith(f"graphpipe/attempt_{attempt}/") for k in keys)
    print(f"rank {rank} sum {t.item():g} prefixed {prefixed}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_missing_environment_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(graphpipe.InputError, match="torchrun"):
        graphpipe.init_distributed()


@pytest.mark.parametrize("attempt", ["0", "3"])
def test_two_ranks_join_under_the_attempts_prefix(attempt: str) -> None:
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), TORCHELASTIC_RESTART_COUNT=attempt)
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        procs.append(subprocess.Popen([sys.executable, "-c", _SCRIPT], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert "rank 0 sum 3 prefixed True" in outputs[0] and "rank 1 sum 3 prefixed True" in outputs[1], outputs
