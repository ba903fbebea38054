"""Builds graphpipe: the CMake project (C++ core, GoogleTest binaries, the module graphpipe._C).

`pip install --no-build-isolation .` (or `-e .`) runs CMake against the torch installed in the
current environment: --no-build-isolation matters, because an isolated build environment would
download another torch (several GB) and build against a torch other than the one you run.

Environment variables:
  GRAPHPIPE_BUILD_DIR    CMake build folder (default build/cmake); CTest runs there.
  GRAPHPIPE_BUILD_TESTS  1 (default) builds the GoogleTest binaries too; 0 skips them.
  GRAPHPIPE_WITH_CUDA    1 builds the CUDA/NCCL runtime path (needs a CUDA build of torch).
  GRAPHPIPE_BUILD_TYPE   CMake build type (default Release).
  GRAPHPIPE_CMAKE_ARGS   extra CMake arguments (shell-quoted), e.g. library paths on a GPU machine.
  MAX_JOBS               parallel compile jobs (default: number of CPUs).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        try:
            import torch
        except ImportError as exc:
            raise RuntimeError(
                "graphpipe compiles against the installed torch, and none is importable here. "
                "Install torch first (bash scripts/install_deps.sh does), then build with "
                "`pip install --no-build-isolation .` (an isolated build environment has no torch)."
            ) from exc

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(os.environ.get("GRAPHPIPE_BUILD_DIR", ROOT / "build" / "cmake")).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        args = [
            f"-DCMAKE_BUILD_TYPE={os.environ.get('GRAPHPIPE_BUILD_TYPE', 'Release')}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DGRAPHPIPE_CXX11_ABI={abi}",
            f"-DGRAPHPIPE_BUILD_TESTS={'ON' if os.environ.get('GRAPHPIPE_BUILD_TESTS', '1') == '1' else 'OFF'}",
            f"-DGRAPHPIPE_WITH_CUDA={'ON' if os.environ.get('GRAPHPIPE_WITH_CUDA', '0') == '1' else 'OFF'}",
        ]
        args += shlex.split(os.environ.get("GRAPHPIPE_CMAKE_ARGS", ""))
        generator = ["-G", "Ninja"] if _has_ninja() else []
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 2))
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build_dir), *generator, *args], check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "-j", jobs], check=True)


def _has_ninja() -> bool:
    try:
        subprocess.run(["ninja", "--version"], check=True, capture_output=True)
        return True
    except (OSError, subprocess.CalledProcessError):
        return False


setup(
    name="graphpipe",
    version="0.1.0",
    description="Graph pipeline parallelism for multi-branch PyTorch models",
    long_description=(ROOT / "README.md").read_text() if (ROOT / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["graphpipe", "graphpipe.*"]),
    ext_modules=[CMakeExtension("graphpipe._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "numpy", "xxhash>=3"],
    extras_require={"viz": ["matplotlib"], "test": ["pytest", "matplotlib"], "fault-tolerance": ["torchft==0.2.0"]},
    entry_points={"console_scripts": ["graphpipe=graphpipe.__main__:main"]},
    zip_safe=False,
)
