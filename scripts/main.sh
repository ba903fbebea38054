#!/usr/bin/env bash
# The main job: installs graphpipe if needed, then compares the throughput of graph pipelines
# with sequential pipelines (graphpipe's own and torch.distributed.pipelining's) and with plain
# data parallelism (torch DDP) on the multi-branch models (benchmarks/compare.py; extra arguments
# go to it). Its default: MMT on 4 emulated CPU ranks, devices 4x slower than a core (the
# table's mode column says so; MMT's graph plan is 3 deep against the sequential plan's 4), with
# the zero-bubble schedule and replicated-stage variants beside the pipelines and torch DDP;
# `bash scripts/main.sh --no-emulate` measures real compute on 2 CPU ranks instead.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
bash scripts/install_deps.sh >build/install.log 2>&1 || { tail -n 40 build/install.log; exit 1; }
exec python3 benchmarks/compare.py "$@"
