#!/usr/bin/env bash
# The main job: installs graphpipe if needed, then asks whether a graph pipeline trains faster
# than what a PyTorch user would run instead (benchmarks/compare.py; extra arguments go to it).
# Its default: MMT on 4 emulated CPU ranks (devices 4x slower than a core; the table's mode
# column says so), in two regimes: the model fits on every rank (no memory limit: data
# parallelism's case) and memory-bound (a per-rank limit of 90% of the whole model's parameters,
# gradients and optimizer state, so no rank can hold a replica). Variants: graphpipe graph+dp
# and sequential+dp, torch pipelining (its pipeline() front end, or the reason it cannot take
# the model, and the interpreter baseline; torch's zero-bubble family on 2 stages per rank),
# torch FSDP2 and torch DDP ("does not fit" where it needs more than the limit); a verdict line
# per regime and results/compare.png.
# `bash scripts/main.sh --no-emulate` measures real compute on 2 CPU ranks instead.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
bash scripts/install_deps.sh >build/install.log 2>&1 || { tail -n 40 build/install.log; exit 1; }
exec python3 benchmarks/compare.py "$@"
