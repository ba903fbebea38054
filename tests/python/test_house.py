"""The runtime's house rules ("a facade, not a hub"): ``Pipeline`` is a facade over collaborators
with one job each, not the hub every module reaches into.

- no import cycle among graphpipe/runtime's modules, counting every import: at the top, inside
  functions, and under ``TYPE_CHECKING``;
- a built ``Pipeline`` holds fewer than 20 instance attributes (related ones are grouped in
  records; values derived from the options are properties);
- ``steps.py`` and ``checkpoint.py`` take the collaborators they use, never the ``Pipeline``:
  they import no ``pipeline`` module, name no ``Pipeline``, and read no private attribute of
  anything but their own objects (``self._x``), so no ``pipe._x`` under any name.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Any

import torch

from graphpipe.testing import expect_ok, run_ranks

RUNTIME = pathlib.Path(__file__).resolve().parents[2] / "graphpipe" / "runtime"
PACKAGE = "graphpipe.runtime"
MAX_ATTRIBUTES = 20


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(RUNTIME.glob("*.py"))}


def _imported(tree: ast.Module, names: set[str]) -> set[str]:
    """The runtime modules ``tree`` imports, anywhere in it (``__init__`` for a name the package
    itself exports). ``from graphpipe.runtime import faults`` imports the submodule ``faults``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE:
                    found.add("__init__")
                elif alias.name.startswith(PACKAGE + "."):
                    found.add(alias.name.split(".")[2])
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x / from .x import y
                base = node.module.split(".")[0] if node.module else None
            elif node.module == PACKAGE:
                base = None
            elif node.module and node.module.startswith(PACKAGE + "."):
                base = node.module.split(".")[2]
            else:
                continue
            if base is not None:
                found.add(base)
            else:
                found |= {a.name if a.name in names else "__init__" for a in node.names}
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> modules it imports), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return [*path[path.index(d):], d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_runtime_has_no_import_cycle() -> None:
    modules = _modules()
    graph = {m: _imported(tree, set(modules)) - {m} for m, tree in modules.items()}
    # The check sees what it must: the facade imports steps, steps the step guard (under no
    # condition) and pipeline imports checkpoint inside its methods.
    assert {"steps", "checkpoint", "connections"} <= graph["pipeline"]
    assert "nonfinite" in graph["steps"]
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    typed = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from graphpipe.runtime.pipeline "
                      "import Pipeline\n")
    assert _imported(typed, set(modules)) == {"pipeline"}
    cycle = _cycle(graph)
    assert cycle is None, f"import cycle in graphpipe/runtime: {' -> '.join(cycle)}"


def _reaches_into_pipeline(tree: ast.Module) -> list[str]:
    """Every place ``tree`` depends on ``Pipeline`` or reads a private attribute of an object
    that is not its own (``x._y`` with ``x`` anything but ``self``, or ``getattr(x, "_y")``)."""
    problems = []
    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                                                    else [])
            if any(n == "pipeline" or n.endswith(".pipeline") or n == "Pipeline" for n in names):
                problems.append(f"{where}: imports the pipeline ({ast.unparse(node)})")
        elif isinstance(node, ast.Name) and node.id == "Pipeline":
            problems.append(f"{where}: names Pipeline")
        elif isinstance(node, ast.arg) and node.arg in ("pipe", "pipeline"):
            problems.append(f"{where}: takes a pipeline ({node.arg})")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                problems.append(f"{where}: reads a private attribute of another object ({ast.unparse(node)})")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).startswith("_")):
            problems.append(f"{where}: reads a private attribute by name ({ast.unparse(node)})")
    return problems


def test_steps_and_checkpoint_take_collaborators_not_the_pipeline() -> None:
    modules = _modules()
    for name in ("steps", "checkpoint"):
        problems = _reaches_into_pipeline(modules[name])
        assert not problems, f"graphpipe/runtime/{name}.py: " + "; ".join(problems)
    # The check finds what it looks for.
    bad = ast.parse("from graphpipe.runtime.pipeline import Pipeline\n"
                    "def run(pipe: Pipeline, link):\n    pipe._conn.pg\n    link._failures\n    getattr(link, '_x')\n")
    assert len(_reaches_into_pipeline(bad)) == 6


def _attributes_worker(rank: int, world: int) -> dict[str, Any]:
    from test_runtime_gold import make_model

    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model("mmt")
    with graphpipe.wrap(model, example, default_loss("mmt"), partitioner="sequential", timeout=60) as pipe:
        optimizer = torch.optim.SGD(list(pipe.parameters()), lr=0.01)
        pipe.step(*batches[0], optimizer=optimizer, record=True)
        pipe.measured_tasks()
        public = {name: getattr(pipe, name) is not None for name in (
            "plan", "schedule", "graph", "module", "rank", "world_size", "step_count", "num_micro_batches", "device",
            "options", "timeout", "skip_nonfinite", "sync_method", "last_timings", "output_ranks", "schedule_kind",
            "loss_fn", "group", "executor")}
        return {"attributes": sorted(vars(pipe)), "public": public, "step_count": pipe.step_count,
                "world_size": pipe.world_size, "check_replicas_every": pipe.check_replicas_every}


def test_a_built_pipeline_holds_few_attributes() -> None:
    results = expect_ok(run_ranks(_attributes_worker, 2, timeout=240, start_method="forkserver"))
    for r in results:
        names = r.value["attributes"]
        assert len(names) < MAX_ATTRIBUTES, f"rank {r.rank}: Pipeline holds {len(names)} attributes: {names}"
        assert all(r.value["public"].values()), r.value["public"]
        assert (r.value["step_count"], r.value["world_size"], r.value["check_replicas_every"]) == (1, 2, None)
