#!/usr/bin/env bash
# Installs everything graphpipe needs on a fresh Debian machine, then builds and installs it.
#
#   GRAPHPIPE_TORCH   pip requirement for torch (default torch==2.13.0, the CPU build). Set e.g.
#                     GRAPHPIPE_TORCH=torch==2.14.1 for a CUDA build of torch.
#   GRAPHPIPE_SKIP_BUILD=1   install dependencies only.
#
# Why torch 2.13.0 CPU: it ships the C++ headers graphpipe compiles against (torch/csrc, c10,
# torch/csrc/distributed/c10d and torch's bundled pybind11), checked below; some CPU wheels
# ship only include/ATen, and then a CUDA build (which has them all) must be used instead.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(build-essential cmake ninja-build libmetis-dev libspdlog-dev libgtest-dev nlohmann-json3-dev
              clang-format clang-tidy)  # the last two: scripts/lint.sh
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== apt: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

TORCH_REQ="${GRAPHPIPE_TORCH:-torch==2.13.0}"
if ! python3 -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '${TORCH_REQ#torch==}'.split('+')[0] or '${TORCH_REQ}' == 'torch' else 1)" 2>/dev/null; then
  echo "== pip: installing ${TORCH_REQ}"
  python3 -m pip install -q "${TORCH_REQ}"
fi
python3 -m pip install -q "numpy" "xxhash>=3" "pytest>=7" "matplotlib" "networkx" "tqdm" "setuptools>=64" "wheel" "pillow" "scikit-learn" "ruff==0.17.6"

# torchvision (a test dependency: the model corpus of tests/python/test_corpus.py) in the release
# that matches torch (torchvision 0.N+15 goes with torch 2.N). --no-deps, because its wheels
# require the CUDA build of that torch; with a CPU torch its compiled operators do not load, which
# the model classes never need (tests/python/corpus_models.py imports them without them).
TV_REQ=$(python3 -c "import torch; major, minor = torch.__version__.split('+')[0].split('.')[:2]; print(f'torchvision==0.{int(minor) + 15}.*')")
if ! python3 -c "import importlib.metadata as m, sys; v = m.version('torchvision'); sys.exit(0 if v.startswith('${TV_REQ#torchvision==}'.rstrip('*')) else 1)" 2>/dev/null; then
  echo "== pip: installing ${TV_REQ} (no dependencies)"
  python3 -m pip install -q --no-deps "${TV_REQ}"
fi

# install_beside_torch NAME==VERSION: installs that pin unless it is there, with the installed
# torch as a constraint.
install_beside_torch() {
  local name=${1%%==*} version=${1#*==}
  if ! python3 -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('$name') == '$version' else 1)" 2>/dev/null; then
    echo "== pip: installing $1 (torch pinned to the installed one)"
    local constraints
    constraints=$(mktemp)
    python3 -c "import importlib.metadata as m; print('torch==' + m.version('torch'))" >"$constraints"
    python3 -m pip install -q -c "$constraints" "$1"
    rm -f "$constraints"
  fi
}
# transformers (a test dependency: tests/python/test_hf_models.py builds tiny Hugging Face models
# from configs, never downloading weights), pinned. The installed torch is passed as a constraint,
# so pip never replaces it (transformers' own requirement, torch>=2.x, is met by it).
install_beside_torch "transformers==5.24.0"

# torchft (fault-tolerant replicas: graphpipe.fault_tolerant; tests/python/test_fault_tolerance.py
# skips without it), pinned as setup.py's "fault-tolerance" extra pins it, with torch pinned to the
# installed one as above. A fresh machine's CI skipped those tests while this was missing.
install_beside_torch "torchft==0.2.0"

python3 - <<'PY'
import os, sys, torch
inc = os.path.join(os.path.dirname(torch.__file__), "include")
need = ["torch/csrc", "c10", "torch/csrc/distributed/c10d/ProcessGroup.hpp", "pybind11/pybind11.h"]
lacking = [n for n in need if not os.path.exists(os.path.join(inc, n))]
if lacking:
    sys.exit(f"torch {torch.__version__} lacks C++ headers {lacking} under {inc}; "
             "install a torch build that ships them, e.g. GRAPHPIPE_TORCH=torch==2.14.1")
print(f"== torch {torch.__version__}: C++ headers present (C++ ABI {int(torch._C._GLIBCXX_USE_CXX11_ABI)})")
PY

if [ "${GRAPHPIPE_SKIP_BUILD:-0}" != "1" ]; then
  echo "== building and installing graphpipe (CMake; log in build/pip-install.log)"
  mkdir -p build
  if ! GRAPHPIPE_BUILD_TESTS="${GRAPHPIPE_BUILD_TESTS:-1}" python3 -m pip install --no-build-isolation --no-deps -v . >build/pip-install.log 2>&1; then
    tail -n 60 build/pip-install.log
    echo "graphpipe build failed (full log: build/pip-install.log)" >&2
    exit 1
  fi
fi
