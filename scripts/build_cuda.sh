#!/usr/bin/env bash
# Builds graphpipe's CUDA/NCCL runtime path against a CUDA build of torch, in its own virtual
# environment (build/venv-cuda), so the CPU build stays the default. It needs no GPU: it proves
# that csrc/runtime/cuda compiles and links against CUDA torch (with nvcc and the NCCL wheel);
# the tests that run it need a GPU machine.
#
#   GRAPHPIPE_CUDA_TORCH   torch requirement (default torch==2.14.1, a CUDA 13 build)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=build/venv-cuda
TORCH_REQ="${GRAPHPIPE_CUDA_TORCH:-torch==2.14.1}"
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || { echo "build_cuda: nvcc not found" >&2; exit 1; }
export PATH="/usr/local/cuda/bin:$PATH"
# An explicit architecture list spares torch's CMake its GPU-detection test program, which CMake 3.25
# cannot build with nvcc 13 (and which needs a GPU to say anything useful anyway).
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch; assert torch.version.cuda" 2>/dev/null; then
  echo "== build_cuda: installing ${TORCH_REQ} (a CUDA build, several GB) into $VENV"
  "$VENV/bin/python" -m pip install -q "${TORCH_REQ}" numpy
fi
"$VENV/bin/python" -c "import torch; print(f'== build_cuda: torch {torch.__version__}, CUDA {torch.version.cuda}')"
# The machine's CUDA toolkit has the compiler but not every runtime library torch's CMake asks
# for; the CUDA wheels that torch installed beside it have them (nvrtc, NCCL).
CU_LIB="$("$VENV/bin/python" -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))')"
cmake -S . -B build/cmake-cuda -G Ninja -DGRAPHPIPE_WITH_CUDA=ON -DGRAPHPIPE_BUILD_TESTS=OFF \
  -DCUDA_nvrtc_LIBRARY="$CU_LIB/libnvrtc.so.13" -DCUDA_NVRTC_LIB="$CU_LIB/libnvrtc.so.13" \
  -DPython3_EXECUTABLE="$PWD/$VENV/bin/python" \
  -DGRAPHPIPE_CXX11_ABI="$("$VENV/bin/python" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')" \
  >build/cmake-cuda.log 2>&1 || { tail -n 40 build/cmake-cuda.log; exit 1; }
cmake --build build/cmake-cuda -j "${MAX_JOBS:-2}" --target _C >>build/cmake-cuda.log 2>&1 || { tail -n 40 build/cmake-cuda.log; exit 1; }
"$VENV/bin/python" - <<'PY'
import importlib.util, sys
import torch
spec = importlib.util.spec_from_file_location("_C", next(__import__("glob").iglob("build/cmake-cuda/_C*.so")))
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(f"== build_cuda: graphpipe._C built with CUDA runtime path: runtime_with_cuda={module.runtime_with_cuda}")
sys.exit(0 if module.runtime_with_cuda else 1)
PY
