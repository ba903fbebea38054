#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds, runs GoogleTest (CTest) and pytest.
# Exits non-zero if any test fails. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh || exit 1

echo "== CUDA/NCCL runtime path: compile and link against a CUDA build of torch"
cuda_rc=0
if [ "${GRAPHPIPE_SKIP_CUDA_BUILD:-0}" = "1" ]; then
  echo "skipped (GRAPHPIPE_SKIP_CUDA_BUILD=1)"
elif ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "skipped: no nvcc on this machine"
else
  bash scripts/build_cuda.sh
  cuda_rc=$?
fi

echo "== lint (scripts/lint.sh: ruff, clang-format, clang-tidy, functions over 80 lines)"
bash scripts/lint.sh
lint_rc=$?

echo "== GoogleTest (ctest)"
ctest --test-dir build/cmake --output-on-failure -j2 --timeout 300
ctest_rc=$?

echo "== pytest"
# Run from tests/ so that `import graphpipe` finds the installed package, not the source folder.
(cd tests && python3 -m pytest python -q -p no:cacheprovider --durations=15 "$@")
pytest_rc=$?

if [ $ctest_rc -ne 0 ] || [ $pytest_rc -ne 0 ] || [ $cuda_rc -ne 0 ] || [ $lint_rc -ne 0 ]; then
  echo "FAILED: ctest exit $ctest_rc, pytest exit $pytest_rc, CUDA build exit $cuda_rc, lint exit $lint_rc" >&2
  exit 1
fi
