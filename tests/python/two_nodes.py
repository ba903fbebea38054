"""Two emulated nodes on one machine: two Linux network namespaces joined by a veth pair, and one
``torchrun --nnodes 2`` per namespace meeting through c10d rendezvous.

    node 0: namespace gpmn-<pid>-<n>-0, interface gpn0, 10.77.0.1/24 (hosts the rendezvous)
    node 1: namespace gpmn-<pid>-<n>-1, interface gpn1, 10.77.0.2/24

Each namespace has its own loopback and sees the other node only over the veth pair, as two hosts
on one link would; the file system is shared (like a cluster's shared home). Needs root and
iproute2's ``ip``; :func:`unavailable` says why not, after trying to make a namespace.

Usable as a library (the multi-node test) and from the command line
(``scripts/two_nodes.sh`` calls it)::

    python tests/python/two_nodes.py [--nproc-per-node 2] [--timeout 120] SCRIPT [ARGS...]

runs ``torchrun --nnodes 2 --nproc-per-node 2 ... SCRIPT ARGS`` in both namespaces and prints both
nodes' output.

Clean-up: the namespaces are deleted on exit (``with TwoNodes() as nodes``, also on an exception,
a timeout, SIGINT or SIGTERM), after every process still inside them is killed by its id. A run
killed with SIGKILL cannot clean up: its torchrun agents get SIGTERM from the kernel
(``PR_SET_PDEATHSIG``) and stop their workers, and the next :class:`TwoNodes` deletes namespaces
that a dead process left behind (their names carry the creator's process id).
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Node", "NodeResult", "TwoNodes", "unavailable"]

PREFIX = "gpmn"
SUBNET = "10.77.0"
RDZV_PORT = 29400  # each namespace has its own ports, so a fixed port never clashes
IP_TIMEOUT = 20.0  # seconds any one `ip` command may take
_counter = itertools.count()
_NAME = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-[01]$")


@dataclass
class Node:
    index: int  # 0 hosts the rendezvous
    netns: str
    ifname: str
    addr: str


@dataclass
class NodeResult:
    node: Node
    command: list[str]
    returncode: int | None  # None: killed at the deadline
    output: str
    env: dict[str, str] = field(default_factory=dict)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT, check=check)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_list() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_inside(netns: str) -> None:
    """SIGKILL, by id, every process inside ``netns`` (all of them ours: we made the namespace)."""
    for _ in range(20):
        out = _ip("netns", "pids", netns, check=False).stdout
        pids = [int(p) for p in out.split()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def _delete(netns: str) -> None:
    """Kills what runs inside ``netns`` and deletes it (its veth end goes with it)."""
    if netns not in _netns_list():
        return
    _kill_inside(netns)
    _ip("netns", "delete", netns, check=False)


def reap_stale() -> list[str]:
    """Deletes this helper's namespaces whose creating process is gone (a run killed with SIGKILL);
    returns their names."""
    reaped = []
    for name in _netns_list():
        m = _NAME.match(name)
        if m and not _alive(int(m.group(1))):
            _delete(name)
            reaped.append(name)
    return reaped


def unavailable() -> str | None:
    """Why two namespaces cannot be made here, found by trying (None: they can)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if shutil.which("ip") is None:
        return "iproute2's `ip` command is not on PATH"
    try:
        with TwoNodes():
            pass
    except Exception as exc:
        hint = "" if os.geteuid() == 0 else f" (not root: euid {os.geteuid()}; namespaces need CAP_SYS_ADMIN)"
        return f"could not make two network namespaces joined by a veth pair: {exc}{hint}"
    return None


def _pdeathsig() -> None:
    """In the child before exec: SIGTERM when the parent dies (kept across exec of `ip` and of
    torchrun, which then stops its workers)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class _Terminated(BaseException):
    """A trapped signal, raised where the main thread was, so that clean-up runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


