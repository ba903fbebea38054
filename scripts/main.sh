#!/usr/bin/env bash
# The main job: installs (if needed), then traces an example multi-branch model and prints its
# operator-DAG summary. Extra arguments replace the default model spec.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh >/dev/null
cd /tmp && python3 -m graphpipe inspect "${@:-mmt:branches=4}"
