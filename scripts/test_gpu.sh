#!/usr/bin/env bash
# The GPU checks, for a machine with a GPU, nvcc and a CUDA build of torch already installed
# (CI has no GPU; scripts/test.sh only compiles the CUDA path). Builds graphpipe with its CUDA
# runtime path into the current Python environment, then runs CTest and the GPU tests
# (tests/python/test_runtime_cuda.py: pipelines on the GPU over Gloo with host staging and over
# NCCL, against single-process GPU training; the CUDA profile test). Extra arguments go to pytest.
#   GRAPHPIPE_CMAKE_ARGS   extra CMake arguments, e.g. -DCMAKE_PREFIX_PATH=... for METIS/spdlog
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'test_gpu: torch sees no GPU here')" || exit 1
export PATH="/usr/local/cuda/bin:$PATH"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
echo "== building graphpipe with GRAPHPIPE_WITH_CUDA=1 (log in build/pip-install-gpu.log)"
mkdir -p build
if ! GRAPHPIPE_WITH_CUDA=1 python3 -m pip install --no-build-isolation --no-deps -v . >build/pip-install-gpu.log 2>&1; then
  tail -n 60 build/pip-install-gpu.log
  exit 1
fi
(cd tests && python3 -c "import graphpipe._C as c; assert c.runtime_with_cuda; print('== runtime_with_cuda:', c.runtime_with_cuda)") || exit 1
echo "== GoogleTest (ctest)"
ctest --test-dir build/cmake --output-on-failure -j "$(nproc)" --timeout 300
ctest_rc=$?
echo "== pytest (GPU)"
(cd tests && python3 -m pytest python/test_runtime_cuda.py python/test_profile.py -q -p no:cacheprovider -rs "$@")
pytest_rc=$?
[ $ctest_rc -eq 0 ] && [ $pytest_rc -eq 0 ]
