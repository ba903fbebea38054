#!/usr/bin/env bash
# The main job: installs graphpipe if needed, then compares the throughput of graph pipelines
# with sequential pipelines (graphpipe's own and torch.distributed.pipelining's) on the
# multi-branch models, on CPU ranks (benchmarks/compare.py; extra arguments go to it).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
bash scripts/install_deps.sh >build/install.log 2>&1 || { tail -n 40 build/install.log; exit 1; }
exec python3 benchmarks/compare.py "$@"
