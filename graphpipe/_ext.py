"""Loads the C++ core (graphpipe._C), after torch so that libtorch's symbols are present."""

from __future__ import annotations

import importlib
import os
import sys

import torch  # noqa: F401  (must be imported before the extension)

_dev_dir = os.environ.get("GRAPHPIPE_EXT_DIR")
if _dev_dir:
    # Developer hook: load _C from a CMake build directory instead of the installed package,
    # so several build trees can be tested side by side without reinstalling.
    sys.path.insert(0, _dev_dir)
    _C = importlib.import_module("_C")
    sys.modules["graphpipe._C"] = _C
else:
    try:
        from graphpipe import _C  # type: ignore[attr-defined]
    except ImportError as exc:  # pragma: no cover - only when the build is missing
        raise ImportError(
            "graphpipe's C++ extension graphpipe._C is not built. Install the package with "
            "`pip install --no-build-isolation .` (or `-e .` for development) from the repository "
            f"root. Original error: {exc}"
        ) from exc

__all__ = ["_C"]