class TwoNodes:
    """Two namespaces joined by a veth pair, made on ``__enter__``, deleted on ``__exit__``."""

    def __init__(self) -> None:
        tag = f"{PREFIX}-{os.getpid()}-{next(_counter)}"
        self.nodes = [Node(k, f"{tag}-{k}", f"gpn{k}", f"{SUBNET}.{k + 1}") for k in range(2)]
        self._old_handlers: dict[int, Any] = {}

    @property
    def endpoint(self) -> str:
        return f"{self.nodes[0].addr}:{RDZV_PORT}"

    def __enter__(self) -> TwoNodes:
        reap_stale()
        self._trap_signals()
        try:
            self._create()
        except BaseException as exc:
            self.close()
            if isinstance(exc, _Terminated):
                os.kill(os.getpid(), exc.signum)
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close()
        if isinstance(exc, _Terminated):
            # Cleaned up: now end as the signal's sender meant (handlers are restored by close).
            os.kill(os.getpid(), exc.signum)

    def _create(self) -> None:
        a, b = self.nodes
        try:
            for n in self.nodes:
                _ip("netns", "add", n.netns)
            # Both ends are born inside their namespaces: nothing is ever left in the root one.
            _ip("link", "add", a.ifname, "netns", a.netns, "type", "veth", "peer", "name", b.ifname, "netns", b.netns)
            for n in self.nodes:
                _ip("-n", n.netns, "link", "set", "lo", "up")
                _ip("-n", n.netns, "addr", "add", f"{n.addr}/24", "dev", n.ifname)
                _ip("-n", n.netns, "link", "set", n.ifname, "up")
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"`{' '.join(exc.cmd)}` failed: {exc.stderr.strip()}") from None
        # The link may take a moment to come up: wait until node 1 reaches node 0 (a TCP port
        # that nothing listens on answers with a reset once the path works).
        self._wait_link()

    def _wait_link(self, timeout: float = 10.0) -> None:
        probe = ("import socket,sys\n"
                 "s=socket.socket(); s.settimeout(1)\n"
                 "try: s.connect((sys.argv[1], 9))\n"
                 "except ConnectionRefusedError: sys.exit(0)\n"
                 "except OSError: sys.exit(1)\n")
        deadline = time.monotonic() + timeout
        while True:
            r = subprocess.run(["ip", "netns", "exec", self.nodes[1].netns, sys.executable, "-c", probe,
                                self.nodes[0].addr], capture_output=True, timeout=IP_TIMEOUT)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.nodes[1].addr} cannot reach {self.nodes[0].addr} over the veth pair")
            time.sleep(0.2)

    def close(self) -> None:
        """Kills what runs in the namespaces and deletes them; idempotent. A trapped signal that
        arrives meanwhile waits until the namespaces are gone."""
        pending: list[int] = []
        for sig in self._old_handlers:
            signal.signal(sig, lambda signum, frame: pending.append(signum))
        try:
            for n in self.nodes:
                try:
                    _delete(n.netns)
                except Exception:
                    pass
        finally:
            self._restore_signals()
        for sig in pending:
            os.kill(os.getpid(), sig)

    # SIGTERM and SIGHUP unwind through __exit__ (as SIGINT does, as KeyboardInterrupt), which
    # cleans up and then ends the process with the same signal. Only where no handler was set.
    def _trap_signals(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return

        def raise_terminated(signum: int, frame: Any) -> None:
            raise _Terminated(signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                self._old_handlers[sig] = signal.signal(sig, raise_terminated)

    def _restore_signals(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers.clear()

    def env_for(self, node: Node) -> dict[str, str]:
        """What a node's processes need beyond the caller's environment: Gloo (and NCCL's
        bootstrap, and TensorPipe RPC) bind to the node's own interface. Without it Gloo takes
        the address of the host name, which both namespaces share and which names no address
        the other node can reach (here it resolves to 127.0.0.1, each namespace's own loopback),
        and the first collective between the nodes fails."""
        return {
            "GLOO_SOCKET_IFNAME": node.ifname,
            "NCCL_SOCKET_IFNAME": node.ifname,
            "TP_SOCKET_IFNAME": node.ifname,
            "GRAPHPIPE_EMULATED_NODE": str(node.index),
        }

    def torchrun_command(self, node: Node, script: str, args: Sequence[str], nproc_per_node: int = 2,
                         rdzv_id: str | None = None, join_timeout: float = 60.0) -> list[str]:
        """The torchrun command line of one node. ``--local-addr``: the address this node
        advertises; rank 0's becomes the workers' MASTER_ADDR (the default, the host's FQDN, is
        the same on both emulated nodes and does not name node 0's veth address). ``is_host``:
        which node serves the c10d store; torchrun guesses it by comparing the endpoint with
        the host name's addresses, which here match neither node, so nobody would serve it."""
        rdzv_id = rdzv_id or self.nodes[0].netns
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "2", "--nproc-per-node", str(nproc_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", self.endpoint, "--rdzv-id", rdzv_id,
            "--rdzv-conf", f"is_host={'true' if node.index == 0 else 'false'},join_timeout={int(join_timeout)}",
            "--local-addr", node.addr, "--max-restarts", "0",
            script, *args,
        ]

    def run(self, script: str, args: Sequence[str] = (), *, nproc_per_node: int = 2, timeout: float = 120.0,
            env: dict[str, str] | None = None, cwd: str | None = None) -> list[NodeResult]:
        """Runs ``script args`` under one torchrun per node; waits at most ``timeout`` seconds in
        all, then kills what is left. One result per node, with its combined output."""
        procs = []
        with tempfile.TemporaryDirectory(prefix="graphpipe-two-nodes-") as tmp:
            try:
                for n in self.nodes:
                    node_env = self.env_for(n)
                    cmd = self.torchrun_command(n, script, args, nproc_per_node,
                                                join_timeout=max(10.0, timeout / 2))
                    log = open(Path(tmp) / f"node{n.index}.log", "w+")
                    full_env = {**os.environ, **(env or {}), **node_env}
                    p = subprocess.Popen(["ip", "netns", "exec", n.netns, *cmd], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
                                         cwd=cwd, preexec_fn=_pdeathsig)
                    procs.append((n, cmd, node_env, p, log))
                deadline = time.monotonic() + timeout
                codes: list[int | None] = []
                for _, _, _, p, _ in procs:
                    try:
                        codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
                    except subprocess.TimeoutExpired:
                        codes.append(None)
            finally:
                # Whatever happened, nothing started here outlives the call.
                for n, _, _, p, _ in procs:
                    _kill_inside(n.netns)
                    if p.poll() is None:
                        p.kill()
                    p.wait(timeout=10)
            results = []
            for (n, cmd, node_env, _, log), code in zip(procs, codes):
                log.seek(0)
                results.append(NodeResult(n, cmd, code, log.read(), node_env))
                log.close()
            return results

    def describe(self) -> str:
        a, b = self.nodes
        return (f"c10d rendezvous at {self.endpoint}; node 0: netns {a.netns}, {a.ifname} {a.addr}/24; "
                f"node 1: netns {b.netns}, {b.ifname} {b.addr}/24")


def format_results(results: list[NodeResult]) -> str:
    parts = []
    for r in results:
        status = "killed at the deadline" if r.returncode is None else f"exit code {r.returncode}"
        env = " ".join(f"{k}={v}" for k, v in r.env.items())
        parts.append(f"===== node {r.node.index} ({r.node.netns}, {r.node.addr}): {status}\n"
                     f"$ {env} {' '.join(r.command)}\n{r.output}")
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Runs a torchrun script on two emulated nodes (network namespaces).")
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole run (default 120)")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    why = unavailable()
    if why:
        print(f"two_nodes: {why}", file=sys.stderr)
        return 2
    start = time.monotonic()
    with TwoNodes() as nodes:
        print(f"two_nodes: {nodes.describe()}", flush=True)
        results = nodes.run(args.script, args.args, nproc_per_node=args.nproc_per_node, timeout=args.timeout)
    print(format_results(results), flush=True)
    ok = all(r.returncode == 0 for r in results)
    print(f"two_nodes: {'ok' if ok else 'FAILED'} in {time.monotonic() - start:.1f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
