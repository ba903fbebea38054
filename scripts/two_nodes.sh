#!/usr/bin/env bash
# Runs a torchrun script on two emulated nodes: two network namespaces joined by a veth pair, one
# `torchrun --nnodes 2 --nproc-per-node N` per namespace, meeting through c10d rendezvous at
# 10.77.0.1:29400. Needs root and iproute2; the namespaces are deleted afterwards. See
# docs/multinode.md. graphpipe must be importable (an install, or PYTHONPATH=<repo> after an
# in-place build).
#
#   bash scripts/two_nodes.sh [--nproc-per-node 2] [--timeout 120] SCRIPT [ARGS...]
#   bash scripts/two_nodes.sh examples/train_torchrun.py --model candle_uno --steps 3
set -euo pipefail
exec "${PYTHON:-python}" "$(dirname "$0")/../tests/python/two_nodes.py" "$@"
