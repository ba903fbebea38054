#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds, runs GoogleTest (CTest) and pytest.
# Exits non-zero if any test fails. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh || exit 1

echo "== GoogleTest (ctest)"
ctest --test-dir build/cmake --output-on-failure -j2 --timeout 300
ctest_rc=$?

echo "== pytest"
# Run from tests/ so that `import graphpipe` finds the installed package, not the source folder.
(cd tests && python3 -m pytest python -q -p no:cacheprovider "$@")
pytest_rc=$?

if [ $ctest_rc -ne 0 ] || [ $pytest_rc -ne 0 ]; then
  echo "FAILED: ctest exit $ctest_rc, pytest exit $pytest_rc" >&2
  exit 1
fi
