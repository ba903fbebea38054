"""Loads the C++ core (graphpipe._C), after torch so that libtorch's symbols are present."""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys

import torch  # noqa: F401  (must be imported before the extension)


def _missing_extension_message(exc: ImportError, here: str | None = None, search_path: list[str] | None = None) -> str:
    """Why graphpipe._C is missing, and what to run. The usual cause: ``pip install .`` put the
    compiled package in site-packages, and Python, started in the repository root, imported the
    source folder ``graphpipe/`` (the current directory comes first on sys.path), which has no
    compiled extension. ``here`` (this package's folder) and ``search_path`` (sys.path) are
    parameters for the tests."""
    here = os.path.abspath(here or os.path.dirname(os.path.abspath(__file__)))
    installed = ""
    root = os.path.dirname(here)
    others = [p for p in (sys.path if search_path is None else search_path) if os.path.abspath(p or os.curdir) != root]
    spec = importlib.machinery.PathFinder.find_spec("graphpipe", others)
    if spec is not None and spec.submodule_search_locations:
        location = os.path.abspath(list(spec.submodule_search_locations)[0])
        if location != here and any(f.startswith("_C") for f in os.listdir(location)):
            installed = location
    if installed:
        return (
            f"graphpipe was imported from the source folder {here}, which has no compiled extension; the "
            f"installed package (with its extension) is {installed}. The current directory shadows it: "
            "run from another directory, use the `graphpipe` command instead of `python -m graphpipe`, or "
            "install for development with `pip install --no-build-isolation -e .` (which builds the "
            f"extension into the source folder). Original error: {exc}"
        )
    return (
        "graphpipe's C++ extension graphpipe._C is not built. Install the package with "
        "`pip install --no-build-isolation .` (or `-e .` for development) from the repository "
        f"root. Original error: {exc}"
    )


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
        raise ImportError(_missing_extension_message(exc)) from exc
__all__ = ["_C"]
