"""Two nodes, emulated: `torchrun --nnodes 2 --nproc-per-node 2` with c10d rendezvous in two Linux
network namespaces joined by a veth pair (two_nodes.py), training CandleUno in float64 over plans
with a stage edge between the nodes (multinode_train.py). Every rank's losses, and the parameters
the ranks hold, equal plain single-process training on the same batches (rtol 1e-10).

Needs root and iproute2; skips, saying why, where namespaces cannot be made. One launch runs every
case; run with ``-s`` (or ``-rP``) to see the rendezvous endpoint, the addresses and which rank
ran on which node. docs/multinode.md describes the emulation and a launch on two real hosts.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import multinode_train as mt
import pytest
import torch
import two_nodes

import graphpipe

SCRIPT = Path(__file__).resolve().with_name("multinode_train.py")
LAUNCH_TIMEOUT = 90.0  # seconds for both nodes' torchrun, rendezvous to exit
RTOL, ATOL = 1e-10, 1e-12  # float64: only the micro-batches' summation order differs


_LAUNCH: dict[str, Any] = {}


def _launch() -> dict[str, Any]:
    """Runs every available case in one launch on two emulated nodes (once per session)."""
    if _LAUNCH:
        return _LAUNCH
    why = two_nodes.unavailable()
    if why:
        _LAUNCH["skip"] = f"two emulated nodes unavailable: {why}"
        print(_LAUNCH["skip"])
        return _LAUNCH
    cases = mt.CASES
    # The ranks import the graphpipe this process imported (the sources or an installed copy).
    home = str(Path(graphpipe.__file__).resolve().parents[1])
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [home, os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="graphpipe-multinode-") as out:
        start = time.monotonic()
        with two_nodes.TwoNodes() as nodes:
            where = nodes.describe()
            results = nodes.run(str(SCRIPT), ["--out", out, *cases], timeout=LAUNCH_TIMEOUT, env=env, cwd=out)
        seconds = time.monotonic() - start
        report = two_nodes.format_results(results)
        ranks = {}
        if all(r.returncode == 0 for r in results):
            for f in sorted(Path(out).glob("rank*.pt")):
                record = torch.load(f, weights_only=False)
                ranks[record["rank"]] = record
    _LAUNCH.update(where=where, results=results, report=report, ranks=ranks, seconds=seconds, cases=cases)
    placement = ", ".join(
        f"rank {r}: node {rec['env']['GRAPHPIPE_EMULATED_NODE']} (group rank {rec['env']['GROUP_RANK']}, "
        f"{rec['env']['GLOO_SOCKET_IFNAME']})" for r, rec in sorted(ranks.items()))
    master = next(iter(ranks.values()))["env"] if ranks else {}
    _LAUNCH["summary"] = (f"two emulated nodes: {where}; workers' MASTER_ADDR:PORT "
                          f"{master.get('MASTER_ADDR')}:{master.get('MASTER_PORT')}; {placement}; "
                          f"cases {cases}; launch {seconds:.1f} s")
    return _LAUNCH


def _reference() -> dict[str, Any]:
    """Single-process float64 training on the batches every rank trains on."""
    from graphpipe.models import default_loss
    from graphpipe.testing import reference_training, seeded_batches

    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model, _, batches = seeded_batches(mt.SPEC, mt.STEPS)
        losses = reference_training(model, batches, default_loss(mt.SPEC), lr=mt.LR)
    finally:
        torch.set_default_dtype(old)
    return {"losses": torch.tensor(losses, dtype=torch.float64),
            "params": {k: v.detach().clone() for k, v in model.named_parameters()}}


@pytest.fixture(scope="module")
def launch() -> dict[str, Any]:
    result = _launch()
    if "skip" in result:
        # The test command runs as root where `ip netns` works; a skip would hide a broken
        # test, so a machine without them fails here with the reason.
        pytest.fail(f"the two-node test needs root and `ip netns`: {result['skip']}")
    return result


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return _reference()


def test_ranks_land_on_two_nodes(launch: dict[str, Any]) -> None:
    """torchrun gives ranks 0-1 to one node and 2-3 to the other, each on its own interface."""
    print(launch["summary"])
    assert all(r.returncode == 0 for r in launch["results"]), "a node failed:\n" + launch["report"]
    ranks = launch["ranks"]
    assert sorted(ranks) == [0, 1, 2, 3], launch["report"]
    node = {r: rec["env"]["GRAPHPIPE_EMULATED_NODE"] for r, rec in ranks.items()}
    assert node[0] == node[1] != node[2] == node[3], f"ranks by node: {node}"
    for r, rec in ranks.items():
        assert rec["env"]["WORLD_SIZE"] == "4"
        assert rec["env"]["GLOO_SOCKET_IFNAME"] == f"gpn{node[r]}"
        # Every worker reaches the store on node 0's veth address, which it advertised.
        assert rec["env"]["MASTER_ADDR"] == f"{two_nodes.SUBNET}.1"


@pytest.mark.parametrize("case", mt.CASES)
def test_training_across_nodes_matches_single_process(case: str, launch: dict[str, Any],
                                                      reference: dict[str, Any]) -> None:
    print(launch["summary"])
    assert all(r.returncode == 0 for r in launch["results"]), "a node failed:\n" + launch["report"]
    ranks = launch["ranks"]
    node = {r: rec["env"]["GRAPHPIPE_EMULATED_NODE"] for r, rec in ranks.items()}
    got = {r: rec["cases"][case] for r, rec in ranks.items()}
    for r, value in got.items():
        assert "error" not in value, f"rank {r}: {value['error']}\n" + launch["report"]

    # The plan really sends tensors between the nodes.
    placement = got[0]["stage_devices"]
    crossing = [(s, d) for s, d in got[0]["stage_edges"]
                if {node[r] for r in placement[s]} != {node[r] for r in placement[d]}]
    print(f"{case}: stages on ranks {placement}, edges {got[0]['stage_edges']}, across nodes {crossing}")
    assert crossing, f"{case}: no stage edge crosses the nodes (stages on ranks {placement}, nodes {node})"

    worst = max(float(((value["losses"] - reference["losses"]).abs() / reference["losses"].abs()).max())
                for value in got.values())
    worst_param = max(float((v - reference["params"][k]).abs().max()) for value in got.values()
                      for k, v in value["params"].items())
    print(f"{case}: largest relative loss difference {worst:.1e}, largest parameter difference {worst_param:.1e}")
    holders: dict[str, list[int]] = {}
    for r, value in sorted(got.items()):
        torch.testing.assert_close(value["losses"], reference["losses"], rtol=RTOL, atol=ATOL,
                                   msg=lambda m, r=r: f"rank {r}'s losses: {m}")
        for k, v in value["params"].items():
            holders.setdefault(k, []).append(r)
            torch.testing.assert_close(v, reference["params"][k], rtol=RTOL, atol=ATOL,
                                       msg=lambda m, k=k, r=r: f"{k} on rank {r}: {m}")
    assert set(holders) == set(reference["params"]), "the ranks together must hold every parameter"
    replicated = {r for devices in placement if len(devices) > 1 for r in devices}
    for k, rs in holders.items():
        # One holder per parameter, or the ranks of one replicated stage (each a full copy).
        assert len(rs) == 1 or set(rs) <= replicated, f"{k} is held by ranks {rs}"
