#!/usr/bin/env bash
# Lint: ruff over the Python (pyproject.toml's [tool.ruff]), clang-format over all C++
# (.clang-format), clang-tidy (.clang-tidy) over the core layers that do not include torch, from
# the compile database of build/cmake, and scripts/long_functions.py --check (no function over 80
# lines without a reason). Exits non-zero on the first finding. Needs ruff, clang-format and
# clang-tidy (scripts/install_deps.sh installs them) and a build in build/cmake.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== ruff"
ruff check .

echo "== clang-format"
mapfile -t cxx < <(git ls-files 'csrc/*.h' 'csrc/*.cpp' 'csrc/*.cu' 'tests/cpp/*.h' 'tests/cpp/*.cpp')
clang-format --dry-run -Werror "${cxx[@]}"
echo "${#cxx[@]} files formatted"

echo "== clang-tidy"
# The torch-including layers (runtime, bindings) take about 20 s a file to parse; the core layers a
# few seconds, so CI checks those. GRAPHPIPE_TIDY_ALL=1 checks every file.
db=build/cmake/compile_commands.json
ninja -C build/cmake -t compdb > "$db"
if [ "${GRAPHPIPE_TIDY_ALL:-0}" = "1" ]; then
  mapfile -t tidy < <(git ls-files 'csrc/*.cpp')
else
  mapfile -t tidy < <(git ls-files 'csrc/*.cpp' | grep -v -e '^csrc/runtime/' -e '^csrc/bindings/')
fi
log=$(mktemp)
if ! printf '%s\n' "${tidy[@]}" | xargs -P 2 -n 4 clang-tidy -p build/cmake --quiet --warnings-as-errors='*' >"$log" 2>&1; then
  grep -v -e 'warnings generated' -e 'Suppressed ' -e 'Use -header-filter' -e 'Use -system-headers' "$log"
  echo "clang-tidy found the problems above" >&2
  exit 1
fi
echo "${#tidy[@]} files tidy"

echo "== functions over 80 lines"
# Each one kept carries a '// long-function: <reason>' (or '# long-function:') comment.
python3 scripts/long_functions.py --check
